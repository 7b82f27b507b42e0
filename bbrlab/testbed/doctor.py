"""What this machine can do for bbrlab: each check is measured, not assumed.

A check returns a :class:`Check` with a status (``ok``, ``missing``, ``warn``, ``info``), what
was found, and for anything missing the command that installs or enables it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from dataclasses import asdict, dataclass

from bbrlab.core.hosts import LocalHost
from bbrlab.kernel.debian import KEYRING

from . import timingenv
from .local import accel
from .local.kernelboot import BUSYBOX


@dataclass
class Check:
    """One check of this machine: ``status`` is ``ok``, ``missing``, ``warn`` or ``info``; ``detail`` what
    was found; ``fix`` the command that installs or enables what is missing.
    """

    name: str
    status: str  # ok | missing | warn | info
    detail: str
    fix: str = ""

    def to_dict(self) -> dict:
        """The check as a JSON-ready dict (``bbrlab doctor --json``)."""
        return asdict(self)


def _run(argv: list[str], timeout: float = 10) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


# tool -> (argv for its version, regex picking the version, Debian package)
TOOLS = {
    "iperf3": (["iperf3", "--version"], r"iperf (\S+)", "iperf3"),
    "ss": (["ss", "-V"], r"(iproute2[-\w.]*|\d[\w.]+)", "iproute2"),
    "tc": (["tc", "-V"], r"(iproute2[-\w.]*|\d[\w.]+)", "iproute2"),
    "qemu-system-x86_64": (["qemu-system-x86_64", "--version"], r"version (\S+)", "qemu-system-x86"),
    "qemu-img": (["qemu-img", "--version"], r"version (\S+)", "qemu-utils"),
    "debootstrap": (["debootstrap", "--version"], r"debootstrap (\S+)", "debootstrap"),
    "mke2fs": (["mke2fs", "-V"], r"mke2fs (\S+)", "e2fsprogs"),
    "schedtool": (["schedtool", "-V"], r"v?(\d[\d.]*)", "schedtool"),
    "chrt": (["chrt", "--version"], r"(\d[\d.]+)", "util-linux"),
    "ssh": (["ssh", "-V"], r"(OpenSSH_\S+)", "openssh-client"),
    "ssh-keygen": (["ssh-keygen", "-?"], r"()", "openssh-client"),
    # the receiver of rsync runs (docs/transfer.md): a per-run sshd whose key may only run rrsync
    "sshd": (["sshd", "-V"], r"(OpenSSH_[^\s,]+)", "openssh-server"),
    "rsync": (["rsync", "--version"], r"version (\S+)", "rsync"),
    "rrsync": (["rrsync", "-help"], r"()", "rsync"),
    "clang": (["clang", "--version"], r"clang version (\S+)", "clang"),  # the BPF sampler (bbrlab.sampling.sockdiag)
    "bpftool": (["bpftool", "version"], r"v(\S+)", "bpftool"),
}


def tool_version(tool: str) -> str | None:
    """The version string a tool prints, or None when the tool is not installed."""
    argv, pattern, _pkg = TOOLS[tool]
    if not shutil.which(argv[0]):
        return None
    try:
        p = _run(argv)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(pattern, p.stdout + p.stderr)
    return (m.group(1) if m and m.group(1) else "installed")


def check_tools() -> list[Check]:
    """One check per external tool in :data:`TOOLS`: its version, or the package that provides it."""
    out = []
    for tool, (_argv, _pat, pkg) in TOOLS.items():
        v = tool_version(tool)
        if v is None:
            out.append(Check(f"tool {tool}", "missing", "not found", f"apt-get install -y {pkg}  (or: make setup)"))
        else:
            out.append(Check(f"tool {tool}", "ok", v))
    return out


def check_root() -> Check:
    """Whether bbrlab runs as root (the testbed, tc and SCHED_DEADLINE need it)."""
    if os.geteuid() == 0:
        return Check("root", "ok", "running as root")
    return Check("root", "missing", f"running as uid {os.geteuid()}: testbed, tc and SCHED_DEADLINE need root",
                 "run bbrlab as root (sudo)")


def check_deadline() -> Check:
    """Try SCHED_DEADLINE for real on a throw-away process."""
    if not shutil.which("chrt"):
        return Check("SCHED_DEADLINE", "missing", "chrt not found", "apt-get install -y util-linux")
    # A SCHED_DEADLINE task may not fork, so set the policy on a sleeping child and read it back.
    child = subprocess.Popen(["sleep", "5"])
    try:
        p = _run(["chrt", "-d", "-p", "--sched-runtime", "1000000", "--sched-deadline", "10000000",
                  "--sched-period", "10000000", "0", str(child.pid)])
        if p.returncode == 0:
            p = _run(["chrt", "-p", str(child.pid)])
    except subprocess.TimeoutExpired:
        return Check("SCHED_DEADLINE", "warn", "test process did not finish")
    finally:
        child.kill()
        child.wait()
    rt = _read("/proc/sys/kernel/sched_rt_runtime_us")
    if p.returncode == 0 and "SCHED_DEADLINE" in p.stdout:
        return Check("SCHED_DEADLINE", "ok", f"a process ran under SCHED_DEADLINE (sched_rt_runtime_us={rt})")
    return Check("SCHED_DEADLINE", "missing", f"refused: {p.stderr.strip() or p.stdout.strip()}",
                 "run as root (CAP_SYS_NICE); inside containers allow sched_setattr")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def check_qdiscs() -> list[Check]:
    """Ask the host kernel for netem, tbf and fq on a dummy device in a throw-away namespace."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        return [Check("host qdiscs", "warn", "cannot probe without root and iproute2")]
    ns = f"bbrlab-doctor-{uuid.uuid4().hex[:6]}"
    found = []
    try:
        if _run(["ip", "netns", "add", ns]).returncode != 0:
            return [Check("host qdiscs", "warn", "could not create a network namespace to probe in")]
        # veth, not dummy: some kernels (this project's CI host) have no dummy driver.
        _run(["ip", "-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1"])
        trials = {
            "netem": ["netem", "delay", "1ms"],
            "tbf": ["tbf", "rate", "10mbit", "burst", "32k", "limit", "64k"],
            "fq": ["fq"],
        }
        for name, spec in trials.items():
            p = _run(["tc", "-n", ns, "qdisc", "replace", "dev", "d0", "root", *spec])
            if p.returncode == 0:
                found.append(Check(f"host qdisc {name}", "ok", "available in the host kernel"))
            else:
                where = ("netem will run inside the emulator VM's kernel (the local testbed does this)"
                         if name in ("netem", "fq") else "the local testbed needs it on the host")
                found.append(Check(f"host qdisc {name}", "warn" if name != "tbf" else "missing",
                                   f"not in the host kernel ({p.stderr.strip()}): {where}"))
            _run(["tc", "-n", ns, "qdisc", "del", "dev", "d0", "root"])
    finally:
        _run(["ip", "netns", "del", ns])
    return found


def check_kvm(probe: bool = False) -> Check:
    """Whether KVM can boot the guest kernel: from the cached probe result, or by a probe boot now when
    ``probe``.
    """
    if not os.path.exists("/dev/kvm"):
        return Check("accelerator", "info", "no /dev/kvm: guests run under QEMU TCG (slower, recorded in every run)")
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return Check("accelerator", "warn", "/dev/kvm not accessible: TCG only", "add the user to group kvm")
    result = accel.probe_kvm() if probe else accel.cached_kvm_probe()
    if result is None:
        return Check("accelerator", "info",
                     "/dev/kvm present; not yet probed with a real guest boot (bbrlab doctor --probe-kvm)")
    if result.usable:
        return Check("accelerator", "ok", f"KVM boots the guest kernel ({result.detail})")
    return Check("accelerator", "warn", f"KVM not usable for stock guests ({result.detail}): QEMU TCG is used")


def check_guest_kernel_sources() -> list[Check]:
    """Whether the 6.1 kernel source and headers the guest modules build against are installed under
    /usr/src.
    """
    out = []
    src = sorted(p for p in os.listdir("/usr/src") if p.startswith("linux-source-6.1")) if os.path.isdir("/usr/src") else []
    hdr = sorted(p for p in os.listdir("/usr/src") if re.match(r"linux-headers-6\.1\.\d+-\d+-amd64$", p)) if os.path.isdir("/usr/src") else []
    out.append(Check("guest kernel source", "ok" if src else "missing", src[0] if src else "linux-source-6.1 not installed",
                     "" if src else "apt-get install -y linux-source-6.1"))
    out.append(Check("guest kernel headers", "ok" if hdr else "missing", hdr[-1] if hdr else "6.1 headers not installed",
                     "" if hdr else "apt-get install -y linux-headers-amd64"))
    return out


def check_sender_kernel_tools() -> list[Check]:
    """What other sender kernels need: a static busybox for their initramfs, the archive keyring and
    gpgv to verify the Debian mirror (the guest image's debootstrap needs the keyring too), and the tools
    ``bbrlab kernel build-tree`` compiles with."""

    out = []
    for label, present, pkg in (
        ("sender initramfs busybox", BUSYBOX.is_file(), "busybox-static"),
        ("Debian archive keyring (guest image, kernels)", KEYRING.is_file(), "debian-archive-keyring"),
        ("gpgv", shutil.which("gpgv") is not None, "gpgv"),
        ("kernel build tools (flex, bison)", bool(shutil.which("flex") and shutil.which("bison")), "flex bison"),
        ("libelf headers", os.path.isfile("/usr/include/gelf.h"), "libelf-dev"),
    ):
        out.append(Check(label, "ok" if present else "missing", "present" if present else "not installed",
                         "" if present else f"apt-get install -y {pkg}  (or: make setup)"))
    return out


def _tick(hz: int | None, mode: str | None, config: str | None) -> str:
    return f"HZ {hz or 'unknown'}, tick {mode or 'unknown'} ({config or 'no kernel config found'})"


def host_timing_checks(host: timingenv.HostTiming) -> list[Check]:
    """The timing environment of the host that runs the sender VM (``metadata.timing_env.host``), one ``info``
    line each: CPU model, frequency governor, SMT, its clocksource and tick."""
    if host.error:
        return [Check("timing: host", "warn", f"could not be read: {host.error}")]
    active = {True: ", active", False: ", inactive"}.get(host.smt_active, "")
    return [Check("timing: host CPU", "info", host.cpu_model or "unknown"),
            Check("timing: host governor", "info", host.governor if host.governor != "none"
                  else "none (no cpufreq: the CPU's speed is the hypervisor's or firmware's)"),
            Check("timing: host SMT", "info", f"{host.smt}{active}"),
            Check("timing: host clock", "info", f"clocksource {host.clocksource or 'unknown'}; "
                                                + _tick(host.hz, host.tick_mode, host.config))]


def guest_timing_checks(env: timingenv.TimingEnvironment) -> list[Check]:
    """The sender guest's and the hypervisor's part of a running testbed's timing environment, one line each."""
    g, h = env.guest, env.hypervisor
    if g.error:
        out = [Check("timing: sender guest", "warn", f"could not be read: {g.error}")]
    else:
        out = [Check("timing: sender clock", "info", f"clocksource {g.clocksource or 'unknown'} (available: "
                     f"{' '.join(g.clocksources or []) or 'none'}; kvm-clock {'offered' if g.kvm_clock else 'not offered'})"),
               Check("timing: sender tick", "info", _tick(g.hz, g.tick_mode, g.config)
                     + (f"; command line: {' '.join(g.timer_cmdline)}" if g.timer_cmdline else ""))]
    options = "QEMU's command line not read" if h.qemu_options is None else (
        " ".join(h.qemu_options) or "QEMU's defaults (RTC in UTC on the host clock)")
    out.append(Check("timing: hypervisor", "warn" if h.error else "info",
                     f"accelerator {h.accelerator or 'unknown'}; {options}" + (f" ({h.error})" if h.error else "")))
    return out


def check_timing(testbed: str | None = None) -> list[Check]:
    """The timing environment a run records (:mod:`bbrlab.testbed.timingenv`): this machine's part (the local
    testbed's hypervisor host), and with ``testbed`` (a running local testbed's name or a lab's file) the whole of
    it, as that testbed's runs read it: its sender guest, its hypervisor host and QEMU's timer options."""
    if testbed is None:
        host, _ = timingenv.read_host(LocalHost())
        return [*host_timing_checks(host), Check("timing: sender guest", "info", "read at every run; "
                                                 "bbrlab doctor --testbed NAME reads a running testbed's")]
    from . import load

    try:
        tb = load(testbed)
    except Exception as e:  # noqa: BLE001 - a testbed that is not up is a finding of the doctor, not a crash
        return [Check("timing", "warn", f"testbed {testbed}: {e}")]
    try:
        env = timingenv.of_testbed(tb)
    finally:
        tb.close()
    return [*host_timing_checks(env.host), *guest_timing_checks(env)]


def run_checks(probe_kvm: bool = False, testbed: str | None = None) -> list[Check]:
    """Every check, in the order ``bbrlab doctor`` prints them; ``probe_kvm`` boots a guest to test KVM;
    ``testbed`` names a running testbed whose timing environment to read (:func:`check_timing`)."""
    checks = [
        Check("host kernel", "info", os.uname().release),
        check_root(),
        check_deadline(),
        *check_qdiscs(),
        check_kvm(probe=probe_kvm),
        *check_tools(),
        *check_guest_kernel_sources(),
        *check_sender_kernel_tools(),
        *check_timing(testbed),
    ]
    return checks
