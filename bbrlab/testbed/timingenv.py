"""The timing environment of a run (``metadata.timing_env``): what sets the clocks and timers the sender's TCP
and the contention depend on, read once per run in one command on each host.

- **The sender guest** (:data:`GUEST_SCRIPT`, bash's ``read`` where it can: every fork is slow under TCG): its
  current and available clocksources (``/sys/devices/system/clocksource/clocksource0/``; ``kvm-clock`` among
  them means the hypervisor offers KVM's paravirtual clock), its kernel's ``CONFIG_HZ`` and tick mode
  (``CONFIG_HZ_PERIODIC``, ``CONFIG_NO_HZ_IDLE``, ``CONFIG_NO_HZ_FULL``) from ``/boot/config-$(uname -r)``, else
  ``/proc/config.gz`` (``unknown`` when neither is there), and the timer options of its kernel command line
  (``clocksource=``, ``tsc=``, ``nohz=``, ``nohz_full=`` ...: :data:`CMDLINE_TIMER_OPTIONS`).
- **The host that runs the sender VM** (:data:`HOST_SCRIPT`): its CPU model, the frequency governors of its
  CPUs (``scaling_governor``; ``none`` without cpufreq, as in most VMs), SMT (``smt/control`` and
  ``smt/active``, else whether CPU 0 has thread siblings), its own clocksource, HZ and tick mode, and the QEMU
  command line of the process that owns a vCPU thread (``/proc/<tid>/cmdline``).
- **The hypervisor**: the accelerator the testbed records (``kvm``, ``tcg``: ``metadata.testbed.accelerator``)
  and QEMU's options that set clocks and timers (:data:`QEMU_TIMER_OPTIONS`: ``-accel``, ``-cpu``, ``-rtc``,
  ``-machine`` ...; an empty list means QEMU's defaults: the RTC in UTC on the host's clock).

A host that cannot be read gives its part with ``error`` set and the rest None; the run goes on (the timing
environment describes the run, it does not gate it). :func:`measure` reads all three; ``bbrlab doctor`` shows the
host's part (:func:`read_host` on this machine) and, for a running testbed, the whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bbrlab.core.hosts import Host

#: The sender guest's script (bash). Lines ``key=value``; the kernel config's lines as they are.
GUEST_SCRIPT = r"""
d=/sys/devices/system/clocksource/clocksource0
v=; [[ -r $d/current_clocksource ]] && read -r v < $d/current_clocksource; echo "clocksource=$v"
v=; [[ -r $d/available_clocksource ]] && read -r v < $d/available_clocksource; echo "available=$v"
read -r rel < /proc/sys/kernel/osrelease; echo "kernel=$rel"
v=; read -r v < /proc/cmdline; echo "cmdline=$v"
want='^CONFIG_(HZ|HZ_PERIODIC|NO_HZ|NO_HZ_IDLE|NO_HZ_FULL)='
if [[ -r /boot/config-$rel ]]; then echo "config=/boot/config-$rel"; grep -E "$want" "/boot/config-$rel"
elif [[ -r /proc/config.gz ]]; then echo "config=/proc/config.gz"; zcat /proc/config.gz | grep -E "$want"
else echo "config="; fi
true
"""
#: The host's script (POSIX sh); ``$1`` a thread id of the sender's QEMU (empty: QEMU's options are not read).
HOST_SCRIPT = r"""
tid=$1; cpu=/sys/devices/system/cpu
echo "cpu_model=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2-)"
cat $cpu/cpu[0-9]*/cpufreq/scaling_governor 2>/dev/null | sort -u | sed 's/^/governor=/'
echo "smt_control=$(cat $cpu/smt/control 2>/dev/null)"
echo "smt_active=$(cat $cpu/smt/active 2>/dev/null)"
echo "siblings=$(cat $cpu/cpu0/topology/thread_siblings_list 2>/dev/null)"
echo "clocksource=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)"
rel=$(uname -r); want='^CONFIG_(HZ|HZ_PERIODIC|NO_HZ|NO_HZ_IDLE|NO_HZ_FULL)='
if [ -r "/boot/config-$rel" ]; then echo "config=/boot/config-$rel"; grep -E "$want" "/boot/config-$rel"
elif [ -r /proc/config.gz ]; then echo "config=/proc/config.gz"; zcat /proc/config.gz | grep -E "$want"
else echo "config="; fi
if [ -n "$tid" ]; then
  if [ -r "/proc/$tid/cmdline" ]; then tr '\0' '\n' < "/proc/$tid/cmdline" | sed 's/^/qemu_arg=/'
  else echo "qemu_error=no process has thread $tid"; fi
fi
true
"""
#: Kernel command-line options that change the clocksource or the tick (printed as given, ``name`` or ``name=value``).
CMDLINE_TIMER_OPTIONS = ("clocksource", "tsc", "notsc", "nohz", "nohz_full", "hpet", "nohpet", "no_timer_check",
                         "lpj", "highres", "skew_tick", "clocksource.max_cswd_read_retries", "kvm-clock.vsyscall",
                         "no-kvmclock", "no-kvmclock-vsyscall", "rcu_nocbs", "isolcpus", "idle")
#: QEMU options that set clocks or timers (the accelerator among them), kept with their values.
QEMU_TIMER_OPTIONS = ("-accel", "-enable-kvm", "-cpu", "-rtc", "-machine", "-M", "-icount", "-no-hpet", "-global")
#: The tick modes a kernel config names: the symbol set to ``y`` -> the mode recorded.
TICK_MODES = {"CONFIG_NO_HZ_FULL": "nohz_full", "CONFIG_NO_HZ_IDLE": "nohz_idle", "CONFIG_HZ_PERIODIC": "periodic",
              "CONFIG_NO_HZ": "nohz_idle"}
#: What a value reads when the host does not say.
UNKNOWN = "unknown"


@dataclass(frozen=True)
class KernelTick:
    """A kernel's ``CONFIG_HZ`` (``hz``, None when unknown) and tick mode (``periodic``, ``nohz_idle``,
    ``nohz_full``, or ``unknown``), and the config file they were read from (``config``; None: none found)."""

    hz: int | None
    tick_mode: str
    config: str | None


@dataclass(frozen=True)
class GuestTiming:
    """``metadata.timing_env.guest``: the sender guest's ``clocksource`` and the ``clocksources`` it offers,
    ``kvm_clock`` (kvm-clock among them), its kernel's ``hz``, ``tick_mode`` and the ``config`` they came from,
    the ``timer_cmdline`` options of its kernel command line, its ``kernel`` release; ``error`` when it could
    not be read (the rest None then)."""

    clocksource: str | None = None
    clocksources: list[str] | None = None
    kvm_clock: bool | None = None
    hz: int | None = None
    tick_mode: str | None = None
    config: str | None = None
    timer_cmdline: list[str] | None = None
    kernel: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class HostTiming:
    """``metadata.timing_env.host``: the host that runs the sender VM: ``cpu_model``, ``governor`` (the CPUs'
    scaling governors, distinct ones joined by ``,``; ``none`` without cpufreq), ``smt`` (``smt/control``: on,
    off, forceoff, notsupported, notimplemented; else ``on``/``off`` from CPU 0's thread siblings; ``unknown``),
    ``smt_active`` (``smt/active``), its own ``clocksource``, ``hz``, ``tick_mode`` and ``config``; ``error``
    when it could not be read."""

    cpu_model: str | None = None
    governor: str | None = None
    smt: str | None = None
    smt_active: bool | None = None
    clocksource: str | None = None
    hz: int | None = None
    tick_mode: str | None = None
    config: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class HypervisorTiming:
    """``metadata.timing_env.hypervisor``: the ``accelerator`` (the testbed's: kvm, tcg, unknown) and
    ``qemu_options``, the options of the sender's QEMU that set clocks or timers, each ``"-option value"``
    (empty: QEMU's defaults; None when its command line was not read, ``error`` says why when it failed)."""

    accelerator: str | None = None
    qemu_options: list[str] | None = None
    error: str | None = None


@dataclass(frozen=True)
class TimingEnvironment:
    """``metadata.timing_env``: the sender ``guest``'s clocks and tick, the ``host`` that runs it, and the
    ``hypervisor``'s timer settings (the module's text says how each is read)."""

    guest: GuestTiming = field(default_factory=GuestTiming)
    host: HostTiming = field(default_factory=HostTiming)
    hypervisor: HypervisorTiming = field(default_factory=HypervisorTiming)


def key_values(text: str) -> dict[str, list[str]]:
    """``key=value`` lines as ``{key: [values in order]}`` (a key may repeat); lines without ``=`` ignored."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def _first(values: dict[str, list[str]], key: str) -> str | None:
    found = values.get(key)
    return found[0] if found and found[0] else None


def kernel_tick(values: dict[str, list[str]]) -> KernelTick:
    """HZ and tick mode from the ``CONFIG_*`` lines among ``values`` (:func:`key_values`) and the ``config``
    file named; ``unknown`` mode and no HZ when no config was found or it names neither."""
    config = _first(values, "config")
    hz_text = _first(values, "CONFIG_HZ")
    hz = int(hz_text) if hz_text and hz_text.isdigit() else None
    mode = next((m for symbol, m in TICK_MODES.items() if _first(values, symbol) == "y"), UNKNOWN)
    return KernelTick(hz if config else None, mode if config else UNKNOWN, config)


def timer_cmdline(cmdline: str) -> list[str]:
    """The options of a kernel command line that concern clocks or the tick (:data:`CMDLINE_TIMER_OPTIONS`)."""
    return [word for word in cmdline.split() if word.partition("=")[0] in CMDLINE_TIMER_OPTIONS]


def parse_guest(text: str) -> GuestTiming:
    """The :class:`GuestTiming` of :data:`GUEST_SCRIPT`'s output."""
    values = key_values(text)
    available = (_first(values, "available") or "").split()
    tick = kernel_tick(values)
    return GuestTiming(clocksource=_first(values, "clocksource"), clocksources=available,
                       kvm_clock="kvm-clock" in available, hz=tick.hz, tick_mode=tick.tick_mode, config=tick.config,
                       timer_cmdline=timer_cmdline(_first(values, "cmdline") or ""),
                       kernel=_first(values, "kernel"))


def smt_state(control: str | None, active: str | None, siblings: str | None) -> tuple[str, bool | None]:
    """``(smt, smt_active)``: ``smt/control``'s word when the kernel has it; else ``on`` when CPU 0 has a thread
    sibling (its ``thread_siblings_list`` names more than one CPU), ``off`` when it has none, ``unknown``."""
    is_active = {"1": True, "0": False}.get(active or "")
    if control:
        return control, is_active
    if siblings:
        several = "," in siblings or "-" in siblings
        return ("on" if several else "off"), (several if is_active is None else is_active)
    return UNKNOWN, is_active


def parse_host(text: str) -> HostTiming:
    """The :class:`HostTiming` of :data:`HOST_SCRIPT`'s output."""
    values = key_values(text)
    governors = sorted({g for g in values.get("governor", []) if g})
    smt, active = smt_state(_first(values, "smt_control"), _first(values, "smt_active"), _first(values, "siblings"))
    tick = kernel_tick(values)
    model = _first(values, "cpu_model")
    return HostTiming(cpu_model=" ".join(model.split()) if model else None, governor=",".join(governors) or "none",
                      smt=smt, smt_active=active, clocksource=_first(values, "clocksource"), hz=tick.hz,
                      tick_mode=tick.tick_mode, config=tick.config)


def qemu_timer_options(argv: list[str]) -> list[str]:
    """QEMU's options among ``argv`` that set clocks or timers (:data:`QEMU_TIMER_OPTIONS`), each with its value
    (``"-accel kvm"``; a flag alone, ``"-enable-kvm"``); ``-global`` only for the timer devices (kvm-pit, hpet,
    the RTC, kvmclock)."""
    out = []
    flags = ("-enable-kvm", "-no-hpet")
    for i, arg in enumerate(argv):
        name = arg[1:] if arg.startswith("--") else arg  # --rtc is -rtc
        if name not in QEMU_TIMER_OPTIONS:
            continue
        if name in flags:
            out.append(name)
            continue
        value = argv[i + 1] if i + 1 < len(argv) else ""
        if name == "-global" and not any(t in value for t in ("pit", "hpet", "rtc", "kvmclock", "mc146818")):
            continue
        out.append(f"{name} {value}".strip())
    return out


def parse_hypervisor(text: str, accelerator: str | None, asked: bool) -> HypervisorTiming:
    """The :class:`HypervisorTiming` of :data:`HOST_SCRIPT`'s output (``asked``: a QEMU thread was given)."""
    values = key_values(text)
    if not asked:
        return HypervisorTiming(accelerator)
    error = _first(values, "qemu_error")
    argv = values.get("qemu_arg", [])
    if error or not argv:
        return HypervisorTiming(accelerator, None, error or "QEMU's command line was empty")
    return HypervisorTiming(accelerator, qemu_timer_options(argv))


def read_guest(host: Host) -> GuestTiming:
    """The sender guest's part, in one command on ``host``; its ``error`` when that failed."""
    try:
        return parse_guest(host.output(["bash", "-c", GUEST_SCRIPT], timeout=60))
    except Exception as e:  # noqa: BLE001 - recorded, not fatal: the timing environment describes the run
        return GuestTiming(error=f"{type(e).__name__}: {e}"[:500])


def read_host(host: Host, qemu_tid: int | None = None, accelerator: str | None = None) -> tuple[HostTiming, HypervisorTiming]:
    """The host's part and the hypervisor's (QEMU's options read from ``qemu_tid``'s process when given), in one
    command on ``host``; each with its ``error`` when that failed."""
    try:
        text = host.output(["sh", "-c", HOST_SCRIPT, "sh", "" if qemu_tid is None else str(int(qemu_tid))],
                           timeout=60)
        return parse_host(text), parse_hypervisor(text, accelerator, qemu_tid is not None)
    except Exception as e:  # noqa: BLE001 - recorded, not fatal: the timing environment describes the run
        error = f"{type(e).__name__}: {e}"[:500]
        return HostTiming(error=error), HypervisorTiming(accelerator, None, error if qemu_tid is not None else None)


def measure(guest: Host, hypervisor_host: Host, *, accelerator: str | None,
            qemu_tid: int | None) -> TimingEnvironment:
    """The whole timing environment: two commands, one in the sender guest, one on its hypervisor host."""
    host, hypervisor = read_host(hypervisor_host, qemu_tid, accelerator)
    return TimingEnvironment(read_guest(guest), host, hypervisor)


def qemu_thread(testbed) -> int | None:
    """A thread of the sender's QEMU on its hypervisor host without asking QMP: a local testbed's QEMU pid; None
    for a lab (its run passes a vCPU thread it found anyway)."""
    local = getattr(testbed, "local", None)
    pid = (local.qemu_pids or {}).get("sender") if local is not None else None
    return int(pid) if pid else None


def of_testbed(testbed, qemu_tid: int | None = None) -> TimingEnvironment:
    """:func:`measure` for ``testbed`` (a :class:`~bbrlab.testbed.roles.Testbed`): its sender, its hypervisor host,
    its accelerator, and ``qemu_tid`` (default :func:`qemu_thread`)."""
    return measure(testbed.sender.host, testbed.sender.hypervisor, accelerator=getattr(testbed, "accelerator", None),
                   qemu_tid=qemu_tid if qemu_tid is not None else qemu_thread(testbed))
