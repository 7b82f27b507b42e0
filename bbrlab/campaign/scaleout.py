"""A campaign over several testbeds, as ``bbrlab campaign run`` starts it (docs/scaling.md).

Two ways, one engine (:mod:`bbrlab.campaign.distributed`):

- **Several testbeds named here** (``--testbed A --testbed B``, local names or testbed files):
  :func:`run_local` starts a Dask cluster on this machine with one single-threaded worker per testbed.
  Several *local* testbeds each get an exclusive CPU partition (:mod:`bbrlab.testbed.isolation`), and more
  of them than the machine can isolate are refused.
- **An existing cluster** (``--scheduler tls://HOST:PORT``): :func:`run_on_scheduler` uses the workers
  that carry a testbed (``bbrlab worker``, :func:`serve_worker`, one per testbed on the lab's machines).
  It speaks mutual TLS with the lab's CA (:func:`bbrlab.campaign.tls.lab_security`); ``tcp://`` only with an
  explicit ``--insecure``, which every record of the campaign notes (``metadata.worker.transport``).

Everything that can be checked is checked before anything changes, for each testbed as the single-testbed
path does it (:func:`check_testbed`: its sender kernels, and every timeslice x share against the live
deadline limits of the host that runs its sender, counted over its partition when it has one), and each
error names the option (``--testbed``, ``--scheduler``, ``--calibration``). A calibration belongs to one
testbed: there is one per testbed or none at all (:func:`calibrations_for`).
"""

from __future__ import annotations

import contextlib
import re
import socket
import sys
from pathlib import Path

from bbrlab import testbed as testbed_mod
from bbrlab.core.errors import BbrlabError, TestbedError, ValidationError
from bbrlab.core.signals import interruptible
from bbrlab.testbed import isolation
from bbrlab.testbed.holder import busy_elsewhere, describe_holder
from bbrlab.testbed.target import is_testbed_file, local_name

from . import distributed as d
from .distributed import TestbedNanny
from .options import DEFAULT_OPTIONS, CampaignOptions
from .preflight import TestbedCheck, calibrations_for, check_testbed
from .sameness import check_same_testbed
from .tls import TRANSPORT_TLS, LabTls, lab_security
from .worker import RESOURCE, TestbedPlugin, check_on_worker

#: ``tls://HOST:PORT`` or ``tcp://HOST:PORT`` (an IPv6 host in brackets); a bare ``HOST:PORT`` means tls.
SCHEDULER_RE = re.compile(r"(?P<scheme>tcp|tls)://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(?P<port>\d{1,5})")
SCHEDULER_ALLOWED = ("tls://HOST:PORT of a running Dask scheduler, e.g. tls://10.0.0.5:8786 (tcp://HOST:PORT only "
                     "with --insecure)")
#: Seconds to connect to a scheduler, and to wait for its first testbed worker.
CONNECT_TIMEOUT_S = 15.0
WORKER_WAIT_S = 60.0
#: Seconds to wait for the workers of a local cluster (each loads its testbed and clears it first).
LOCAL_START_S = 300.0


def _say(message: str) -> None:
    with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
        print(message, file=sys.stderr, flush=True)


# -- checking what was asked ----------------------------------------------------------------------------

def scheduler_address(text: str) -> str:
    """``--scheduler`` checked and normalised (``HOST:PORT`` becomes ``tls://HOST:PORT``)."""
    value = str(text).strip()
    if "://" not in value:
        value = f"tls://{value}"
    m = SCHEDULER_RE.fullmatch(value)
    if not m or not 1 <= int(m["port"]) <= 65535:
        raise ValidationError("--scheduler", text, SCHEDULER_ALLOWED)
    return value


def check_scheduler(address: str, timeout_s: float = CONNECT_TIMEOUT_S, security=None, role: str = "client") -> dict:
    """Ask the scheduler at ``address`` who it is (over TLS with ``security``, as ``role``); a clear error
    naming ``--scheduler`` when nothing (or not a Dask scheduler) answers, or the TLS handshake fails."""
    import asyncio

    from distributed.core import rpc

    args = security.get_connection_args(role) if security is not None else {}

    async def identity() -> dict:
        async with rpc(address, timeout=timeout_s, connection_args=args) as scheduler:
            return await asyncio.wait_for(scheduler.identity(), timeout_s)

    m = SCHEDULER_RE.fullmatch(address)
    try:  # a refused connection at once, rather than after Dask's retries for timeout_s
        socket.create_connection((m["host"].strip("[]"), int(m["port"])), timeout=timeout_s).close()
    except OSError as e:
        raise ValidationError("--scheduler", address, f"{SCHEDULER_ALLOWED}; nothing answered there: "
                              f"{e.strerror or e}") from None
    try:
        info = asyncio.run(identity())
    except Exception as e:  # noqa: BLE001 - a timeout, a refused or failed TLS handshake: said plainly
        how = "over TLS with this certificate" if address.startswith("tls://") else "over plain tcp"
        raise ValidationError("--scheduler", address, f"{SCHEDULER_ALLOWED}; no Dask scheduler answered there {how}: "
                              f"{type(e).__name__}: {e}") from None
    if not isinstance(info, dict) or info.get("type") != "Scheduler":
        raise ValidationError("--scheduler", address, f"{SCHEDULER_ALLOWED}; what answered is a "
                              f"{(info or {}).get('type', 'something else')}, not a scheduler")
    return info


def distinct_refs(refs: list[str]) -> list[str]:
    """``--testbed`` values, each given once (a testbed file also under another spelling of its path)."""

    seen: dict[str, str] = {}
    for ref in refs:
        text = str(ref).strip()
        if not text:
            raise ValidationError("--testbed", ref, "a local testbed's name or a testbed file, not empty")
        key = str(Path(text).expanduser().resolve()) if is_testbed_file(text) else text
        if key in seen:
            raise ValidationError("--testbed", ref, f"each testbed once (it is also given as {seen[key]!r}): a "
                                  "testbed runs one run at a time, so naming it twice would not run more")
        seen[key] = text
    return [str(r).strip() for r in refs]


def load_testbeds(refs: list[str]) -> dict:
    """Each ``--testbed`` loaded (nothing on it changes): ``{ref: Testbed}``. Refused: a testbed that is not
    up or whose file is wrong, two testbeds with one name (records would not tell them apart), a local
    testbed another process is using."""

    loaded: dict = {}
    try:
        for ref in distinct_refs(refs):
            try:
                loaded[ref] = testbed_mod.load(ref)
            except BbrlabError as e:
                raise ValidationError("--testbed", ref, "a local testbed that is up (bbrlab testbed up --name NAME) "
                                      f"or a lab's testbed file; {e}") from None
            names = [tb.name for tb in loaded.values()]
            if names.count(loaded[ref].name) > 1:
                raise ValidationError("--testbed", ref, f"testbeds with distinct names: another one is also called "
                                      f"{loaded[ref].name!r}, and records name the testbed that ran them")
            busy = busy_elsewhere(loaded[ref].name) if local_name(ref) else None
            if busy is not None:
                raise ValidationError("--testbed", ref, f"a testbed nobody else is using; it is in use by "
                                      f"{describe_holder(busy)}")
    except BaseException:
        for tb in loaded.values():
            tb.close()
        raise
    return loaded


def partitions_for(testbeds: dict) -> dict[str, list[int]]:
    """CPUs for each local testbed's partition when there are several (:func:`bbrlab.testbed.isolation.plan`);
    ``{}`` for one local testbed or none. Refused, naming ``--testbed``, when the machine cannot isolate them."""

    local = [tb.name for tb in testbeds.values() if tb.kind == "local"]
    if len(local) < 2:
        return {}
    try:
        return isolation.plan(local)
    except TestbedError as e:
        raise ValidationError("--testbed", local, f"local testbeds that can be kept apart: {e}. Their "
                              "SCHED_DEADLINE vCPUs must not compete, and a deadline task's CPUs must span its "
                              "whole root domain, so each needs an exclusive cpuset of its own") from None


def _say_plan(spec, checks: list[TestbedCheck], calibrations: dict, where: str) -> None:
    def one(c: TestbedCheck) -> str:
        cpus = f", CPU {','.join(map(str, c.cpus))}" if c.cpus else ""
        return f"{c.name} ({c.kind} on {c.host}{cpus})"

    _say(f"campaign {spec.name}: {spec.runs} runs over {len(checks)} testbeds {where}: "
         f"{', '.join(one(c) for c in checks)}; each runs one run at a time")
    if calibrations:
        _say("ceilings from " + ", ".join(f"{name}: {cal.path}" for name, (cal, _) in sorted(calibrations.items())))
    else:
        _say("no calibration: the records carry no CPU ceiling (one per testbed: bbrlab calibrate SPEC --out DIR "
             "--testbed NAME, then --calibration DIR for each)")


# -- running --------------------------------------------------------------------------------------------

def run_local(spec, out_dir: str | Path, refs: list[str], *, options: CampaignOptions = DEFAULT_OPTIONS,
              calibration_paths: list[Path] | None = None, dashboard: bool = False) -> dict:
    """Run (or resume) ``spec`` over the testbeds ``refs`` (two or more) on a Dask cluster started here.

    Checks everything first (:func:`load_testbeds`, :func:`partitions_for`, :func:`check_testbed` for each,
    :func:`calibrations_for`); then one worker per testbed takes it over for the campaign and restores it
    at the end, also on Ctrl-C (:mod:`bbrlab.campaign.worker`). Returns :func:`bbrlab.campaign.directory.status`.
    """
    from distributed import Client

    testbeds = load_testbeds(refs)
    try:
        cpus = partitions_for(testbeds)
        checks = [check_testbed(spec, tb, cpus.get(tb.name)) for tb in testbeds.values()]
        calibrations = calibrations_for(checks, out_dir, spec.plan(), calibration_paths)
        check_same_testbed(out_dir, [c.describe for c in checks], allow_mixed=options.allow_mixed,
                           kernel_dimension=bool(spec.kernels), vcpus_dimension=bool(spec.sender_vcpus))  # refused before any worker starts
    finally:
        for tb in testbeds.values():
            tb.close()
    _say_plan(spec, checks, calibrations, "on this machine")
    if cpus:
        for part in isolation.remove_leftovers(list(cpus)):
            _say(f"removed the CPU partition {part.path} a killed campaign left")
    with interruptible():  # Ctrl-C while the workers start: their plugins undo what they began
        try:  # each worker takes its testbed over as it starts; one that fails has the others closed again
            cluster = d.local_cluster(list(testbeds), dashboard=dashboard, isolate=bool(cpus), cpus=cpus)
        except BbrlabError:
            raise
        except Exception as e:  # noqa: BLE001 - Dask's wrapping of a worker's start failure, said plainly
            raise BbrlabError(f"the testbed workers could not start: {type(e).__name__}: {e}") from e
        with cluster, Client(cluster) as client:
            if dashboard:
                _say(f"Dask dashboard: {client.dashboard_link}")
            d.wait_for_workers(client, len(testbeds), timeout_s=LOCAL_START_S)
            return d.run_campaign_distributed(spec, out_dir, client, options=options, calibrations=calibrations,
                                              testbeds=[c.describe for c in checks])


def worker_checks(client, spec) -> list[TestbedCheck]:
    """:func:`check_testbed` run by each testbed worker of ``client`` on its own testbed; the first refusal is
    raised naming the worker. Refused too: two workers with testbeds of one name."""

    addresses = list(d.testbed_workers(client))
    results = client.run(check_on_worker, spec.to_dict(), workers=addresses, on_error="return")
    checks: list[TestbedCheck] = []
    for address, result in sorted(results.items()):
        if result is None:  # the resource without bbrlab's plugin: no testbed there
            d.withdraw_resource(client, address)
            continue
        if isinstance(result, ValidationError):
            raise ValidationError(result.field, result.value, result.allowed,
                                  f"{result.hint + ', ' if result.hint else ''}checked by the worker at {address}")
        if isinstance(result, BaseException):
            raise BbrlabError(f"the worker at {address} cannot run this campaign: {result}")
        if any(c.name == result.name for c in checks):
            raise ValidationError("--scheduler", sorted(results), f"workers whose testbeds have distinct names; two "
                                  f"own a testbed called {result.name!r} (give each its own name: bbrlab testbed up "
                                  "--name NAME, or the testbed file's name)")
        checks.append(result)
    return checks


def run_on_scheduler(spec, out_dir: str | Path, scheduler: str, *, options: CampaignOptions = DEFAULT_OPTIONS,
                     calibration_paths: list[Path] | None = None, tls: LabTls | None = None) -> dict:
    """Run (or resume) ``spec`` on the testbed workers of the Dask scheduler at ``scheduler``.

    The transport is mutual TLS with ``tls``'s files (or Dask's ``distributed.comm.tls.*`` config); a
    ``tcp://`` scheduler only with ``tls.insecure`` (:func:`bbrlab.campaign.tls.lab_security`), and then the
    records say so. Each worker present at the start checks the campaign against its testbed first
    (:func:`worker_checks`); workers that join later take runs too, unchecked (a run its testbed cannot do
    fails and is recorded). The workers stay up afterwards, their testbeds restored and the link off
    (unless ``options.keep_link``).
    """
    from distributed import Client

    address = scheduler_address(scheduler)
    security, transport = lab_security(address, tls or LabTls(), role="client")
    if transport != TRANSPORT_TLS:
        _say(f"bbrlab: warning: {address} is {transport}; anyone who reaches it can run code on its workers")
    check_scheduler(address, security=security)
    if spec.testbed:
        _say(f"the spec's testbed ({spec.testbed}) is not used: the cluster's workers bring their testbeds")
    d.quiet_logs()
    try:
        client = Client(address, timeout=CONNECT_TIMEOUT_S, security=security)
    except (OSError, TimeoutError) as e:
        raise ValidationError("--scheduler", address, f"{SCHEDULER_ALLOWED}; connecting failed: {e}") from None
    with client:
        try:
            d.wait_for_workers(client, 1, timeout_s=WORKER_WAIT_S)
        except BbrlabError:
            raise ValidationError("--scheduler", address, "a scheduler with at least one testbed worker (start one "
                                  f"per testbed: bbrlab worker --testbed NAME|FILE --scheduler {address}); none "
                                  f"joined within {WORKER_WAIT_S:.0f} s") from None
        checks = worker_checks(client, spec)
        calibrations = calibrations_for(checks, out_dir, spec.plan(), calibration_paths)
        check_same_testbed(out_dir, [c.describe for c in checks], allow_mixed=options.allow_mixed,
                           kernel_dimension=bool(spec.kernels), vcpus_dimension=bool(spec.sender_vcpus))  # refused before any worker starts
        _say_plan(spec, checks, calibrations, f"of {address}")
        return d.run_campaign_distributed(spec, out_dir, client, options=options, calibrations=calibrations,
                                          testbeds=[c.describe for c in checks])


# -- the worker process -------------------------------------------------------------------------------

def serve_worker(ref: str, scheduler: str, name: str | None = None, *, tls: LabTls | None = None,
                 host: str | None = None) -> int:
    """``bbrlab worker``: a Dask worker (one thread, the testbed resource, :class:`TestbedPlugin`) owning
    testbed ``ref`` for scheduler ``scheduler`` until SIGINT, SIGTERM or SIGHUP; then it restores the
    testbed and leaves. It speaks mutual TLS with ``tls``'s files (``tcp://`` only with ``tls.insecure``)
    and listens on ``host`` only (default: this machine's address towards the scheduler). Checked first:
    the scheduler's address, the TLS files, that the scheduler answers, the testbed."""
    import asyncio

    address = scheduler_address(scheduler)
    security, transport = lab_security(address, tls or LabTls(), role="worker")
    host = listen_host(address, host)
    tb = next(iter(load_testbeds([ref]).values()))
    label = tb.name
    tb.close()
    check_scheduler(address, security=security, role="worker")
    name = name or f"{label}@{socket.gethostname()}"

    if transport != TRANSPORT_TLS:
        _say(f"bbrlab: warning: {address} is {transport}; anyone who reaches it or this worker can run code here")
    d.quiet_logs()
    try:
        asyncio.run(_serve(ref, address, name, label, security, host))
    except BbrlabError:
        raise
    except Exception as e:  # noqa: BLE001 - the worker's own start failure (its plugin's error), said plainly
        raise BbrlabError(f"the worker for testbed {label} could not start: {type(e).__name__}: {e}") from None
    return 0


def listen_host(address: str, host: str | None) -> str:
    """The address a worker listens on: ``host`` when given (checked), else the one of this machine's
    interfaces that routes to the scheduler at ``address`` (loopback for a scheduler on loopback)."""
    import ipaddress

    if host:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValidationError("--host", host, "an IP address of this machine to listen on") from None
        return host
    target = SCHEDULER_RE.fullmatch(address)["host"].strip("[]")
    try:
        family = socket.AF_INET6 if ":" in target else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:  # no packet is sent: the route is looked up
            s.connect((target, 9))
            return s.getsockname()[0]
    except OSError as e:
        raise ValidationError("--scheduler", address, f"a scheduler this machine has a route to ({e.strerror or e}); "
                              "or give --host") from None


def nanny_listen_options(address: str, security, host: str | None) -> dict:
    """Where ``bbrlab worker``'s nanny and worker listen: their Dask comms on ``host`` (default: every
    address, so the scheduler and other workers reach them; mutual TLS guards them), their HTTP pages (health,
    metrics; no dashboard) on 127.0.0.1 only, whatever ``host`` is: nothing off this machine needs them."""
    return {"security": security, "host": host, "protocol": address.split("://", 1)[0], "dashboard": False,
            "dashboard_address": f"{d.LOOPBACK}:0"}


async def _serve(ref: str, address: str, name: str, label: str, security=None, host: str | None = None) -> None:
    import asyncio
    import logging
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    options = nanny_listen_options(address, security, host)
    async with TestbedNanny(address, nthreads=1, resources={RESOURCE: 1}, name=name, silence_logs=logging.WARNING,
                            plugins={TestbedPlugin(ref)}, **options) as nanny:
        _say(f"bbrlab worker {name}: testbed {label} joined {address}, one run at a time. Ctrl-C (or SIGTERM) "
             "stops it; a run in flight is stopped and the testbed restored first")
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(nanny.finished())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        _say(f"bbrlab worker {name}: stopping, restoring testbed {label}")
