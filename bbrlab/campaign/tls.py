"""Mutual TLS for the Dask engine: the certificates and the :class:`distributed.security.Security` it uses.

Dask workers and nannies run what a peer sends them (pickled functions), and bbrlab's workers run as root,
so nothing of the engine accepts a connection from a peer that does not hold a certificate signed by the
campaign's (or the lab's) own certificate authority. Two cases:

- **A campaign over several testbeds on this machine** (:func:`campaign_security`): a fresh CA and one
  certificate for this campaign only, in a private temporary directory (0700, files 0600) removed when the
  campaign ends (:func:`campaign_dir`; one left by a driver killed outright is swept by the next campaign).
  Other local users cannot read the key, so they cannot connect either.
- **A lab** (:func:`make_ca`, :func:`make_host_cert`, ``bbrlab tls``): a CA kept by the lab and one
  certificate per host (scheduler, each worker's host, each driver's host), given to Dask's own options
  (``--tls-ca-file``, ``--tls-cert``, ``--tls-key``) or its ``distributed.comm.tls.*`` config keys
  (:func:`lab_security`). A plain ``tcp://`` scheduler is refused unless the user says ``--insecure``.

Dask checks the peer's certificate against the CA (both directions) and not its host name, so the names in
a certificate are informative; trust comes from the CA alone, which therefore must be the lab's own.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bbrlab.core import cachefiles, owners
from bbrlab.core.errors import ValidationError

#: File names in a CA directory and in a host's certificate directory (``NAME.pem``, ``NAME-key.pem``).
CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"
#: Validity of a lab's CA, of a lab host's certificate (default), and of a campaign's temporary ones. Dask
#: checks no revocation list, so a copied host key is refused only once its certificate expires or the lab
#: makes a new CA: 90 days (what public CAs now issue) bounds that, and a season of campaigns fits in it. The
#: CA lives a year; its certificates never outlive it (:data:`MAX_HOST_VALID_DAYS` is the longest asked for).
LAB_CA_VALID_DAYS = 365
LAB_VALID_DAYS = 90
MAX_HOST_VALID_DAYS = 365
CAMPAIGN_VALID_DAYS = 7
#: A lab certificate's role and the TLS uses (extended key usage) it allows. A Dask scheduler, worker and
#: nanny listen and also connect out (a worker to the scheduler and to other workers, the scheduler to
#: workers), so ``server`` holds both; a campaign driver (a Dask client) only connects. OpenSSL refuses a
#: peer whose certificate lacks the use it is put to (a client's certificate presented by a listener).
ROLES = {"server": ("serverAuth", "clientAuth"), "client": ("clientAuth",)}
ROLES_ALLOWED = ("server (the Dask scheduler's host and each bbrlab worker's: they listen and connect) or "
                 "client (a campaign driver's host: it only connects)")
#: Addresses a campaign's temporary certificate names (every one of its processes is on loopback).
LOOPBACK_NAMES = ("localhost", "127.0.0.1")
#: How a record says the Dask transport was encrypted or not (``metadata.worker.transport``).
TRANSPORT_TLS = "tls"
TRANSPORT_INSECURE = "insecure tcp (--insecure): unauthenticated, unencrypted"


@dataclass(frozen=True)
class TlsFiles:
    """The three files a Dask process needs for mutual TLS: the CA's certificate, its own certificate and
    the matching private key (PEM)."""

    ca_file: Path
    cert: Path
    key: Path


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem_cert(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _subject(common_name: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "bbrlab"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _alt_names(hosts: list[str]):
    from cryptography import x509

    names = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def make_ca(common_name: str = "bbrlab lab CA", valid_days: int = LAB_CA_VALID_DAYS) -> tuple[bytes, bytes]:
    """A new certificate authority: ``(certificate PEM, private key PEM)``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = _key()
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_subject(common_name)).issuer_name(_subject(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(key, hashes.SHA256()))
    return _pem_cert(cert), _pem_key(key)


def _usages(role: str):
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    oids = {"serverAuth": ExtendedKeyUsageOID.SERVER_AUTH, "clientAuth": ExtendedKeyUsageOID.CLIENT_AUTH}
    if role not in ROLES:
        raise ValidationError("--role", role, ROLES_ALLOWED)
    return x509.ExtendedKeyUsage([oids[use] for use in ROLES[role]])


def make_host_cert(ca_cert_pem: bytes, ca_key_pem: bytes, name: str, hosts: list[str] | None = None,
                   valid_days: int = LAB_VALID_DAYS, role: str = "server") -> tuple[bytes, bytes]:
    """A certificate for one host (or one campaign), signed by the CA: ``(certificate PEM, key PEM)``. Its
    ``role`` (:data:`ROLES`) says whether it serves as a TLS server's and a client's (``server``: a Dask
    process listens and connects) or a client's only; ``hosts`` (default: ``name``) are its subject
    alternative names, DNS names or IP addresses. It ends with the CA at the latest; a ``valid_days`` more
    than a day past the CA's end is refused (:class:`ValidationError` on ``--days``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    usages = _usages(role)
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    now, ca_end = dt.datetime.now(dt.UTC), ca_cert.not_valid_after_utc
    ca_days = (ca_end - now).days + 1  # a certificate asked for as long as the CA ends with it
    if not 1 <= valid_days <= min(MAX_HOST_VALID_DAYS, ca_days):
        raise ValidationError("--days", valid_days, f"1 to {min(MAX_HOST_VALID_DAYS, ca_days)} (the CA "
                              f"expires on {ca_end:%Y-%m-%d}; a certificate never outlives it)",
                              "make a new CA and new certificates when it is near its end")
    key = _key()
    cert = (x509.CertificateBuilder().subject_name(_subject(name)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(min(now + dt.timedelta(days=valid_days), ca_end))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(usages, critical=False)
            .add_extension(_alt_names(list(hosts or [name])), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return _pem_cert(cert), _pem_key(key)


def write_private(path: Path, data: bytes) -> Path:
    """Write ``data`` to a new file readable by its owner only (0600); an existing file (or a link) is refused."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return Path(path)


def private_dir(path: Path) -> Path:
    """``path`` as a directory only its owner can enter (0700), created when missing. For a directory this
    process made itself (a campaign's, from :func:`campaign_dir`); a lab's go through
    :func:`new_private_dir`."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


PRIVATE_DIR_ALLOWED = ("a new directory, or an existing empty one that is yours alone (owned by you, no "
                       "group or other permission bits, not a symbolic link); bbrlab tls never changes a "
                       "directory it did not make")


def new_private_dir(path: Path, field: str = "--out") -> Path:
    """``path`` as an empty directory only this user can enter: made here (0700; missing parents too), or an
    existing one that is already empty, owned by this user, 0700 or stricter and not a symbolic link. Nothing
    about an existing directory is changed (``--out /tmp`` is refused, not made private); anything else is a
    :class:`ValidationError` on ``field``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise ValidationError(field, str(path), f"{PRIVATE_DIR_ALLOWED}; {e.strerror}") from None
    else:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, 0o700)  # ours, just made: the umask may have taken bits off
        finally:
            os.close(fd)
        return path
    st = os.lstat(path)
    wrong = ("a symbolic link" if stat.S_ISLNK(st.st_mode)
             else "not a directory" if not stat.S_ISDIR(st.st_mode)
             else f"owned by uid {st.st_uid}" if st.st_uid != os.geteuid()
             else f"mode {stat.S_IMODE(st.st_mode):04o}" if st.st_mode & 0o077
             else f"not empty ({len(os.listdir(path))} entries)" if os.listdir(path) else None)
    if wrong:
        raise ValidationError(field, str(path), PRIVATE_DIR_ALLOWED, f"it is {wrong}")
    return path


def _outside_ca(ca_dir: Path, out_dir: Path) -> None:
    """Refuse an ``--out`` that is the CA's directory or inside it: what is in ``--out`` goes to a host, and
    the CA's key must not go with it."""
    ca, out = Path(ca_dir).resolve(), Path(out_dir).resolve()
    if out == ca or ca in out.parents:
        raise ValidationError("--out", str(out_dir), f"a directory outside the CA's ({ca_dir}): its files "
                              f"are copied to a host, and {CA_KEY} must stay where it is")


def write_ca(out_dir: Path, common_name: str = "bbrlab lab CA",
             valid_days: int = LAB_CA_VALID_DAYS) -> TlsFiles:
    """``bbrlab tls ca``: a new lab CA in ``out_dir`` (``ca.pem``, and ``ca-key.pem`` readable by its owner
    only), valid ``valid_days``. ``out_dir`` is new or empty and private (:func:`new_private_dir`), so an
    existing CA is never replaced."""
    if not 1 <= valid_days <= 3650:
        raise ValidationError("--days", valid_days, "1 to 3650 (days the CA is valid)")
    out = new_private_dir(out_dir)
    cert, key = make_ca(common_name, valid_days)
    write_private(out / CA_KEY, key)
    write_private(out / CA_CERT, cert)
    os.chmod(out / CA_CERT, 0o644)  # the CA's certificate is public; its key is not
    return TlsFiles(out / CA_CERT, out / CA_CERT, out / CA_KEY)


def write_host_cert(ca_dir: Path, name: str, out_dir: Path, hosts: list[str] | None = None, *, role: str,
                    valid_days: int = LAB_VALID_DAYS) -> TlsFiles:
    """``bbrlab tls cert``: a certificate for host ``name`` in ``role`` (:data:`ROLES`) signed by the CA in
    ``ca_dir``, written to ``out_dir`` with a copy of the CA's certificate (``NAME.pem``, ``NAME-key.pem``
    0600, ``ca.pem``): the three files that host's Dask processes need. ``out_dir`` is new or empty and
    private (:func:`new_private_dir`) and outside ``ca_dir``; everything is checked before it is made."""
    if not name or "/" in name or name.startswith(".") or "\0" in name or len(name) > 64:
        raise ValidationError("--name", name, "a host's name: 1 to 64 characters, no '/', not starting with '.'")
    _usages(role)
    ca = Path(ca_dir)
    try:
        ca_cert, ca_key = (ca / CA_CERT).read_bytes(), (ca / CA_KEY).read_bytes()
    except OSError as e:
        raise ValidationError("--ca", str(ca_dir), f"a directory made by bbrlab tls ca (with {CA_CERT} and "
                              f"{CA_KEY}); {e.strerror}: {e.filename}") from None
    _outside_ca(ca, out_dir)
    cert, key = make_host_cert(ca_cert, ca_key, name, hosts, valid_days, role)
    out = new_private_dir(out_dir)
    cert_path, key_path = out / f"{name}.pem", out / f"{name}-key.pem"
    write_private(key_path, key)
    write_private(cert_path, cert)
    return TlsFiles(write_private(out / CA_CERT, ca_cert), cert_path, key_path)


def security(files: TlsFiles):
    """Dask's :class:`~distributed.security.Security` for mutual TLS with ``files`` in every role (client,
    scheduler, worker), encryption required."""
    from distributed.security import Security

    ca, cert, key = str(files.ca_file), str(files.cert), str(files.key)
    return Security(require_encryption=True, tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key,
                    tls_scheduler_cert=cert, tls_scheduler_key=key, tls_worker_cert=cert, tls_worker_key=key)


#: The start of a campaign's key directory's name in the temporary folder; the owner follows.
CAMPAIGN_DIR_PREFIX = "bbrlab-tls-"
#: The file in a campaign's key directory that names the process it belongs to (:mod:`bbrlab.core.owners`).
OWNER_FILE = "owner"


def campaign_dir() -> Path:
    """A new private directory (0700) for one campaign's key files, in the temporary folder, named for this
    process (:func:`bbrlab.core.cachefiles.owner_prefix`) and stamped with it (:data:`OWNER_FILE`).
    Directories that campaigns killed outright (SIGKILL) left behind are removed first
    (:func:`sweep_campaign_dirs`)."""
    sweep_campaign_dirs()
    path = Path(tempfile.mkdtemp(prefix=cachefiles.owner_prefix(CAMPAIGN_DIR_PREFIX)))
    write_private(path / OWNER_FILE, (owners.Owner.current().stamp() + "\n").encode())
    return path


def sweep_campaign_dirs() -> list[Path]:
    """Remove the campaign key directories a campaign killed outright left; return them. Only a directory
    (not a link) of this user's, private (0700), with bbrlab's owner stamp naming a process of this machine
    that no longer runs: any other ``bbrlab-tls-*`` in the temporary folder is not bbrlab's to remove."""
    gone = []
    for path in sorted(Path(tempfile.gettempdir()).glob(CAMPAIGN_DIR_PREFIX + "*")):
        if _abandoned(path):
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
    return gone


def _abandoned(path: Path) -> bool:
    try:
        st = path.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return False
        fd = os.open(path / OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            line = f.read(300).decode(errors="replace").partition("\n")[0]
    except OSError:
        return False
    owner = owners.Owner.parse(line)
    return owner is not None and owner.gone()


@contextlib.contextmanager
def campaign_security() -> Iterator:
    """A Security for one campaign on this machine: a fresh CA and one certificate (for 127.0.0.1), their
    files in a temporary directory only this user can enter, removed when the ``with`` block ends."""
    tmp = campaign_dir()
    try:
        yield security(campaign_files(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def campaign_files(directory: Path) -> TlsFiles:
    """A fresh CA and one loopback certificate signed by it, written to ``directory`` (made 0700; the files
    0600). The CA's key is not kept: nothing else can ever be signed by it."""
    out = private_dir(directory)
    ca_cert, ca_key = make_ca("bbrlab campaign CA", CAMPAIGN_VALID_DAYS)
    cert, key = make_host_cert(ca_cert, ca_key, "bbrlab campaign", list(LOOPBACK_NAMES), CAMPAIGN_VALID_DAYS)
    return TlsFiles(write_private(out / CA_CERT, ca_cert), write_private(out / "campaign.pem", cert),
                    write_private(out / "campaign-key.pem", key))


# -- a lab's options ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LabTls:
    """What the user gave for a lab's transport: Dask's TLS options (None: from Dask's config) and
    ``insecure`` (plain ``tcp://`` explicitly accepted)."""

    ca_file: str | None = None
    cert: str | None = None
    key: str | None = None
    insecure: bool = False


TLS_ALLOWED = ("tls://HOST:PORT with --tls-ca-file, --tls-cert and --tls-key (or Dask's config keys "
               "distributed.comm.tls.ca-file, distributed.comm.tls.client.cert/.key and .worker.cert/.key); "
               "bbrlab tls ca and bbrlab tls cert make them")


def lab_security(address: str, options: LabTls, role: str = "client"):
    """The Security for connecting to (and, for a worker, listening beside) the scheduler at ``address``, and
    the transport a record names: ``(Security, TRANSPORT_TLS | TRANSPORT_INSECURE)``.

    ``tls://`` needs a CA, a certificate and a key, from the options or else from Dask's
    ``distributed.comm.tls.*`` config (for ``role``: ``client`` for a driver, ``worker`` for a worker).
    ``tcp://`` is refused unless ``options.insecure``; TLS options with ``tcp://`` are refused too. Raises
    :class:`ValidationError` naming the option."""
    from distributed.security import Security

    given = {"--tls-ca-file": options.ca_file, "--tls-cert": options.cert, "--tls-key": options.key}
    if address.startswith("tcp://"):
        if not options.insecure:
            raise ValidationError("--scheduler", address, f"{TLS_ALLOWED}; a tcp:// scheduler lets anyone who "
                                  "reaches it run code as root on every worker, so it is refused unless you pass "
                                  "--insecure (the records then say so)")
        named = [opt for opt, value in given.items() if value]
        if named:
            raise ValidationError(named[0], given[named[0]], "absent with a tcp:// --scheduler (TLS needs tls://)")
        return Security(require_encryption=False), TRANSPORT_INSECURE
    if any(given.values()):
        for opt, value in given.items():
            if not value:
                raise ValidationError(opt, None, f"given too: {TLS_ALLOWED}")
            if not Path(value).is_file():
                raise ValidationError(opt, value, "a readable PEM file")
        return security(TlsFiles(Path(options.ca_file), Path(options.cert), Path(options.key))), TRANSPORT_TLS
    sec = Security()  # Dask's own config keys
    if not sec.tls_ca_file or not getattr(sec, f"tls_{role}_cert"):
        raise ValidationError("--tls-ca-file", None, f"given for a tls:// scheduler: {TLS_ALLOWED}")
    sec.require_encryption = True
    return sec, TRANSPORT_TLS
