"""Small shared basics of every step, the host's plumbing: errors, units, YAML files, packaged resources,
commands on a host (and the bash loops run there), signals, process ownership stamps, the owner-named cache work
folders and the lock folder, confidence intervals, the machine a run ran on. The scenario of a run is a room of its
own (:mod:`bbrlab.scenario`).

Owns: ``errors``, ``units``, ``yamlfile``, ``resources``, ``hosts``, ``hostloop``, ``signals``, ``confidence``,
``owners``, ``cachefiles``, ``lockdir``, ``giventhreads`` (the hand-given vCPU thread ids of a testbed file) and more.

May import: the standard library and third-party packages only; never another bbrlab room.
"""
