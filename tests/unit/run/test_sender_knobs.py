"""The sender's module parameters and sysctls held for one run (issue #38): checked before anything changes, set,
read back, recorded, and put back on every exit, also when the run fails or the put back does.

The scripts run for real in bash, against files under a temporary directory that stand in for /sys and /proc.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bbrlab.core.commands import CommandError
from bbrlab.core.errors import ValidationError
from bbrlab.core.hosts import Host
from bbrlab.run import senderknobs
from bbrlab.run.runmeta import RunMetadata
from bbrlab.run.senderknobs import SenderKnobsError, module_of
from bbrlab.scenario.scenario import Contention, Flow, Link, Scenario

LIMIT = "/proc/sys/net/ipv4/tcp_limit_output_bytes"
SS_RATIO = "/proc/sys/net/ipv4/tcp_pacing_ss_ratio"
GAIN = "/sys/module/bbr2b/parameters/deficit_gain"
SHIFT = "/sys/module/bbr2b/parameters/deficit_ewma_shift"


class RootedHost(Host):
    """Runs commands in bash on this machine with /sys and /proc under ``root``; ``commands`` counts them;
    ``after`` maps a command's number to a hook given its output once it ran, which returns the output the caller
    sees (None: the connection was lost), as a kernel or a network might change it."""

    def __init__(self, root: Path):
        super().__init__("sender")
        self.root, self.commands, self.after = root, 0, {}

    def _execute(self, argv, *, timeout, stdin):
        self.commands += 1
        args = [f"{self.root}{a}" if a.startswith(("/sys/", "/proc/")) else a for a in argv]
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        out = self.after.get(self.commands, lambda text: text)(done.stdout.replace(str(self.root), ""))
        if out is None:
            return 255, "", "ssh: connection lost", False
        return done.returncode, out, done.stderr, False

    def _is_root(self):
        return True

    def file(self, path: str) -> Path:
        """The stand-in of ``path``."""
        return self.root / path.lstrip("/")

    def value(self, path: str) -> str:
        """What the stand-in of ``path`` holds."""
        return self.file(path).read_text().strip()


@pytest.fixture
def host(tmp_path):
    h = RootedHost(tmp_path)
    for path, value in ((LIMIT, "1048576"), (SS_RATIO, "200"), (GAIN, "739"), (SHIFT, "2")):
        h.file(path).parent.mkdir(parents=True, exist_ok=True)
        h.file(path).write_text(value + "\n")
    return h


def _scenario(cca="bbr2b", **knobs) -> Scenario:
    return Scenario(Link(rtt_ms=10, rate_mbit=100), Contention(1, 100), Flow(cca), **knobs)


def test_a_cca_is_found_in_its_module():
    assert module_of("cubic") == "tcp_cubic" and module_of("bbr") == "tcp_bbr"
    assert module_of("bbr2b") == "bbr2b" and module_of("bbr2b_g4") == "bbr2b_g4"


def test_values_are_set_read_back_recorded_and_restored(host):
    scenario = _scenario(cca_params={"deficit_gain": 512, "deficit_ewma_shift": 1},
                         sender_sysctls={"net.ipv4.tcp_limit_output_bytes": 262144})
    with senderknobs.held(host, scenario) as record:
        assert (host.value(GAIN), host.value(SHIFT), host.value(LIMIT)) == ("512", "1", "262144")
    assert (host.value(GAIN), host.value(SHIFT), host.value(LIMIT)) == ("739", "2", "1048576")
    assert host.value(SS_RATIO) == "200"  # not asked, not touched
    assert host.commands == 3  # read, set and read back, restore and read back
    assert record.module == "bbr2b"
    assert record.params["deficit_gain"] == senderknobs.KnobValue(512, "739", "512")
    assert record.sysctls["net.ipv4.tcp_limit_output_bytes"] == senderknobs.KnobValue(262144, "1048576", "262144")
    meta = RunMetadata(knobs=record).to_dict()
    assert meta["knobs"] == {"module": "bbr2b", "params": {
        "deficit_ewma_shift": {"asked": 1, "before": "2", "read": "1"},
        "deficit_gain": {"asked": 512, "before": "739", "read": "512"}},
        "sysctls": {"net.ipv4.tcp_limit_output_bytes": {"asked": 262144, "before": "1048576", "read": "262144"}}}
    assert RunMetadata.from_dict(meta).knobs == record


def test_a_run_without_knobs_records_none_of_them():
    assert "knobs" not in RunMetadata().to_dict()


def test_a_failing_run_still_gets_every_value_back(host):
    with pytest.raises(RuntimeError, match="the run broke"):
        with senderknobs.held(host, _scenario(sender_sysctls={"net.ipv4.tcp_pacing_ss_ratio": 300})):
            assert host.value(SS_RATIO) == "300"
            raise RuntimeError("the run broke")
    assert host.value(SS_RATIO) == "200"


def test_a_parameter_the_module_lacks_stops_the_run_before_anything_is_written(host):
    scenario = _scenario(cca_params={"deficit_gain": 512, "deficit_typo": 1},
                         sender_sysctls={"net.ipv4.tcp_limit_output_bytes": 262144})
    with pytest.raises(SenderKnobsError, match="module bbr2b has no parameter deficit_typo"):
        with senderknobs.held(host, scenario):
            pytest.fail("the block ran")
    assert host.commands == 1 and host.value(GAIN) == "739" and host.value(LIMIT) == "1048576"


def test_a_cubic_run_looks_for_its_parameters_in_tcp_cubic(host):
    with pytest.raises(SenderKnobsError, match="/sys/module/tcp_cubic/parameters/beta does not exist"):
        with senderknobs.held(host, _scenario("cubic", cca_params={"beta": 800})):
            pytest.fail("the block ran")


def test_bounds_are_checked_before_any_command():
    class NoCommands(Host):
        def _execute(self, argv, *, timeout, stdin):
            raise AssertionError(f"a command ran although the input was invalid: {argv}")

        def _is_root(self):
            return True

    with pytest.raises(ValidationError, match=r"cca_params.deficit_gain = 1024 .* 0 <= deficit_gain <= 1023"):
        with senderknobs.held(NoCommands("sender"), _scenario(cca_params={"deficit_gain": 1024})):
            pytest.fail("the block ran")
    with pytest.raises(ValidationError, match=r"sender_sysctls.net.ipv4.tcp_pacing_ss_ratio .*1000"):
        _scenario(sender_sysctls={"net.ipv4.tcp_pacing_ss_ratio": 1001})
    with pytest.raises(ValidationError, match="sender_qdiscs sets"):
        _scenario(sender_sysctls={"net.core.default_qdisc": 1})


def test_a_value_the_kernel_does_not_keep_fails_the_run_and_is_put_back(host):
    def clamped(out: str) -> str:  # as if the kernel kept another value than the one written
        host.file(GAIN).write_text("600\n")
        return out.replace(f"value:{GAIN}=512", f"value:{GAIN}=600")

    host.after[2] = clamped
    with pytest.raises(SenderKnobsError, match=r"deficit_gain asked 512, read back '600'"):
        with senderknobs.held(host, _scenario(cca_params={"deficit_gain": 512})):
            pytest.fail("the block ran")
    assert host.value(GAIN) == "739" and host.commands == 3


def test_a_write_whose_command_is_lost_puts_every_value_back(host):
    host.after[2] = lambda out: None  # the values were written, the answer never came
    with pytest.raises(CommandError):
        with senderknobs.held(host, _scenario(sender_sysctls={"net.ipv4.tcp_limit_output_bytes": 262144,
                                                              "net.ipv4.tcp_pacing_ss_ratio": 300})):
            pytest.fail("the block ran")
    assert host.value(LIMIT) == "1048576" and host.value(SS_RATIO) == "200"


def test_a_failed_restore_fails_a_good_run_and_is_noted_on_a_failed_one(host):
    host.after[3] = lambda out: None
    with pytest.raises(CommandError):
        with senderknobs.held(host, _scenario(cca_params={"deficit_gain": 512})):
            pass
    host.commands, host.after = 0, {3: lambda out: None}
    with pytest.raises(RuntimeError, match="the run broke") as e:
        with senderknobs.held(host, _scenario(cca_params={"deficit_gain": 512})):
            raise RuntimeError("the run broke")
    assert any("restoring the sender's module parameters and sysctls failed too" in n for n in e.value.__notes__)


def test_a_boolean_parameter_reads_back_as_y_or_n():
    assert senderknobs._reads_as("Y", 1) and senderknobs._reads_as("N", 0) and senderknobs._reads_as("512", 512)
    assert not senderknobs._reads_as("Y", 0) and not senderknobs._reads_as("", 0) and not senderknobs._reads_as("x", 1)
