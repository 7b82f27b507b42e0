"""The checks before a campaign changes anything on a testbed, shared by the driver and the testbed workers:
the spec against one testbed (its sender kernels, the module parameters and sysctls it sets, every timeslice x
share against the live deadline limits of its host), and the calibration that belongs to each testbed.

May import: ``bbrlab.core``, ``bbrlab.testbed``, ``bbrlab.contention``, ``bbrlab.run`` (the calibration file),
and ``.loop`` (the admission check). Never the executors (``distributed``, ``scaleout``, ``worker``).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace
from pathlib import Path

from bbrlab import testbed as testbed_mod
from bbrlab.contention import cgroups
from bbrlab.contention.limits import read_kernel_limits
from bbrlab.core.errors import TestbedError, ValidationError
from bbrlab.run import senderknobs
from bbrlab.run.ceiling import FILE_NAME, CalibrationMismatch, load, source_for
from bbrlab.scenario.cpumodels import MODELS, param_names
from bbrlab.scenario.knobs import SENDER_SYSCTLS

from .spec_models import check_admission


@dataclass(frozen=True)
class TestbedCheck:
    """One testbed as checked for a campaign: its name, kind, the host that checked it (a worker's),
    ``describe`` (:meth:`bbrlab.testbed.Testbed.describe`, what a calibration must match) and its CPU
    partition (None: not isolated)."""

    __test__ = False  # not a pytest test class

    name: str
    kind: str
    host: str
    describe: dict
    cpus: tuple[int, ...] | None = None


def check_testbed(spec, tb, cpus: list[int] | None = None) -> TestbedCheck:
    """What the single-testbed path checks before a campaign, for testbed ``tb``: every sender kernel of the
    spec (downloads, never boots), its vCPU counts (a local testbed's alone), and every timeslice x share against
    the live limits of the host that runs its sender's vCPUs (for the most vCPUs the spec gives), with the
    capacity of ``cpus`` when the testbed gets a partition. Raises :class:`ValidationError` naming the spec's
    field and the testbed; changes nothing."""

    testbed_mod.check_campaign_kernels(tb, spec.kernels, spec.ccas)
    check_knobs(spec, tb)
    if getattr(spec, "blocks", 1) > 1 and tb.kind != "local":
        raise ValidationError("blocks", spec.blocks, "1 for a lab testbed (each block boots the sender afresh, which "
                              "bbrlab does on a local testbed only)", f"testbed {tb.name}")
    vcpu_counts = tuple(getattr(spec, "sender_vcpus", ()))
    if vcpu_counts and tb.kind != "local":
        raise ValidationError("sender_vcpus", list(vcpu_counts), "absent for a lab testbed (its sender VM's vCPUs are "
                              "the lab's own); the local testbed boots the sender with each count", f"testbed {tb.name}")
    limits = read_kernel_limits(tb.sender.hypervisor)
    if cpus:
        limits = replace(limits, online_cpus=len(cpus))  # a partition is its own root domain
    where = f"testbed {tb.name}" + (f" in its partition of {len(cpus)} CPU(s)" if cpus else "")
    try:
        check_admission(spec, limits, max(vcpu_counts) if vcpu_counts else len(tb.sender.vcpu_threads()))
        check_models(spec, tb.sender.hypervisor)
    except ValidationError as e:
        raise ValidationError(e.field, e.value, e.allowed, where) from None
    return TestbedCheck(tb.name, tb.kind, socket.gethostname(), tb.describe(), tuple(cpus) if cpus else None)


def check_knobs(spec, tb) -> None:
    """The spec's module parameters and sysctls (``cca_params``, ``sender_sysctls``) against the sender as it
    runs now: a parameter its CCA's module lacks, or a sysctl its kernel lacks, is refused before the campaign
    starts (one command, which changes nothing). A spec with ``kernels`` is left to its runs, which check the
    kernel they boot before they write anything (bbrlab.run.senderknobs)."""
    if spec.kernels or not (getattr(spec, "cca_params", ()) or getattr(spec, "sender_sysctls", ())):
        return
    wanted = {f"cca_params.{name}": senderknobs.param_path(*name.split(".", 1)) for name, _ in spec.cca_params}
    wanted |= {f"sender_sysctls.{name}": SENDER_SYSCTLS[name].path for name, _ in spec.sender_sysctls}
    absent = set(senderknobs.missing(tb.sender.host, list(wanted.values())))
    for field, path in wanted.items():
        if path in absent:
            raise ValidationError(field, path, f"a file the sender has: {path} is missing there (a parameter the "
                                  "module lacks, or a module not loaded)", f"testbed {tb.name}")


def check_models(spec, hypervisor) -> None:
    """The spec's contention models against the host that runs the sender's vCPUs: the models other than
    deadline and none act on this machine only (cgroups, busy loops), the cgroup models need the cpu controller,
    cfs-burst its burst file. Raises :class:`ValidationError` naming ``contention_models``; changes nothing."""
    others = [m for m in spec.contention_models if MODELS[m].local_only]
    if not others:
        return
    if not hypervisor.is_local:
        raise ValidationError("contention_models", others, "deadline or none for a sender whose vCPUs run on "
                              f"another host ({hypervisor.name}): the other models act on this machine only, for now")
    if not any(MODELS[m].uses_cgroup for m in others):
        return
    try:
        hierarchy = cgroups.detect()
    except TestbedError as e:
        raise ValidationError("contention_models", others, f"models this machine can apply: {e}") from None
    if any("burst_ms" in param_names(MODELS[m]) for m in others) and hierarchy.version == 1 and not hierarchy.burst_file(hierarchy.root).exists():
        raise ValidationError("contention_models", others, "models without cfs-burst on this machine: its kernel "
                              "has no cpu.cfs_burst_us (CFS burst came with Linux 5.14)")


def calibrations_for(checks: list[TestbedCheck], out_dir: str | Path, scenarios, paths: list[Path] | None
                     ) -> dict[str, tuple]:
    """The calibration of each testbed: ``{name: (Calibration, source)}``, or ``{}`` for none.

    ``paths`` (``--calibration``, each a file or a directory holding ``calibration.json``) are matched to the
    testbeds they were made on; without them ``DIR/calibration.json`` is used when it exists. Either every
    testbed has one or none has (a campaign half with CPU ceilings and half without could not be read as
    one). Refused, naming ``--calibration``: a calibration of none of these testbeds, two for one, one
    that no longer matches its testbed, was made with another vCPU count than the plan's runs ask or lacks a
    point of the plan, and any calibration for a testbed in
    a CPU partition (calibrated with the whole machine, its ceilings do not hold on fewer CPUs).
    """

    given = list(paths or [])
    if not given and (Path(out_dir) / FILE_NAME).is_file():
        given = [Path(out_dir) / FILE_NAME]
    if not given:
        return {}
    by_name = {c.name: c for c in checks}
    out: dict[str, tuple] = {}
    for path in given:
        cal = load(path)
        name = cal.testbed.get("name")
        check = by_name.get(name)
        if check is None:
            raise ValidationError("--calibration", str(path), f"a calibration of one of this campaign's testbeds "
                                  f"({', '.join(sorted(by_name))}); it was made on {name!r}")
        if name in out:
            raise ValidationError("--calibration", str(path), f"one calibration per testbed; {name!r} already has "
                                  f"{out[name][0].path}")
        if check.cpus:
            raise ValidationError("--calibration", str(path), f"none for testbed {name!r}: in this campaign it runs in "
                                  f"a partition of {len(check.cpus)} CPU(s), and a calibration measured it with the "
                                  "whole machine; run without (move DIR/calibration.json aside) or one testbed at a "
                                  "time")
        try:
            cal.check_testbed(check.describe)
        except CalibrationMismatch as e:
            raise ValidationError("--calibration", str(path), f"a calibration of the testbed as it is now: {e}") from None
        made_with = cal.testbed.get("sender_vcpus")
        other_counts = sorted({s.sender_vcpus for s in scenarios} - {None, made_with})
        if other_counts:
            raise ValidationError("--calibration", str(path), f"a calibration made with the vCPU counts the spec "
                                  f"gives: it was made with {made_with} sender vCPU(s), the spec also asks "
                                  f"{other_counts} (a ceiling holds for one count: run each count's campaign apart "
                                  "with its own calibration, or run without)")
        missing = cal.missing(scenarios)
        if missing:
            raise ValidationError("--calibration", str(path), f"a ceiling for every point of the plan; it has none "
                                  f"for {', '.join(missing)} (bbrlab calibrate SPEC --out DIR --testbed {name})")
        out[name] = (cal, source_for(cal, out_dir))
    lacking = sorted(set(by_name) - set(out))
    if lacking:
        raise ValidationError("--calibration", [str(p) for p in given], f"one calibration per testbed, or none; "
                              f"{', '.join(lacking)} has none (bbrlab calibrate SPEC --out DIR --testbed NAME for each, "
                              "then one --calibration DIR per testbed)")
    return out
