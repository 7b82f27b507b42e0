"""Local commands honour Ctrl-C, and a user's invoke/fabric configuration has no effect (real processes).

Each test runs a small Python program as a subprocess, so that a SIGINT goes to it alone and a HOME
with planted configuration files is its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.polling import wait_for

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]

RUN_AND_REPORT = textwrap.dedent("""
    import sys, time
    from bbrlab.core.hosts import LocalHost
    t0 = time.monotonic()
    try:
        LocalHost().run(sys.argv[1:], timeout=None)
    except KeyboardInterrupt:
        print(f"KeyboardInterrupt {time.monotonic() - t0:.1f}", flush=True)
        sys.exit(42)
    print(f"returned {time.monotonic() - t0:.1f}", flush=True)
""")


def _descendants(pid: int) -> set[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = {c for c, parent in parents.items() if parent == p}
        found |= kids
        todo.extend(kids)
    return found


@pytest.mark.parametrize("argv, within_s", [
    (["sleep", "60"], 5.0),
    # ignores SIGINT, and its child keeps the output pipe open: stopped by SIGKILL to the whole group
    (["sh", "-c", "trap '' INT; sleep 60; echo done"], 10.0),
])
def test_sigint_stops_a_local_command_and_raises_keyboard_interrupt(argv, within_s):
    proc = subprocess.Popen([sys.executable, "-c", RUN_AND_REPORT, *argv], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)
    try:
        sleepers = wait_for(lambda: {p for p in _descendants(proc.pid)
                                     if Path(f"/proc/{p}/comm").read_text().strip() == "sleep"},
                            "the command to start", 20.0)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)  # to the Python process only, as `kill -INT` would
        out, _ = proc.communicate(timeout=within_s + 30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 42, out
    assert out.startswith("KeyboardInterrupt")
    assert took < within_s, f"took {took:.1f} s"
    wait_for(lambda: not any(_alive(p) for p in sleepers), "the command's processes to end", 5.0)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its new parent to reap it is not running)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_timeout_kills_the_commands_children_too():
    code = ("from bbrlab.core.commands import CommandTimeout\nfrom bbrlab.core.hosts import LocalHost\n"
            "try:\n    LocalHost().run(['sh', '-c', 'sleep 60 & sleep 60; wait'], timeout=1)\n"
            "except CommandTimeout:\n    print('timeout')\n")
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, cwd=ROOT)
    assert res.stdout.strip() == "timeout", res.stderr
    assert time.monotonic() - t0 < 15


@pytest.fixture
def planted_home(tmp_path):
    """A HOME whose invoke, fabric and ssh configuration would make bbrlab dry-run, echo, forward the
    agent and go through a dead gateway, if it were read."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".invoke.yaml").write_text("run:\n  dry: true\n  echo: true\n  warn: false\n")
    (home / ".fabric.yaml").write_text("run:\n  dry: true\nforward_agent: true\ngateway: 'nc 127.0.0.1 9'\n"
                                       "load_ssh_configs: true\nconnect_kwargs: {allow_agent: true}\n")
    (home / ".ssh" / "config").write_text("Host *\n  ProxyCommand false\n  Port 1\n  ForwardAgent yes\n")
    return home


def _in_home(home: Path, code: str, **env) -> subprocess.CompletedProcess:
    environ = {**os.environ, "HOME": str(home), "INVOKE_RUN_DRY": "1", "INVOKE_RUN_ECHO": "1", **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=environ,
                          cwd=ROOT)


def test_user_invoke_configuration_does_not_change_local_commands(planted_home, tmp_path):
    marker = tmp_path / "ran"
    res = _in_home(planted_home, f"from bbrlab.core.hosts import LocalHost\n"
                                 f"print(repr(LocalHost().output(['sh', '-c', 'touch {marker}; echo hi'])))\n")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "'hi'" and marker.exists()  # really ran, and echoed nothing extra


def test_user_fabric_configuration_is_not_read(planted_home):
    code = ("from bbrlab.core.commands import fabric_config, invoke_config\n"
            "c = fabric_config(); i = invoke_config()\n"
            "print(c.run.dry, c.forward_agent, c.gateway, c.load_ssh_configs, dict(c.connect_kwargs), i.run.dry,"
            " i.run.echo, len(c.base_ssh_config.get_hostnames()))\n")
    res = _in_home(planted_home, code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "False", "None", "False", "{}", "False", "False", "0"]


@pytest.mark.testbed
def test_ssh_to_the_testbed_ignores_the_users_fabric_and_ssh_files(testbed, planted_home, tmp_path):
    """A real SSH session to the sender with an agent running: no agent forwarded, no gateway, no dry run."""
    agent = subprocess.run(["ssh-agent", "-a", str(tmp_path / "agent.sock")], capture_output=True, text=True,
                           timeout=30)
    assert agent.returncode == 0, agent.stderr
    pid = int(agent.stdout.split("SSH_AGENT_PID=")[1].split(";")[0])
    try:
        spec = testbed.sender.spec.ssh
        code = ("from bbrlab.core.hosts import SSHHost\n"
                f"h = SSHHost(name='sender', address={spec.address!r}, port={spec.port}, key_path={spec.key!r}, "
                f"known_hosts={spec.known_hosts!r})\n"
                "print(h.output(['sh', '-c', 'echo ran ${SSH_AUTH_SOCK:-no-agent}']))\nh.close()\n")
        res = _in_home(planted_home, code, SSH_AUTH_SOCK=str(tmp_path / "agent.sock"))
    finally:
        os.kill(pid, signal.SIGTERM)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ran no-agent"


def test_a_campaigns_signal_handling_also_stops_a_local_command():
    """Inside bbrlab.core.signals.interruptible() (a campaign) SIGINT raises Interrupted, not KeyboardInterrupt:
    the command's group is stopped before the exception unwinds (invoke would wait for its output pipes)."""
    code = textwrap.dedent("""
        import sys, time
        from bbrlab.core.hosts import LocalHost
        from bbrlab.core.signals import Interrupted, interruptible
        t0 = time.monotonic()
        try:
            with interruptible():
                LocalHost().run(["sh", "-c", "trap '' INT; sleep 60; echo done"], timeout=None)
        except Interrupted:
            print(f"Interrupted {time.monotonic() - t0:.1f}", flush=True)
            sys.exit(43)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        sleepers = wait_for(lambda: {p for p in _descendants(proc.pid)
                                     if Path(f"/proc/{p}/comm").read_text().strip() == "sleep"},
                            "the command to start", 20.0)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 43 and out.startswith("Interrupted"), out
    assert time.monotonic() - t0 < 10
    wait_for(lambda: not any(_alive(p) for p in sleepers), "the command's processes to end", 5.0)
