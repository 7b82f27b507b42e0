"""The testbed: a sender VM (and the hypervisor host running it), an emulator, a receiver.

One API for the local testbed on this machine and for a real lab described by a testbed file::

    import bbrlab.testbed as testbed
    tb = testbed.up()                        # local: build/boot (or reuse) and return a Testbed
    tb = testbed.up(kernel="debian-5.10")    # the same testbed, its sender rebooted into Debian 11's kernel
    testbed.sender_kernel(tb)                # SenderKernel: release, origin, package/version or path+sha256
    tb.sender.host.run(["uname", "-r"])
    tb.sender.vcpu_threads()                 # for SCHED_DEADLINE, from QMP
    testbed.status(tb)                       # reachability, kernels, CCAs, qdiscs, QEMU pid, accel
    testbed.down()                           # stop VMs, remove namespaces/taps/bridges
    tb = testbed.load("lab.yaml")            # a lab (or a running local testbed by name)

May import: ``bbrlab.core``, ``bbrlab.scenario``, ``bbrlab.kernel``, ``bbrlab.sampling``, ``bbrlab.contention``. Never ``link``, ``run``,
``campaign``, ``analysis``, ``cli``.
"""

from __future__ import annotations

from pathlib import Path

from bbrlab.core.errors import TestbedError
from bbrlab.kernel.sender import DEFAULT_KERNEL, ResolvedKernel, SenderKernel

from .file import TestbedSpec, load_file
from .lock import image_lock, lock_path, testbed_lock
from .roles import EmulatorRole, LocalDetails, Role, SenderRole, Testbed, from_spec

__all__ = ["Testbed", "LocalDetails", "Role", "SenderRole", "EmulatorRole", "TestbedSpec", "SenderKernel",
           "DEFAULT_KERNEL", "up", "down", "load", "status", "load_file", "testbed_lock", "image_lock", "lock_path",
           "check_kernel", "check_campaign_kernels", "sender_kernel", "reboot"]


def up(name: str = "local", sender_vcpus: int = 1, progress: bool = True, load_bbr2b: bool = True,
       kernel: str | Path = DEFAULT_KERNEL) -> Testbed:
    """Bring the local testbed ``name`` up (idempotent: a running one is reused) and return it.

    ``kernel`` is the sender's kernel: ``debian-6.1`` (default, the guest image's), ``debian-5.10``,
    ``debian-6.12``, or a path to a kernel directory or linux-image .deb (see
    :mod:`bbrlab.kernel.sender`); it is checked before anything boots. A running testbed with the same
    sender is reused; one whose sender runs another kernel (or vCPU count) reboots only the sender.

    With ``load_bbr2b`` the patched BBR (``bbr2b``, see ``kernels/``) is built on this machine against the
    sender kernel's headers (cached) and loaded in the sender beside stock ``bbr``. When that cannot be
    done the testbed still comes up, with a warning: runs of ``bbr2b`` then fail their CCA check (use
    :func:`check_kernel` with ``need_bbr2b=True`` before a campaign to refuse such a kernel early).

    The socket samplers (:mod:`bbrlab.sampling.sockdiag`) are built (cached) and put into the sender too, so no run
    copies them. They are copied rather than baked into the guest image: an image recipe that hashed their
    sources would rebuild the image (minutes) at every change of a sampler, and branches with different
    samplers would prune each other's images. A sampled run checks the SHA-256 of its copy anyway.
    """
    from .local import lifecycle
    from .local.state import check_name

    check_name(name)
    lifecycle.check_vcpus(sender_vcpus)
    with testbed_lock(name):
        resolved = check_kernel(kernel, progress=progress)
        lifecycle.up(name, sender_vcpus=sender_vcpus, progress=progress, kernel=resolved)
    tb = load(name)
    if load_bbr2b:
        _load_bbr2b(tb, resolved, progress)
    _install_samplers(tb, progress)
    return tb


def reboot(name: str = "local", *, sender: bool = True, emulator: bool = False, progress: bool = True,
           sender_vcpus: int | None = None) -> Testbed:
    """Boot the running local testbed ``name``'s sender (and with ``emulator`` its emulator) afresh, into the
    kernel it runs now, and return the testbed: a campaign's block of repetitions starts on a boot of its own
    (:mod:`bbrlab.campaign.blocks`), a campaign's vCPU count its own (``sender_vcpus``: the sender's vCPUs from
    this boot on; None: as many as it had). The namespaces, taps and bridges stay. The sender gets bbr2b and the
    samplers again, as :func:`up` gives them."""
    from .local import lifecycle
    from .local import reboot as rebooting
    from .local.state import check_name

    check_name(name)
    if sender_vcpus is not None:
        lifecycle.check_vcpus(sender_vcpus)
    with testbed_lock(name):
        resolved = rebooting.reboot(name, sender=sender, emulator=emulator, progress=progress,
                                    sender_vcpus=sender_vcpus)
    tb = load(name)
    if sender:
        _load_bbr2b(tb, resolved, progress)
    _install_samplers(tb, progress)
    return tb


def check_kernel(kernel: str | Path = DEFAULT_KERNEL, *, need_bbr2b: bool = False,
                 progress: bool = False) -> ResolvedKernel:
    """Resolve and check a sender kernel without booting it (downloads and caches a Debian one).

    Raises :class:`~bbrlab.core.errors.ValidationError` (field ``kernel``) for a bad name or path, a file
    that is not a bzImage, or a kernel without virtio/ext4/fw_cfg/inet_diag/tcp_diag; with
    ``need_bbr2b`` also :class:`bbrlab.kernel.bbr2b.Bbr2bUnavailable` when bbr2b cannot be had for it.
    The call a campaign makes for each of its kernels before its first run.
    """
    import sys

    from bbrlab.kernel.bbr2b import check_bbr2b

    from .local import lifecycle

    def say(message: str) -> None:
        if progress:
            print(message, file=sys.stderr, flush=True)

    resolved = lifecycle.resolve_sender_kernel(kernel, say)
    if need_bbr2b:
        check_bbr2b(resolved, say)
    return resolved


def check_campaign_kernels(tb: Testbed, kernels, ccas) -> list[ResolvedKernel]:
    """Before a campaign with a ``kernels:`` dimension: every kernel resolves, has what the testbed needs and,
    when ``bbr2b`` is among ``ccas``, can have bbr2b; the testbed is a local one. Raises before any run."""
    from bbrlab.core.errors import ValidationError

    if kernels and tb.kind != "local":
        raise ValidationError("kernels", list(kernels), "absent for a lab testbed (its sender's kernel is the "
                              "lab's own); the local testbed boots the kernels it is given")
    return [check_kernel(k, need_bbr2b="bbr2b" in ccas) for k in kernels]


def sender_kernel(tb: Testbed | str = "local") -> SenderKernel:
    """The kernel the local testbed's sender was booted with (``metadata.kernel`` of its runs)."""
    local = (tb if isinstance(tb, Testbed) else load(tb)).local
    if local is None or local.sender_kernel_identity is None:
        raise TestbedError("this testbed records no sender kernel (a lab testbed, or one started before kernels "
                           "were recorded: bring it up again)")
    return local.sender_kernel_identity


def _install_samplers(tb: Testbed, progress: bool) -> None:
    import sys

    from bbrlab.core.errors import BbrlabError
    from bbrlab.sampling import sockdiag

    for kind in sockdiag.KINDS:
        try:
            deployed = sockdiag.ensure_on_host(tb.sender.host, kind=kind)
        except BbrlabError as e:
            print(f"bbrlab: warning: the {kind} sampler is not in the sender: {e}", file=sys.stderr)
            continue
        if progress and deployed.copied:
            print(f"{kind} sampler copied to the sender ({deployed.path}, sha256 {deployed.sha256[:12]})", flush=True)
    try:  # the bottleneck queue's sampler (bbrlab.sampling.bottleneck); a run copies it too when missing
        deployed = sockdiag.ensure_on_host(tb.emulator.host, kind="qdisc")
    except BbrlabError as e:
        print(f"bbrlab: warning: the qdisc sampler is not in the emulator: {e}", file=sys.stderr)
        return
    if progress and deployed.copied:
        print(f"qdisc sampler copied to the emulator ({deployed.path}, sha256 {deployed.sha256[:12]})", flush=True)


def _load_bbr2b(tb: Testbed, resolved: ResolvedKernel, progress: bool) -> None:
    import sys

    from bbrlab.core.errors import BbrlabError
    from bbrlab.kernel.bbr2b import ensure_bbr2b_for

    try:
        ident = ensure_bbr2b_for(tb.sender.host, resolved)
    except BbrlabError as e:
        print(f"bbrlab: warning: bbr2b not loaded in the sender: {e}", file=sys.stderr)
        return
    if progress:
        print(f"bbr2b loaded in the sender (srcversion {ident.get('srcversion')}, "
              f"patch {str(ident.get('patch_sha256'))[:12]})", flush=True)


def down(name: str = "local", progress: bool = True) -> dict:
    """Stop and remove everything the local testbed ``name`` created (idempotent)."""
    from .local import lifecycle

    with testbed_lock(name):
        return lifecycle.down(name, progress=progress)


def load(name_or_file: str | Path = "local") -> Testbed:
    """Attach to a running local testbed by name, or read a lab's testbed file (a path)."""
    from .local import lifecycle
    from .local.state import State
    from .target import is_testbed_file

    text = str(name_or_file)
    if is_testbed_file(text):
        return from_spec(load_file(text))
    path = lifecycle.testbed_file(text)
    state = State.load(text)
    if not path.is_file() or state is None or state.phase != "up":
        raise TestbedError(f"the local testbed '{text}' is not up (run: bbrlab testbed up"
                           f"{'' if text == 'local' else ' --name ' + text})")
    d = state.data
    identity = SenderKernel.from_dict(d["sender_kernel"]) if d.get("sender_kernel") else None
    local = LocalDetails(image=d.get("image"), guest_kernel=d.get("guest_kernel"),
                         sender_vcpus=d.get("sender_vcpus"), boot_to_ssh_s=d.get("boot_to_ssh_s") or {},
                         sender_kernel_identity=identity,
                         qemu_pids={role: vm.get("pid") for role, vm in state.vms.items()})
    qemu = f"QEMU {d['qemu_version']}" if d.get("qemu_version") else None
    return from_spec(load_file(path), kind="local", hypervisor_name=qemu, local=local)


def status(tb: Testbed | str | Path = "local") -> dict:
    """Each role measured now: reachable, kernel, congestion controls, qdiscs; sender's QEMU."""
    from .report import testbed_status

    return testbed_status(tb if isinstance(tb, Testbed) else load(tb))
