"""Issue 35 item 8: a stop that ends with SIGKILL never kills a process that was handed the pid of the one
bbrlab started, once that one has ended on its own.

Each scenario runs in a PID namespace of its own (``unshare --pid --fork --mount-proc``), where nothing else
starts processes: the one bbrlab started (a progress poller, an iperf3 server, a sampler's wrapper) ends by
its own bound, the scenario reaps it (it is the namespace's init) and makes the kernel hand the same pid to a
new process (a "victim" in a session of its own, as bbrlab's processes are) through
``/proc/sys/kernel/ns_last_pid``. Then bbrlab's stop runs for real, as the ``with`` block ends; the victim
must still run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]

SCENARIO = textwrap.dedent("""
    import os, random, signal, subprocess, sys
    from bbrlab.core.hosts import LocalHost

    def reuse(pid):
        '''Reap ``pid`` (ended by its own bound), then start a victim that gets the same pid.'''
        os.waitpid(pid, 0)
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
        assert victim.pid == pid, (victim.pid, pid)
        return victim

    host = LocalHost()
    if sys.argv[1] == "poller":
        from bbrlab.run import progress
        with progress.poller(host, "/nonexistent", 100, 1) as p:
            victim = reuse(p.pid)
    elif sys.argv[1] == "sampler":  # the wrapper that writes the pid file, and the stop that reads it
        import tempfile
        from bbrlab.sampling import sampler
        folder = tempfile.mkdtemp()
        # The sampler lives 0.2 s: a victim started within the same clock tick (10 ms) as the process whose pid
        # it reuses has its start ticks too, and nothing can tell the two apart (a sampler of `true` did that).
        wrapper = subprocess.Popen(["sh", "-c", sampler._STREAMED, "bbrlab-sampler", f"{folder}/pid", "sleep",
                                    "0.2"], start_new_session=True)
        victim = reuse(wrapper.pid)
        subprocess.run(["sh", "-c", sampler._STOP, "bbrlab-stop", f"{folder}/stop", f"{folder}/pid"], check=True)
    else:
        from bbrlab.run import iperf
        port = random.randint(20000, 60000)
        with iperf.server(host, port=port, lifetime_s=1) as s:
            victim = reuse(s.pid)
    # A fatal signal fixes the exit status when it is sent: the first one sent decides it. SIGUSR2 from here
    # ends the victim as SIGUSR2 only when no stop signalled it before.
    victim.send_signal(signal.SIGUSR2)
    print("victim", "alive" if victim.wait() == -signal.SIGUSR2 else f"killed {victim.returncode}")
""")


@pytest.mark.parametrize("what", ["poller", "iperf3-server", "sampler"])
def test_a_stop_never_kills_the_process_a_reused_pid_names(what):
    out = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", SCENARIO, what],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "victim alive"
