"""Two network namespaces of this host joined by a veth pair, for tests that need a real flow but no VM."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from bbrlab.core.hosts import NetnsHost


@dataclass(frozen=True)
class VethPair:
    """The sender's and the receiver's namespace (as hosts) and the sender's end of the veth."""

    sender: NetnsHost
    receiver: NetnsHost
    sender_if: str


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def veth_pair(tag: str, sender_ip: str, receiver_ip: str) -> Iterator[VethPair]:
    """Namespaces ``bbt<tag>a-<random>`` (sender, ``sender_ip``/24) and ``bbt<tag>b-<random>`` (receiver,
    ``receiver_ip``/24), links and loopbacks up; both are deleted afterwards, whatever happens."""
    rand = uuid.uuid4().hex[:6]
    a, b = f"bbt{tag}a-{rand}", f"bbt{tag}b-{rand}"
    va, vb = f"v{tag}a{rand}", f"v{tag}b{rand}"
    _ip("netns", "add", a)
    try:
        _ip("netns", "add", b)
        _ip("link", "add", va, "type", "veth", "peer", "name", vb)
        _ip("link", "set", va, "netns", a)
        _ip("link", "set", vb, "netns", b)
        _ip("-n", a, "addr", "add", f"{sender_ip}/24", "dev", va)
        _ip("-n", b, "addr", "add", f"{receiver_ip}/24", "dev", vb)
        for ns, dev in ((a, va), (b, vb)):
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield VethPair(NetnsHost(name="sender", netns=a), NetnsHost(name="receiver", netns=b), va)
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
