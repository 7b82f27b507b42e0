"""Host plumbing of the local testbed: network namespaces, a bridge and tap devices (pyroute2).

Experiment links never touch the root namespace. Each tap is created INSIDE its namespace: this
process enters the namespace, opens ``/dev/net/tun`` there (the tap belongs to the namespace of
the opener), returns, and hands the open descriptor to QEMU (``-netdev tap,fd=N``). The tap lives
exactly as long as QEMU holds it, and deleting a namespace deletes whatever is left in it.

Layout (``<tb>`` is the testbed name)::

    sender eth1 == tap-s --[br-a in bbrlab-<tb>-link]-- tap-ea == emulator eth1
    emulator eth2 == rx0 (in bbrlab-<tb>-rx, carries the receiver's address)
    competitor comp0 == vcomp --[br-a]   (bbrlab-<tb>-comp, made for runs with competitor flows)
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

from pyroute2 import IPRoute, netns

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000


def link_netns(testbed: str) -> str:
    """The namespace holding the sender<->emulator bridge."""
    return f"bbrlab-{testbed}-link"


def receiver_netns(testbed: str) -> str:
    """The namespace that is the receiver (iperf3 server) of the local testbed."""
    return f"bbrlab-{testbed}-rx"


def netns_exists(name: str) -> bool:
    """True when the network namespace ``name`` exists."""
    return name in netns.listnetns()


def create_netns(name: str) -> None:
    """Create ``name`` (idempotent) with its loopback up."""
    if not netns_exists(name):
        netns.create(name)
    with IPRoute(netns=name) as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")


def remove_netns(name: str) -> bool:
    """Delete ``name`` and everything still in it; False when it did not exist."""
    if not netns_exists(name):
        return False
    netns.remove(name)
    return True


def open_tap(ns: str, ifname: str) -> int:
    """Create tap ``ifname`` inside namespace ``ns``; return its descriptor (inheritable, for QEMU).

    The tap uses virtio-net headers (``IFF_VNET_HDR``) so offloads (TSO/GSO) pass between the
    guests, as on the paper's hypervisor.
    """
    netns.pushns(ns)
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR)
    finally:
        netns.popns()
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", ifname.encode(), IFF_TAP | IFF_NO_PI | IFF_VNET_HDR))
    except OSError:
        os.close(fd)
        raise
    os.set_inheritable(fd, True)
    return fd


def make_bridge(ns: str, bridge: str, ports: list[str]) -> None:
    """Bridge ``ports`` (already in ``ns``) under ``bridge``; no STP, no forwarding delay."""
    with IPRoute(netns=ns) as ipr:
        if not ipr.link_lookup(ifname=bridge):
            ipr.link("add", ifname=bridge, kind="bridge", br_stp_state=0, br_forward_delay=0)
        br = ipr.link_lookup(ifname=bridge)[0]
        for port in ports:
            idx = ipr.link_lookup(ifname=port)[0]
            ipr.link("set", index=idx, master=br, state="up")
        ipr.link("set", index=br, state="up")


def set_address(ns: str, ifname: str, address: str, prefix_len: int) -> None:
    """Give ``ifname`` in ``ns`` an IPv4 address (idempotent) and bring it up."""
    with IPRoute(netns=ns) as ipr:
        idx = ipr.link_lookup(ifname=ifname)[0]
        try:
            ipr.addr("add", index=idx, address=address, prefixlen=prefix_len)
        except Exception as e:  # pyroute2 raises NetlinkError(EEXIST) for an existing address
            if getattr(e, "code", None) != errno.EEXIST:
                raise
        ipr.link("set", index=idx, state="up")


def link_address(ns: str, ifname: str) -> str | None:
    """The MAC address of ``ifname`` in ``ns`` (None when there is no such interface)."""
    with IPRoute(netns=ns) as ipr:
        found = ipr.link_lookup(ifname=ifname)
        return ipr.get_links(found[0])[0].get_attr("IFLA_ADDRESS") if found else None


def set_link_address(ns: str, ifname: str, address: str) -> None:
    """Give ``ifname`` in ``ns`` the MAC address ``address`` (a tap made anew keeps its predecessor's, so the
    peers' neighbour caches stay right)."""
    with IPRoute(netns=ns) as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0], address=address)


def interface_names(ns: str) -> list[str]:
    """The names of the interfaces in network namespace ``ns``, sorted."""
    with IPRoute(netns=ns) as ipr:
        return sorted(link.get("ifname") for link in ipr.get_links())


#: The competitor's end of its veth pair (in its namespace), the bridge's end (in the link namespace), and
#: its address on the experiment subnet (the sender is .1, the receiver .2).
COMPETITOR_IFNAME, COMPETITOR_PEER, COMPETITOR_IP = "comp0", "vcomp", "10.77.0.3"


def competitor_netns(testbed: str) -> str:
    """The namespace of the local testbed's uncontended competitor sender (docs/competition.md)."""
    return f"bbrlab-{testbed}-comp"


def ensure_competitor(testbed: str, prefix_len: int, bridge: str = "br-a") -> str:
    """Make (idempotently) the competitor: a namespace whose veth ``comp0`` (:data:`COMPETITOR_IP`) is
    bridged, through its peer ``vcomp``, to the sender's side of the emulator (``bridge`` in the link
    namespace); the namespace's name. Deleting the link namespace or this one removes the pair."""
    ns, link_ns = competitor_netns(testbed), link_netns(testbed)
    create_netns(ns)
    with IPRoute(netns=link_ns) as ipr:
        if not ipr.link_lookup(ifname=COMPETITOR_PEER):
            ipr.link("add", ifname=COMPETITOR_PEER, kind="veth", peer=COMPETITOR_IFNAME)
        stray = ipr.link_lookup(ifname=COMPETITOR_IFNAME)
        if stray:  # a fresh pair's other end starts here: move it into the competitor's namespace
            ipr.link("set", index=stray[0], net_ns_fd=ns)
    make_bridge(link_ns, bridge, [COMPETITOR_PEER])
    set_address(ns, COMPETITOR_IFNAME, COMPETITOR_IP, prefix_len)
    return ns
