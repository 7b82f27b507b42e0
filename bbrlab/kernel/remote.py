"""Load a built module on a host, identify what is loaded, and change its parameters.

Everything goes through :class:`bbrlab.core.hosts.Host`, so the same code serves the local testbed's
sender guest (SSH), a lab VM, or this machine when its kernel can load modules.

On the host, bbrlab keeps ``/var/lib/bbrlab/modules/<name>.ko`` (the loaded file) and
``<name>.json`` (its build identity). :func:`module_identity` trusts that record only when its
``srcversion`` equals the live ``/sys/module/<name>/srcversion``; a run record therefore names the
module that really ran (name, srcversion, patch and source hashes, parameters as read from sysfs).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from bbrlab.core import recordjson
from bbrlab.core.errors import BbrlabError, TestbedError
from bbrlab.core.hosts import Host

from .build import BuiltModule
from .params import validate_params

REMOTE_DIR = "/var/lib/bbrlab/modules"
CCA_LIST = "/proc/sys/net/ipv4/tcp_available_congestion_control"


class ModuleLoadError(BbrlabError):
    """A module cannot be (re)loaded on a host."""


def available_ccas(host: Host) -> list[str]:
    """Congestion controls the host's kernel offers now."""
    return host.read_text(CCA_LIST).split()


def kernel_release(host: Host) -> str:
    """The host's running kernel release (``uname -r``)."""
    return host.output(["uname", "-r"])


def check_vermagic(host: Host, built: BuiltModule) -> str:
    """Refuse a module built for another kernel; return the host's release."""
    release = kernel_release(host)
    if built.target_release != release:
        raise ModuleLoadError(
            f"{built.ko_path} was built for kernel {built.target_release!r} (vermagic {built.vermagic.strip()!r}) "
            f"but {host.name} runs {release!r}: build against /usr/src/linux-headers-{release} "
            f"(package linux-headers-{release})")
    return release


def loaded_srcversion(host: Host, name: str) -> str | None:
    """srcversion of the loaded module ``name``, or None when it is not loaded."""
    res = host.run(["cat", f"/sys/module/{name}/srcversion"], check=False)
    return res.stdout.strip() if res.ok else None


def _refcount(host: Host, name: str) -> int:
    return int(host.output(["cat", f"/sys/module/{name}/refcnt"]) or 0)


def _insmod(host: Host, path: str) -> None:
    res = host.run(["insmod", path], check=False, sudo=True)
    if not res.ok:
        dmesg = host.run(["dmesg"], check=False, sudo=True).stdout.strip().splitlines()[-5:]
        raise ModuleLoadError(f"insmod {path} on {host.name} failed: {res.stderr.strip()}; kernel log: "
                              + " | ".join(dmesg))


def _check_unused(host: Host, name: str) -> None:
    users = _refcount(host, name)
    if users:
        raise ModuleLoadError(f"another build of {name} is loaded on {host.name} and in use (refcnt {users}: "
                              f"sockets, or net.ipv4.tcp_congestion_control, use it); stop those, then load again")


def load(host: Host, built: BuiltModule) -> dict:
    """Load ``built`` on ``host`` (idempotent) and return the module's identity.

    Same srcversion already loaded: nothing changes. Another build loaded and unused: it is
    replaced (and put back if the new one fails to load). In use: a clear error, nothing changes.
    """
    check_vermagic(host, built)
    current = loaded_srcversion(host, built.name)
    if current != built.srcversion:
        final = f"{REMOTE_DIR}/{built.name}.ko"
        staged = f"{REMOTE_DIR}/.{built.name}.ko.new"
        if current is not None:
            _check_unused(host, built.name)  # before anything changes
        host.run(["mkdir", "-p", REMOTE_DIR], sudo=True)
        host.put(built.ko_path, staged)
        if current is not None:
            host.run(["rmmod", built.name], sudo=True)
        try:
            _insmod(host, staged)
        except ModuleLoadError:
            if current is not None and host.exists(final):
                host.run(["insmod", final], check=False, sudo=True)  # put the previous build back
            host.run(["rm", "-f", staged], check=False, sudo=True)
            raise
        host.run(["mv", "-f", staged, final], sudo=True)
        host.write_text(f"{REMOTE_DIR}/{built.name}.json", json.dumps(built.to_dict(), indent=2) + "\n", sudo=True)
    if built.name not in available_ccas(host):
        raise ModuleLoadError(f"{built.name} loaded on {host.name} but is not in {CCA_LIST}: "
                              f"{' '.join(available_ccas(host))}")
    return module_identity(host, built.name)


def read_params(host: Host, name: str) -> dict[str, str]:
    """``/sys/module/<name>/parameters/*`` as {parameter: value}, in one command."""
    directory = f"/sys/module/{name}/parameters"
    script = f'cd {shlex.quote(directory)} 2>/dev/null || exit 0; for f in *; do [ -f "$f" ] && ' \
             'printf "%s=%s\\n" "$f" "$(cat "$f")"; done'
    out = host.output(["sh", "-c", script])
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _params_as_numbers(raw: dict[str, str]) -> dict[str, int | str]:
    return {k: int(v) if v.lstrip("-").isdigit() else v for k, v in raw.items()}


#: $1 a module's name, $2 bbrlab's record of its build: what :func:`module_identity` needs, in one command (one
#: round trip to the sender instead of five; the run path's ``probe`` phase pays it on every run of a module).
_IDENTITY_SH = r"""m=/sys/module/$1
[ -r "$m/srcversion" ] || { echo notloaded; exit 0; }
v() { IFS= read -r x < "$1" 2>/dev/null; printf '%s\n' "$x"; x=; }  # a builtin read: no process per file
printf 'srcversion='; v "$m/srcversion"
printf 'version='; v "$m/version"
printf 'taint='; v "$m/taint"
for f in "$m"/parameters/*; do [ -f "$f" ] && printf 'param:%s=' "${f##*/}" && v "$f"; done
echo record:
cat "$2" 2>/dev/null
true"""


def _identity_parts(out: str) -> tuple[dict[str, str], dict[str, str], dict] | None:
    """The sysfs values, the parameters and bbrlab's build record printed by :data:`_IDENTITY_SH` (None: not
    loaded)."""
    head, _, record = out.partition("\nrecord:\n")
    if head.strip() == "notloaded":
        return None
    plain: dict[str, str] = {}
    params: dict[str, str] = {}
    for line in head.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key.startswith("param:"):
            params[key[len("param:"):]] = value
        else:
            plain[key] = value.strip()
    try:
        built = json.loads(record) if record.strip() else {}
    except json.JSONDecodeError:
        built = {}
    return plain, params, built if isinstance(built, dict) else {}


@dataclass(frozen=True)
class ModuleIdentity:
    """``metadata.module`` of a run whose congestion control is a loaded module: the keys of
    :func:`module_identity` (``params``: each sysfs parameter, a number where it reads as one), or, when it
    could not be identified, its ``name`` and the ``error`` alone (the identity's keys then left out)."""

    name: str
    srcversion: str | None = None
    version: str | None = None
    patch_sha256: str | None = None
    source_sha256: str | None = None
    params: dict[str, int | str] = field(default_factory=dict)
    taint: str = ""
    error: str | None = recordjson.left_out_when_none()

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """The identity's keys; an unidentified module's name and error alone."""
        return recordjson.record_layout(source, handler, read=dict, write=_identity_or_error)


def _identity_or_error(d: dict) -> dict:
    return {"name": d["name"], "error": d["error"]} if "error" in d else d


def module_identity(host: Host, name: str) -> dict:
    """What a run record stores about the loaded module ``name``, read in one command.

    Keys: name, srcversion, version, patch_sha256, source_sha256 (None if bbrlab's record does not
    match the live module), params (from sysfs), taint (the kernel's taint letters for it).
    """
    parts = _identity_parts(host.output(["sh", "-c", _IDENTITY_SH, "bbrlab-identity", name,
                                         f"{REMOTE_DIR}/{name}.json"]))
    if parts is None or not parts[0].get("srcversion"):
        raise TestbedError(f"module {name} is not loaded on {host.name}")
    plain, params, built = parts
    trusted = built.get("srcversion") == plain["srcversion"]
    return {
        "name": name,
        "srcversion": plain["srcversion"],
        "version": plain.get("version") or None,
        "patch_sha256": built.get("patch_sha256") if trusted else None,
        "source_sha256": built.get("source_sha256") if trusted else None,
        "params": _params_as_numbers(params),
        "taint": plain.get("taint", ""),
    }


def set_params(host: Host, name: str, **params: object) -> dict:
    """Write module parameters (validated first; all or nothing) and return them as read back."""
    before = read_params(host, name)
    values = validate_params(list(before), params)
    written: list[str] = []
    try:
        for key, value in values.items():
            host.write_value(f"/sys/module/{name}/parameters/{key}", value, sudo=True)
            written.append(key)
    except BbrlabError as e:
        for key in written:  # put back what this call changed
            host.write_value(f"/sys/module/{name}/parameters/{key}", before[key], sudo=True)
        raise ModuleLoadError(f"setting {name} parameters on {host.name} failed, restored: {e}") from e
    after = _params_as_numbers(read_params(host, name))
    wrong = {k: after.get(k) for k, v in values.items() if after.get(k) != v}
    if wrong:
        raise ModuleLoadError(f"{name} parameters did not take on {host.name}: read back {wrong}")
    return after

