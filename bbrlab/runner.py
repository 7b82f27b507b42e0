"""One measurement run on a testbed, from link to run record.

Per run, in order (docs/run-record.md describes what is written):

1. **probe the sender** in one command: kernel, available CCAs, the sysctls that matter; set
   ``tcp_no_metrics_save=1`` and flush ``ip tcp_metrics`` so no run steers the next. A CCA the sender
   does not offer fails the run here, before anything else changes.
2. **link**: set on the emulator only when it differs from the previous run's (the VMs and qdiscs stay
   up between runs; only what changes is reconfigured).
3. **iperf3 server** on the receiver (one test, ready when it listens).
4. **ss sampler** on the sender when the flow asks for it, filtering by the client's data ports.
5. **contention** on the sender's vCPU threads (context manager: restored always), and inside it the
   **iperf3 client** on the sender, under a hard timeout on the sender itself.
6. **verify** what held: CCA from iperf3 (``sender_tcp_congestion``) and from ss, the deadline policy
   read back on the vCPU threads after the run, the qdiscs read back and compared with the request,
   the data streams on the expected ports. Anything that did not hold fails the run, with the reason.
7. **clean up** whatever happened: sampler and server stopped, the link cleared after a failure (and
   re-applied by the next run), contention restored by its context manager.

:class:`Runner` keeps what persists between runs of one campaign (the link currently set, the
testbed's description) and is the campaign's run function.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__, sampling
from . import iperf as iperf_mod
from . import record as rec
from .errors import BbrlabError, TestbedError
from .scenario import Link, Scenario

#: Seconds beyond the iperf3 duration that the client's SSH command may take before we give up on it
#: (the sender's own ``timeout`` has already killed iperf3 by then).
SSH_MARGIN_S = 30.0
SYSCTLS = (
    "net.ipv4.tcp_no_metrics_save", "net.ipv4.tcp_congestion_control", "net.core.default_qdisc",
    "net.core.wmem_max", "net.core.rmem_max", "net.ipv4.tcp_wmem", "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_limit_output_bytes", "net.ipv4.tcp_autocorking",
)
#: CCAs built into stock kernels; any other name is a module whose identity goes into the record.
STOCK_CCAS = {"reno", "cubic", "bbr", "htcp", "vegas", "westwood", "dctcp", "bic", "illinois", "hybla",
              "highspeed", "scalable", "lp", "veno", "yeah", "nv", "cdg"}

#: The sender probe (bash): fixed text, values only as positional arguments ("$@" = sysctl keys). It reads /proc
#: with bash's ``read`` (dash reads byte by byte, which /proc/sys files answer with the first byte only): every
#: fork costs tens of milliseconds in a TCG guest, so the only one is ``ip tcp_metrics``.
_PROBE = r"""
echo 1 > /proc/sys/net/ipv4/tcp_no_metrics_save
ip tcp_metrics flush all >/dev/null 2>&1
read -r v < /proc/sys/kernel/osrelease; echo "kernel=$v"
read -r v < /proc/sys/net/ipv4/tcp_available_congestion_control; echo "available=$v"
for key in "$@"; do
    path=/proc/sys/${key//.//}
    v=; [[ -r $path ]] && read -r v < "$path"; echo "sysctl:$key=$v"
done
"""
_VERSIONS = r"""
echo "ss=$(ss -V 2>/dev/null)"
echo "iperf3=$(iperf3 --version 2>/dev/null | head -n 1)"
"""


#: Stop the sampler: $1 stop file, $2 pid, $3 log, $4 print the log (1) or not (0).
_STOP_SAMPLER = iperf_mod.RUNNING_SH + r"""
touch "$1"
i=0
while running "$2" && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
kill -KILL -- "-$2" 2>/dev/null; kill -KILL "$2" 2>/dev/null
status=0
if [ "$4" = 1 ]; then cat "$3" || status=1; fi
rm -f "$1" "$3"
exit $status
"""


class RunFailed(BbrlabError):
    """Something that must hold for a valid measurement did not; the message is the record's reason."""


def _key_values(text: str) -> dict:
    info: dict = {"sysctls": {}}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.startswith("sysctl:"):
            info["sysctls"][key[len("sysctl:"):]] = " ".join(value.split())
        elif key:
            info[key] = value.strip()
    return info


def probe_sender(host) -> dict:
    """One command on the sender: kernel, CCAs and sysctls, after turning TCP metrics caching off."""
    info = _key_values(host.output(["bash", "-c", _PROBE, "bbrlab-probe", *SYSCTLS], timeout=60))
    info["available"] = info.get("available", "").split()
    return info


def tool_versions(host) -> dict:
    """``ss -V`` and ``iperf3 --version`` on ``host``, in one command."""
    info = _key_values(host.output(["sh", "-c", _VERSIONS], timeout=60))
    return {"ss": info.get("ss"), "iperf3": info.get("iperf3")}


def offloads(host, ip: str) -> dict:
    """``ethtool -k`` of the sender's interface towards ``ip`` (the segmentation/receive offloads)."""
    route = host.run(["ip", "-o", "route", "get", ip], check=False, timeout=20).stdout.split()
    if "dev" not in route:
        return {"error": f"no route to {ip}"}
    dev = route[route.index("dev") + 1]
    res = host.run(["ethtool", "-k", dev], check=False, timeout=20)
    if not res.ok:
        return {"interface": dev, "error": (res.stderr or res.stdout).strip()[:200] or "ethtool failed"}
    wanted = ("tcp-segmentation-offload", "generic-segmentation-offload", "generic-receive-offload",
              "large-receive-offload", "tx-checksumming", "scatter-gather")
    out = {"interface": dev}
    for line in res.stdout.splitlines():
        key, _, value = line.strip().partition(":")
        if key in wanted:
            out[key] = value.strip().split()[0] if value.strip() else ""
    return out


def client_port(run_id: str, attempt: int) -> int:
    """Base local port for the client's data streams, below Linux's ephemeral range (32768+).

    Differs between runs and attempts, so a port still in TIME_WAIT from the previous run is not reused.
    """
    h = int(hashlib.sha256(f"{run_id}/{attempt}".encode()).hexdigest()[:8], 16)
    return 20_000 + (h % 90) * 128


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


@dataclass
class Runner:
    """Runs scenarios on ``testbed`` one after the other; call it as the campaign's run function.

    ``current_link`` is the link set on the emulator now (None: unknown, set it before the next run).
    """

    testbed: object
    ready_timeout_s: float = 15.0
    current_link: Link | None = None
    _static: dict | None = field(default=None, repr=False)
    _recovered: dict | None = field(default=None, repr=False)
    _after_timing: dict = field(default_factory=dict, repr=False)
    last_timing: dict = field(default_factory=dict)

    # -- campaign interface --------------------------------------------------------------------
    def __call__(self, scenario: Scenario, staging: Path, *, run_id: str, campaign: str, attempt: int) -> dict:
        return self.run(scenario, Path(staging), run_id=run_id, campaign=campaign, attempt=attempt)

    def close(self) -> None:
        """Take bbrlab's qdiscs off the emulator (end of a campaign)."""
        from . import link

        emulator = self.testbed.emulator
        link.clear(emulator.host, emulator.ports)
        self.current_link = None

    # -- one run -------------------------------------------------------------------------------
    def static_metadata(self) -> dict:
        """What does not change during a campaign (measured once per Runner): the testbed's description,
        versions, the sender's offloads."""
        if self._static is None:
            tb = self.testbed
            describe = tb.describe()
            self._static = {
                "testbed": {"name": tb.name, "kind": describe.get("kind", "lab"), **describe},
                "versions": {"qemu": describe.get("qemu_version"), "bbrlab": __version__,
                             "bbrlab_git": git_commit(), **tool_versions(tb.sender.host)},
                "offloads_sender": offloads(tb.sender.host, tb.receiver.experiment_ip),
            }
        return self._static

    def run(self, scenario: Scenario, out_dir: Path, *, run_id: str | None = None, campaign: str = "adhoc",
            attempt: int = 1) -> dict:
        """Run ``scenario`` once, write ``iperf.json`` (and ``ss.log``) into ``out_dir``; return the record.

        Never raises for a failure of the run itself: the record says ``failed`` and why. Raises only for
        KeyboardInterrupt/SystemExit (after cleaning up).
        """
        run_id = run_id or scenario.run_id
        started = rec.now_iso()
        meta: dict = {}
        status, reason = "ok", None
        t0 = time.monotonic()
        try:
            self._run(scenario, out_dir, run_id, attempt, meta)
        except (KeyboardInterrupt, SystemExit):
            self._forget_link()
            raise
        except Exception as e:  # noqa: BLE001 - recorded as the run's failure
            status, reason = "failed", f"{type(e).__name__}: {e}"
            self._forget_link()
        meta.setdefault("timing", {})["run_wall_s"] = round(time.monotonic() - t0, 3)
        self.last_timing = meta["timing"]
        return rec.build_record(run_id=run_id, campaign=campaign, status=status, reason=reason, attempt=attempt,
                                started_at=started, ended_at=rec.now_iso(), scenario=scenario.to_dict(),
                                metadata=meta)

    def recover(self) -> dict:
        """Clear what a killed predecessor (SIGKILL, power loss) may have left; called before the first run.

        - SCHED_DEADLINE still on the sender's vCPU threads (its context manager never got to restore);
        - iperf3 processes with a socket on the iperf3 port in the sender's or the receiver's network
          namespace (found with ``ss -p``, so nothing else on a shared host is touched);
        - ss samplers still running on the sender (asked to stop through their stop files).
        """
        from . import contention

        tb = self.testbed
        cleared = contention.clear_deadline(tb.sender.hypervisor, tb.sender.vcpu_threads())
        killed = {"sender": iperf_mod.kill_port_users(tb.sender.host, iperf_mod.DEFAULT_PORT, listening=False),
                  "receiver": iperf_mod.kill_port_users(tb.receiver.host, iperf_mod.DEFAULT_PORT, listening=True)}
        tb.sender.host.run(["sh", "-c", 'for f in /tmp/bbrlab-ss-*.log; do [ -e "$f" ] && touch "${f%.log}.stop"; '
                                        "done; exit 0"], timeout=20, check=False)
        self._recovered = {"deadline_cleared_tids": cleared, "iperf3_killed": killed}
        return self._recovered

    def _forget_link(self) -> None:
        """After a failure the emulator's state is unknown: clear it, and let the next run set it again."""
        self.current_link = None
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the run's own error is what gets reported
            pass

    def _run(self, scenario: Scenario, out_dir: Path, run_id: str, attempt: int, meta: dict) -> None:
        from . import contention, link

        tb, flow = self.testbed, scenario.flow
        sender, receiver, emulator = tb.sender, tb.receiver, tb.emulator
        timing: dict = {}
        meta["timing"] = timing
        static = self.static_metadata()
        meta["testbed"] = static["testbed"]
        if self._recovered is None:
            meta["recovered"] = self.recover()

        t = time.monotonic()
        probe = probe_sender(sender.host)
        meta["cca"] = {"requested": flow.cca, "available": probe["available"], "iperf_sender": None,
                       "ss_seen": None}
        meta["sysctls"] = {"sender": probe["sysctls"]}
        meta["versions"] = dict(static["versions"])
        meta["testbed"] = {**static["testbed"], "sender_kernel": probe.get("kernel")}
        if flow.cca not in probe["available"]:
            raise RunFailed(f"the sender offers {probe['available']}, not {flow.cca!r}")
        meta["module"] = self._module_identity(flow.cca)
        meta["offloads"] = {"sender": static["offloads_sender"]}
        timing["probe_s"] = round(time.monotonic() - t, 3)

        t = time.monotonic()
        if self.current_link != scenario.link:
            self.current_link = None
            link.set(emulator.host, emulator.ports, scenario.link)
            self.current_link = scenario.link
            timing["link_set"] = True
        timing["link_s"] = round(time.monotonic() - t, 3)

        threads = sender.vcpu_threads()
        cport = client_port(run_id, attempt)
        ports = list(range(cport, cport + flow.streams))
        meta["flow"] = {"client_ports": ports, "server_ip": receiver.experiment_ip}
        limit_s = flow.duration_s + iperf_mod.CLIENT_MARGIN_S
        server_log = f"/tmp/bbrlab-iperf3-server-{run_id}.log"
        t = time.monotonic()
        server_pid = iperf_mod.start_server(receiver.host, server_log, lifetime_s=limit_s + 60,
                                            ready_timeout_s=self.ready_timeout_s)
        sampler = None
        cleaned_up = False
        try:
            if flow.sample_ss_ms:
                sampler = self._start_sampler(sender.host, run_id, flow.sample_ss_ms, limit_s + 30, ports)
            timing["setup_s"] = round(time.monotonic() - t, 3)
            t = time.monotonic()
            with contention.contended(sender.hypervisor, threads, scenario.contention) as session:
                result = sender.host.run(
                    iperf_mod.client_argv(receiver.experiment_ip, cca=flow.cca, duration_s=flow.duration_s,
                                          streams=flow.streams, cport=cport),
                    timeout=limit_s + SSH_MARGIN_S, check=False)
            timing["client_s"] = round(time.monotonic() - t, 3)
            meta["contention"] = session.record()
            t = time.monotonic()
            ss_text, qdiscs = self._after_client(sampler, server_pid, server_log)
            timing.update(self._after_timing)
            cleaned_up = True
        finally:
            if not cleaned_up:  # the client or the contention failed: stop what runs, best effort
                if sampler:
                    self._stop_sampler(sender.host, sampler, fetch=False)
                iperf_mod.stop(receiver.host, server_pid, remove=[server_log])

        rec.write_file(out_dir / "iperf.json", result.stdout)
        meta["qdiscs"] = qdiscs
        parsed = self._check_client(result, meta)
        if ss_text is not None:
            rec.write_file(out_dir / "ss.log", ss_text)
            self._check_ss(ss_text, parsed, flow.cca, meta)
        self._check_ports(parsed, ports)
        self._check_contention(meta["contention"], scenario)
        self._check_qdiscs(scenario.link, emulator.ports, qdiscs)
        timing["verify_s"] = round(time.monotonic() - t, 3)

    # -- pieces ----------------------------------------------------------------------------------
    def _after_client(self, sampler: dict | None, server_pid: int, server_log: str) -> tuple[str | None, dict]:
        """In parallel (three different hosts, each a round trip or more): stop and fetch the sampler on
        the sender, stop the server on the receiver, read the qdiscs back on the emulator."""

        from . import link

        tb = self.testbed

        def timed(name, fn, *args, **kwargs):
            t0 = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                self._after_timing[name] = round(time.monotonic() - t0, 3)

        self._after_timing = {}
        with ThreadPoolExecutor(max_workers=3, thread_name_prefix="bbrlab-after") as pool:
            server = pool.submit(timed, "server_stop_s", iperf_mod.stop, tb.receiver.host, server_pid,
                                 remove=[server_log])
            qdiscs = pool.submit(timed, "qdisc_readback_s", link.show, tb.emulator.host, tb.emulator.ports)
            samples = pool.submit(timed, "sampler_stop_s", self._stop_sampler, tb.sender.host, sampler) \
                if sampler else None
            server.result()
            return (samples.result() if samples else None), qdiscs.result()

    def _module_identity(self, cca: str) -> dict | None:
        if cca in STOCK_CCAS:
            return None
        from .kernel import module_identity

        try:
            return module_identity(self.testbed.sender.host, cca)
        except TestbedError as e:
            return {"name": cca, "error": str(e)}

    def _start_sampler(self, host, run_id: str, interval_ms: int, stop_after_s: float, ports: list[int]) -> dict:
        base = f"/tmp/bbrlab-ss-{run_id}"
        host.run(["rm", "-f", f"{base}.stop", f"{base}.log"], timeout=20)
        argv = sampling.sampler_argv(interval_ms, stop_after_s, f"{base}.stop", data_ports=ports)
        pid = host.spawn(argv, f"{base}.log")
        return {"pid": pid, "log": f"{base}.log", "stop": f"{base}.stop"}

    def _stop_sampler(self, host, sampler: dict, *, fetch: bool = True) -> str | None:
        """Ask the sampler to stop (stop file), wait until it has exited (killed after 10 s), print and
        remove its log: one command, because every round trip to a contended TCG guest is slow."""
        res = host.run(["sh", "-c", _STOP_SAMPLER, "bbrlab-stop", sampler["stop"], str(sampler["pid"]),
                        sampler["log"], "1" if fetch else "0"], timeout=60, check=False)
        if fetch and not res.ok:
            raise RunFailed(f"could not fetch the ss samples: {res.stderr.strip()[:300]}")
        return res.stdout if fetch else None

    def _check_client(self, result, meta: dict) -> iperf_mod.IperfResult:
        if not result.stdout.strip():
            raise RunFailed(f"iperf3 client printed nothing (exit {result.exit_code}): {result.stderr.strip()[:300]}")
        parsed = iperf_mod.parse_result(result.stdout)
        if result.exit_code != 0:
            raise RunFailed(f"iperf3 client exit code {result.exit_code}")
        meta["cca"]["iperf_sender"] = parsed.sender_tcp_congestion
        summary = parsed.to_dict()
        summary.pop("intervals")
        meta["iperf"] = summary
        if parsed.sender_tcp_congestion != meta["cca"]["requested"]:
            raise RunFailed(f"iperf3 reports sender_tcp_congestion {parsed.sender_tcp_congestion!r}, "
                            f"asked for {meta['cca']['requested']!r}")
        return parsed

    def _check_ss(self, text: str, parsed: iperf_mod.IperfResult, cca: str, meta: dict) -> None:
        rows = sampling.parse_ss_log(text, ports=parsed.data_ports)
        seen = sorted({r["cca"] for r in rows})
        meta["cca"]["ss_seen"] = seen
        meta["sampling"] = {"rows": len(rows), "footer": sampling.parse_sampler_footer(text),
                            "interval": sampling.achieved_interval_ms(text)}
        if not rows:
            raise RunFailed("the ss sampler saw no data connection")
        if seen != [cca]:
            raise RunFailed(f"ss saw congestion control {seen} on the data streams, asked for {cca!r}")

    @staticmethod
    def _check_ports(parsed: iperf_mod.IperfResult, ports: list[int]) -> None:
        if sorted(parsed.data_ports) != ports:
            raise RunFailed(f"iperf3's data streams used local ports {list(parsed.data_ports)}, expected {ports}")

    @staticmethod
    def _check_contention(record: dict, scenario: Scenario) -> None:
        evidence = record.get("evidence") or {}
        if "error" in evidence:
            raise RunFailed(f"contention evidence missing: {evidence['error']}")
        if not evidence.get("policy_held", False):
            raise RunFailed(f"the deadline policy did not hold on the vCPU threads: {json.dumps(evidence)[:400]}")
        for thread in evidence.get("threads", []):
            after = (thread.get("policy_after") or {}).get("policy", "")
            if scenario.contention.unlimited == ("DEADLINE" in str(after)):
                raise RunFailed(f"vCPU thread {thread['tid']} ran under {after} for a "
                                f"{scenario.contention.cpu_share_pct} % share")

    @staticmethod
    def _check_qdiscs(link_: Link, ports, qdiscs: dict) -> None:
        from . import link
        from .qdisc import build_tree

        try:
            link.check_readback(build_tree(link_, tuple(ports)), qdiscs)
        except BbrlabError as e:
            raise RunFailed(f"the emulator's qdiscs after the run differ from the request: {e}") from None


def run_once(testbed, scenario: Scenario, out_dir: str | Path, **kwargs) -> dict:
    """Run one scenario with a fresh :class:`Runner` (sets the link); return the record (not committed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return Runner(testbed).run(scenario, out, **kwargs)


def describe_command(argv: list[str]) -> str:
    """An argument list as a person would type it (for logs and error messages)."""
    return shlex.join(argv)
