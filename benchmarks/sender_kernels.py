"""Sender kernels: what switching the sender's kernel costs on the local testbed.

Brings a testbed named ``benchk`` up on ``debian-6.1``, then switches its sender to each Debian
kernel and back, and prints per kernel: the sender-only reboot (stop, new tap, boot, SSH, ping),
boot to SSH, the bbr2b build+load that follows, one CCA identity probe, and the ratio of the boot
to debian-6.1's (Debian's initramfs against bbrlab's small one). Boot files and packages come
from the cache (first-time costs are printed by the first ``up`` when they are built). Everything
is brought down at the end.
"""

from __future__ import annotations

import time

NAME = "benchk"
KERNELS = ("debian-5.10", "debian-6.12", "debian-6.1")


def main() -> None:
    import bbrlab.testbed as tbmod
    from bbrlab.kernel.ccaprobe import probe_ccas
    from bbrlab.testbed.local.state import State

    rows = []
    with tbmod.testbed_lock(NAME):
        tbmod.down(NAME, progress=False)
        try:
            tbmod.up(NAME, progress=False, load_bbr2b=False).close()
            for kernel in KERNELS:
                tbmod.check_kernel(kernel, need_bbr2b=True)  # downloads and checks outside the timing
                t0 = time.monotonic()
                tb = tbmod.up(NAME, progress=False, kernel=kernel, load_bbr2b=False)
                up_s = time.monotonic() - t0
                state = State.load(NAME).data
                t1 = time.monotonic()
                tbmod._load_bbr2b(tb, tbmod.check_kernel(kernel), progress=False)
                bbr2b_s = time.monotonic() - t1
                t2 = time.monotonic()
                probe_ccas(tb.sender.host)
                probe_s = time.monotonic() - t2
                rows.append({"kernel": kernel, "release": tb.sender.host.output(["uname", "-r"]),
                             "up_s": up_s, "reboot_s": state.get("sender_reboot_s"),
                             "boot_to_ssh_s": state["boot_to_ssh_s"]["sender"], "bbr2b_s": bbr2b_s,
                             "probe_s": probe_s})
                tb.close()
        finally:
            tbmod.down(NAME, progress=False)
    base = next(r for r in rows if r["kernel"] == "debian-6.1")["boot_to_ssh_s"]
    print(f"{'kernel':<12} {'release':<22} {'up (s)':>7} {'reboot':>7} {'boot->SSH':>9} {'vs 6.1':>7} "
          f"{'bbr2b':>6} {'probe':>6}")
    for r in rows:
        print(f"{r['kernel']:<12} {r['release']:<22} {r['up_s']:7.1f} {r['reboot_s']:7.1f} {r['boot_to_ssh_s']:9.1f} "
              f"{r['boot_to_ssh_s'] / base:7.2f} {r['bbr2b_s']:6.1f} {r['probe_s']:6.1f}")
    print("(TCG, shared 2-core machine: other work on it moves these numbers)")
