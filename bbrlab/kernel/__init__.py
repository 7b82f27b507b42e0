"""Patched congestion-control modules: build them from the kernel's own source, load, identify.

The paper's fix for BBR (the "inflight deficit" patch) is built as an out-of-tree module under its
own name, ``bbr2b``, so stock ``bbr`` and the patched one run on the same kernel and a campaign
compares them run by run. The steps, each a function here:

1. :func:`prepare_source`: the pristine ``net/ipv4/tcp_bbr.c`` of the target kernel, refused unless
   its SHA-256 is the one the patch was written for (``kernels/bbr1/SOURCE.sha256``).
2. :func:`build_module`: apply the patch (no fuzz), build against the target's headers
   (``make -C /usr/src/linux-headers-<release> M=...``), record srcversion, vermagic, hashes.
3. :func:`load`: check vermagic against the host's ``uname -r``, copy, ``insmod``, verify the name in
   ``tcp_available_congestion_control``; idempotent.
4. :func:`module_identity` for run records, :func:`set_params` for the module parameters.

:func:`ensure_bbr2b` does all of it for a host (the testbed calls it when it comes up).

May import: ``bbrlab.core``, ``bbrlab.scenario``. Never a room above it.
"""

from __future__ import annotations

from bbrlab.core.cachefiles import sha256_file
from bbrlab.core.hosts import Host

from .build import (
    DEFAULT_PATCH,
    KERNELS_DIR,
    BuildError,
    BuiltModule,
    ModuleBuild,
    build_module,
    ca_name,
    cached_build,
    default_headers_dir,
    headers_release,
    plan_build,
)
from .params import DEFICIT_PARAMS, validate_params
from .remote import (
    ModuleIdentity,
    ModuleLoadError,
    available_ccas,
    check_vermagic,
    load,
    loaded_srcversion,
    module_identity,
    read_params,
    set_params,
)
from .source import DEFAULT_SOURCE, SourceMismatchError, prepare_source

__all__ = [
    "DEFAULT_PATCH", "DEFAULT_SOURCE", "DEFICIT_PARAMS", "KERNELS_DIR", "BuildError", "BuiltModule",
    "ModuleBuild", "ModuleIdentity", "ModuleLoadError", "SourceMismatchError", "available_ccas", "build_module", "ca_name",
    "cached_build", "check_vermagic", "default_headers_dir", "ensure_bbr2b", "ensure_module",
    "headers_release", "load", "loaded_srcversion", "module_identity", "plan_build", "prepare_source",
    "read_params", "set_params", "sha256_file", "validate_params",
]


def ensure_module(host: Host, patch_path=DEFAULT_PATCH, *, source=DEFAULT_SOURCE,
                  expected_sha256: str | None = None, headers_dir=None) -> dict:
    """Build (cached) the module ``patch_path`` defines for ``host``'s kernel, load it, return its identity.

    The headers default to ``/usr/src/linux-headers-<uname -r of host>`` on this machine.
    """
    release = host.output(["uname", "-r"])
    build = plan_build(patch_path, headers_dir or default_headers_dir(release), source=source,
                       expected_sha256=expected_sha256, release=release)
    return load(host, cached_build(build))


def ensure_bbr2b(host: Host, kernel=None) -> dict:
    """Make sure ``bbr2b`` (the inflight-deficit BBR) is loaded on ``host``; return :func:`module_identity`.

    Builds it here if it is not cached under ``${XDG_CACHE_HOME:-~/.cache}/bbrlab/modules/<hash>/``,
    loads it (nothing happens if the same build is loaded). ``kernel`` (a resolved sender kernel,
    :class:`bbrlab.kernel.sender.ResolvedKernel`) picks the headers, source and patch for that kernel
    (:mod:`bbrlab.kernel.bbr2b`); without it the host's release decides: this machine's
    ``/usr/src/linux-headers-<release>`` when installed, else a Debian kernel bbrlab fetched with
    that release.
    """
    from . import debian, sender
    from .bbr2b import ensure_bbr2b_for

    if kernel is not None:
        return ensure_bbr2b_for(host, kernel)
    release = host.output(["uname", "-r"])
    if not default_headers_dir(release).is_dir():
        for name in debian.SUITE_KERNELS:
            if debian.pinned_release(name) == release:
                return ensure_bbr2b_for(host, sender.resolve(name))
    return ensure_module(host, DEFAULT_PATCH)
