"""Local testbed: cold up (image build + boot), warm up (cached image), boot-to-SSH per VM, and the
unshaped iperf3 rate from the sender VM to the receiver namespace through the emulator VM.

The cold run builds into a temporary cache directory (so the machine's cached image is left
alone) and uses a testbed named ``bench``; everything is brought down at the end.
``BBRLAB_BENCH_COLD=0`` skips the cold run.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

NAME = "bench"
IPERF_PORT = 5291


def _timed_up(label: str) -> dict:
    import bbrlab.testbed as tbmod
    from bbrlab.testbed.local.state import State

    t0 = time.monotonic()
    tb = tbmod.up(NAME, progress=False)
    total_s = time.monotonic() - t0
    st = State.load(NAME).data
    boot = st.get("boot_to_ssh_s", {})
    print(f"{label}: up {total_s:.1f} s (accelerator {st['accelerator']}); boot to SSH: sender "
          f"{boot.get('sender')} s, emulator {boot.get('emulator')} s", flush=True)
    tb.close()
    return {"up_s": round(total_s, 1), "boot_to_ssh_s": boot, "accelerator": st["accelerator"]}


def _iperf_rate_mbit(duration_s: int = 10) -> float:
    import bbrlab.testbed as tbmod

    tb = tbmod.load(NAME)
    log = tempfile.NamedTemporaryFile(prefix="bench-iperf3-", suffix=".log", delete=False).name
    tb.receiver.host.spawn(["iperf3", "-s", "-1", "-p", str(IPERF_PORT)], log)
    deadline = time.monotonic() + 30
    while f":{IPERF_PORT} " not in tb.receiver.host.output(["ss", "-ltnH"]):
        if time.monotonic() > deadline:
            raise RuntimeError("iperf3 server did not start")
        time.sleep(0.2)
    out = tb.sender.host.output(["iperf3", "-c", tb.receiver.experiment_ip, "-p", str(IPERF_PORT),
                                 "-t", str(duration_s), "-J"], timeout=duration_s + 60)
    tb.close()
    os.unlink(log)
    return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6


def main() -> None:
    import bbrlab.testbed as tbmod
    from bbrlab.testbed.local import image

    results: dict = {}
    with tbmod.testbed_lock(NAME):
        tbmod.down(NAME, progress=False)
        try:
            if os.environ.get("BBRLAB_BENCH_COLD", "1") != "0":
                cold_cache = tempfile.mkdtemp(prefix="bbrlab-bench-cache-")
                saved = os.environ.get("XDG_CACHE_HOME")
                os.environ["XDG_CACHE_HOME"] = cold_cache
                try:
                    results["cold"] = _timed_up("cold (image build + KVM probe + boot)")
                    results["cold"]["image_build_s"] = image.cached_image().info["build_s"]
                    print(f"  of which image build: {results['cold']['image_build_s']} s")
                    tbmod.down(NAME, progress=False)
                finally:
                    if saved is None:
                        os.environ.pop("XDG_CACHE_HOME", None)
                    else:
                        os.environ["XDG_CACHE_HOME"] = saved
                    shutil.rmtree(cold_cache, ignore_errors=True)
            image.ensure_image()  # the machine's cache: built here only if it never was
            results["warm"] = _timed_up("warm (cached image)")
            rate = _iperf_rate_mbit()
            results["iperf3_unshaped_mbit"] = round(rate, 1)
            print(f"iperf3 sender -> receiver through the emulator, unshaped, 10 s: {rate:.0f} Mbit/s")
        finally:
            tbmod.down(NAME, progress=False)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
