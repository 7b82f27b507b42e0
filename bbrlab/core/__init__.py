"""Small shared basics of every step: errors, units, YAML files, packaged resources, commands on a
host (and the bash loops run there), signals, the typed scenario of one run, process ownership stamps
and the owner-named cache work folders.

Owns: ``errors``, ``units``, ``yamlfile``, ``resources``, ``hosts``, ``hostloop``, ``signals``, ``scenario``, ``confidence``,
``owners``, ``cachefiles``, ``giventhreads`` (the hand-given vCPU thread ids of a testbed file).
May import: the standard library and third-party packages only; never another bbrlab room.
"""
