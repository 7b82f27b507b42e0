"""The kernel's limits of tbf, measured on this machine's kernel, agree with what Link refuses.

Beyond the limits tc either refuses (a limit above 2^32 - 1 bytes) or, worse, silently installs
something else (a burst whose time at the rate exceeds 2^32 psched ticks comes back truncated). A Link
that validation accepts must come back from the kernel as asked; one it refuses is out of range.
"""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from bbrlab.core.errors import ValidationError
from bbrlab.link.qdisc import build_tree, node_argv
from bbrlab.scenario.scenario import Link

pytestmark = pytest.mark.system


@pytest.fixture
def ns():
    name = f"bbrlab-ql-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "add", "vsnd", "type", "veth", "peer", "name", "vrcv"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


def _tbf_as_kernel_has_it(ns: str, link: Link) -> tuple[int, dict | None]:
    """Install the link's tbf (as the data port's only qdisc) with tc; (tc's exit code, tbf read back)."""
    tree = build_tree(link, ("vsnd", "vrcv"))
    tbf = tree.data.find("tbf")
    argv = node_argv("vrcv", type(tbf)(handle="bb:", parent="root", qdisc=tbf.qdisc))
    res = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True)
    shown = json.loads(subprocess.run(["ip", "netns", "exec", ns, "tc", "-raw", "-j", "qdisc", "show", "dev", "vrcv"],
                                      check=True, capture_output=True, text=True).stdout)
    subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "vrcv", "root"], capture_output=True)
    return res.returncode, next((q for q in shown if q["kind"] == "tbf"), None)


def _unchecked(**kw) -> Link:
    """A Link built without validation, to hand the kernel what validation refuses."""
    link = object.__new__(Link)
    for f in Link.__dataclass_fields__.values():
        object.__setattr__(link, f.name, kw.get(f.name, f.default))
    return link


def test_a_burst_time_within_the_limit_comes_back_as_asked(ns):
    link = Link(rtt_ms=20, rate_mbit=0.00045, buffer_bdp=None, buffer_bytes=4000)  # 450 bit/s: the 15140-byte bucket drains in 269 s
    code, tbf = _tbf_as_kernel_has_it(ns, link)
    asked = build_tree(link, ("vsnd", "vrcv")).data.find("tbf").qdisc.burst_bytes
    assert code == 0 and abs(tbf["options"]["burst"] - asked) <= 0.001 * asked  # tc rounds through ticks


def test_a_burst_time_beyond_the_limit_is_refused_because_the_kernel_would_truncate_it(ns):
    kw = {"rtt_ms": 20, "rate_mbit": 0.00043}  # 430 bit/s: 282 s, beyond 2^32 ticks of 1/15.625 us
    with pytest.raises(ValidationError, match="rate_mbit"):
        Link(**kw)
    code, tbf = _tbf_as_kernel_has_it(ns, _unchecked(**kw))
    assert code == 0 and tbf["options"]["burst"] < 0.5 * 15140  # tc accepted it and installed a much smaller bucket


def test_a_queue_beyond_32_bits_is_refused_like_tc_refuses_it(ns):
    kw = {"rtt_ms": 1000, "rate_mbit": 40000}
    with pytest.raises(ValidationError, match="buffer_bdp"):
        Link(**kw)
    code, tbf = _tbf_as_kernel_has_it(ns, _unchecked(**kw))
    assert code != 0 and tbf is None
    code, tbf = _tbf_as_kernel_has_it(ns, Link(rtt_ms=800, rate_mbit=40000))  # 4e9 bytes: just fits
    assert code == 0 and tbf["options"]["limit"] == 4_000_000_000
