"""Run on a sender (python3-minimal: no json; as root): what each congestion control is.

Prints one line per congestion control, tab-separated ``key=value`` fields. For every name in
/proc/sys/net/ipv4/tcp_available_congestion_control:

- owner module: a fresh socket is switched to the built-in ``reno`` (which never holds a module),
  the module reference counts are read, the socket is switched to the CCA, and the counts are read
  again; the kernel takes a reference on the CCA's module for every socket using it, so the one
  module whose count rose owns it (none: built in). Needs an otherwise idle machine.
- BBR version: the socket is connected over loopback and asked for its congestion-control info
  with one exact inet_diag netlink request. A BBR-family CCA answers with an INET_DIAG_BBRINFO
  attribute: mainline BBR (v1) with the 20-byte struct tcp_bbr_info, Google's v2alpha and v3 with
  the extended struct whose byte 39 is ``bbr_version`` (2 or 3).
- patched: the owner module carries bbrlab's ``bbrlab_patch_sha256`` modinfo field; the module
  file is taken from bbrlab's record (/var/lib/bbrlab/modules/<module>.json) or from the modules
  tree (modinfo), and only when its srcversion equals the loaded module's.
"""
import os
import re
import socket
import struct
import subprocess

TCP_CONGESTION = 13
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
INET_DIAG_INFO, INET_DIAG_VEGASINFO, INET_DIAG_CONG = 2, 3, 4
INET_DIAG_BBRINFO = 16
INET_DIAG_NOCOOKIE = 0xFFFFFFFF
BBR1_INFO_BYTES = 20
BBR_VERSION_OFFSET = 39
RECORD_DIR = "/var/lib/bbrlab/modules"


def refcounts():
    out = {}
    for mod in os.listdir("/sys/module"):
        try:
            with open(f"/sys/module/{mod}/refcnt") as f:
                out[mod] = int(f.read())
        except (OSError, ValueError):
            pass
    return out


def owner(cca):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, b"reno")
        before = refcounts()
        s.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, cca.encode())
        after = refcounts()
    finally:
        s.close()
    rose = sorted(m for m, n in after.items() if n > before.get(m, n))
    return rose[0] if len(rose) == 1 else None, rose


def diag_attrs(sport, dport):
    """Attributes {type: bytes} of the exact loopback socket sport -> dport."""
    ext = (1 << (INET_DIAG_INFO - 1)) | (1 << (INET_DIAG_VEGASINFO - 1)) | (1 << (INET_DIAG_CONG - 1))
    lo = socket.inet_aton("127.0.0.1") + bytes(12)
    sockid = struct.pack("!HH", sport, dport) + lo + lo + struct.pack("=III", 0, INET_DIAG_NOCOOKIE,
                                                                       INET_DIAG_NOCOOKIE)
    req = struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, ext, 0, 0xFFFFFFFF) + sockid
    msg = struct.pack("=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + req
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
    try:
        nl.sendto(msg, (0, 0))
        data = nl.recv(65536)
    finally:
        nl.close()
    length, mtype = struct.unpack_from("=IH", data, 0)
    if mtype == NLMSG_ERROR:
        (err,) = struct.unpack_from("=i", data, 16)
        raise OSError(-err, f"inet_diag: {os.strerror(-err)}")
    attrs, pos = {}, 16 + 72  # nlmsghdr, struct inet_diag_msg
    while pos + 4 <= length:
        alen, atype = struct.unpack_from("=HH", data, pos)
        if alen < 4:
            break
        attrs[atype] = data[pos + 4:pos + alen]
        pos += (alen + 3) & ~3
    return attrs


def cc_info(cca, port):
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        c.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, cca.encode())
        c.connect(("127.0.0.1", port))
        attrs = diag_attrs(c.getsockname()[1], port)
    finally:
        c.close()
    cong = attrs.get(INET_DIAG_CONG, b"").split(b"\0")[0].decode()
    bbr = attrs.get(INET_DIAG_BBRINFO)
    version = None
    if bbr is not None:
        version = 1 if len(bbr) == BBR1_INFO_BYTES else (bbr[BBR_VERSION_OFFSET] if len(bbr) > BBR_VERSION_OFFSET
                                                         else None)
    return cong, (len(bbr) if bbr is not None else 0), version


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def modinfo(target, field):
    p = subprocess.run(["modinfo", "-F", field, target], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else ""


def patch_identity(mod):
    """(patch sha256 or None, srcversion) of the loaded module ``mod``, from a file proven to be it."""
    live = read(f"/sys/module/{mod}/srcversion")
    record = dict(re.findall(r'"(srcversion|patch_sha256)":\s*"([^"]*)"', read(f"{RECORD_DIR}/{mod}.json")))
    if live and record.get("srcversion") == live:
        return record.get("patch_sha256") or None, live
    if live and modinfo(mod, "srcversion") == live:
        return modinfo(mod, "bbrlab_patch_sha256") or None, live
    return None, live or None


def main():
    ccas = read("/proc/sys/net/ipv4/tcp_available_congestion_control").split()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(len(ccas) + 1)
    port = listener.getsockname()[1]
    for cca in ccas:
        mod, rose = owner(cca)
        cong, info_bytes, version = cc_info(cca, port)
        listener.accept()[0].close()
        patch, srcversion = patch_identity(mod) if mod else (None, None)
        fields = {"name": cca, "in_use_as": cong, "module": mod or "", "refcount_rose": ",".join(rose),
                  "info_bytes": info_bytes, "bbr_version": version or "", "patch_sha256": patch or "",
                  "srcversion": srcversion or ""}
        print("\t".join(f"{k}={v}" for k, v in fields.items()))
    listener.close()


if __name__ == "__main__":
    main()
