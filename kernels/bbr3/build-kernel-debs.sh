#!/usr/bin/env bash
# Build google/bbr's BBRv3 kernel with the inflight-deficit patch as a second congestion control
# ("bbr2b", a module) beside stock BBRv3 ("bbr"), packaged as Debian .debs for the sender VM.
#
# BBRv3 changes core TCP (struct tcp_sock, rate samples, the congestion_ops interface), so unlike
# kernels/bbr1 it cannot be an out-of-tree module for a stock kernel: it is built with its tree.
#
# Steps (each idempotent; stop after step 4 with --prepare-only):
#   1. clone https://github.com/google/bbr at tag bbrv3-2025-03-18 (branch v3) into --tree
#      (skipped if the tree exists; an existing tree is used as it is)
#   2. check net/ipv4/tcp_bbr.c against SOURCE.sha256 beside the patch when that file exists;
#      otherwise print the hash found so it can be pinned (see README.md)
#   3. copy net/ipv4/tcp_bbr.c to net/ipv4/tcp_bbr2b.c and apply the patch to the copy (no fuzz),
#      then append MODULE_INFO lines carrying the patch's and the source's SHA-256
#   4. add "obj-m += tcp_bbr2b.o" to net/ipv4/Makefile
#   5. configure from a Debian kernel config (default: the installed linux-headers' .config),
#      with BBR (v3) as a module, Debian's signing-key references dropped, LOCALVERSION -bbrv3
#   6. make bindeb-pkg; the .debs land in the tree's parent directory
#
# Install in the sender VM (booted from its own disk):
#   scp ../linux-image-*-bbrv3*.deb root@sender: && ssh root@sender 'dpkg -i linux-image-*-bbrv3*.deb && reboot'
#   then: bbrlab kernel status   (bbr2b is loaded with: modprobe tcp_bbr2b)
# The local testbed boots its guest with QEMU -kernel/-initrd taken from the guest image, so there
# the image recipe has to install the .deb (not done yet; see the kernel report).
#
# Usage: build-kernel-debs.sh [--tree DIR] [--patch FILE] [--config FILE] [--jobs N] [--prepare-only]
set -euo pipefail

TAG=bbrv3-2025-03-18
REPO=https://github.com/google/bbr.git
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TREE=$PWD/bbr-v3
PATCH=$HERE/inflight-deficit.patch
CONFIG=""
JOBS=$(nproc)
PREPARE_ONLY=0

die() { echo "build-kernel-debs: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
        --tree) TREE=$(realpath -m "$2"); shift 2 ;;
        --patch) PATCH=$(realpath "$2"); shift 2 ;;
        --config) CONFIG=$(realpath "$2"); shift 2 ;;
        --jobs) JOBS=$2; shift 2 ;;
        --prepare-only) PREPARE_ONLY=1; shift ;;
        -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
[ -f "$PATCH" ] || die "patch $PATCH does not exist"
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a positive integer, got '$JOBS'"

# 1. the tree
if [ ! -d "$TREE" ]; then
    git clone --depth 1 --branch "$TAG" "$REPO" "$TREE"
fi
SRC=$TREE/net/ipv4/tcp_bbr.c
[ -f "$SRC" ] || die "$TREE has no net/ipv4/tcp_bbr.c: not a kernel tree"

# 2. is it the source the patch was written for?
FOUND=$(sha256sum "$SRC" | cut -d' ' -f1)
PINNED=$(dirname "$PATCH")/SOURCE.sha256
if [ -f "$PINNED" ]; then
    EXPECTED=$(cut -d' ' -f1 "$PINNED")
    [ "$FOUND" = "$EXPECTED" ] || die "$SRC has sha256 $FOUND, but $PATCH was written for $EXPECTED: refusing"
else
    echo "build-kernel-debs: NOTE: no $PINNED; $SRC has sha256 $FOUND (pin it once verified)" >&2
fi

# 3. the patched copy, registered as bbr2b
PATCH_SHA=$(sha256sum "$PATCH" | cut -d' ' -f1)
DST=$TREE/net/ipv4/tcp_bbr2b.c
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
cp "$SRC" "$STAGE/tcp_bbr.c"
patch --batch --fuzz=0 --no-backup-if-mismatch -r - "$STAGE/tcp_bbr.c" "$PATCH" >/dev/null \
    || die "$PATCH does not apply to $SRC without fuzz"
grep -q '\.name[[:space:]]*= "bbr2b"' "$STAGE/tcp_bbr.c" || die "the patched file does not register .name = \"bbr2b\""
{
    echo
    echo "/* Added by kernels/bbr3/build-kernel-debs.sh: identity of this build. */"
    echo "MODULE_INFO(bbrlab_patch_sha256, \"$PATCH_SHA\");"
    echo "MODULE_INFO(bbrlab_source_sha256, \"$FOUND\");"
} >> "$STAGE/tcp_bbr.c"
cp "$STAGE/tcp_bbr.c" "$DST"

# 4. build it as a module of this tree
MAKEFILE=$TREE/net/ipv4/Makefile
grep -qx 'obj-m += tcp_bbr2b.o' "$MAKEFILE" || echo 'obj-m += tcp_bbr2b.o' >> "$MAKEFILE"
echo "build-kernel-debs: prepared $DST (patch sha256 $PATCH_SHA)"
[ "$PREPARE_ONLY" = 1 ] && exit 0

# 5. configuration from Debian's (a full kernel build needs more than bbrlab's own packages)
for tool in git make gcc bc bison flex rsync dpkg-buildpackage; do
    command -v "$tool" >/dev/null || die "'$tool' is missing; install: apt-get install build-essential bc bison flex libssl-dev libelf-dev cpio kmod rsync dpkg-dev git"
done
if [ -z "$CONFIG" ]; then
    CONFIG=$(ls -1d /usr/src/linux-headers-*-amd64/.config 2>/dev/null | sort | tail -n 1)
fi
[ -f "$CONFIG" ] || die "no Debian kernel config found; pass --config /boot/config-<release>"
cp "$CONFIG" "$TREE/.config"
(
    cd "$TREE"
    scripts/config --module TCP_CONG_BBR \
        --set-str SYSTEM_TRUSTED_KEYS "" --set-str SYSTEM_REVOCATION_KEYS "" \
        --set-str LOCALVERSION "-bbrv3" --disable LOCALVERSION_AUTO \
        --disable DEBUG_INFO_BTF --disable DEBUG_INFO_DWARF5 --disable DEBUG_INFO_DWARF4 \
        --enable DEBUG_INFO_NONE
    make olddefconfig
    # 6. the packages
    make -j"$JOBS" bindeb-pkg
)
ls -1 "$(dirname "$TREE")"/linux-*bbrv3*.deb
