"""The Dask engine's trust, the parts that need no cluster: what the driver accepts of a worker's outcome
(:func:`bbrlab.campaign.distributed.check_outcome`), the certificates of :mod:`bbrlab.campaign.tls` (real TLS handshakes
in memory between Dask's own SSL contexts), the refusal of ``tcp://`` without ``--insecure``, and
``bbrlab tls``. With real Dask processes: tests/system/test_dask_security.py."""

from __future__ import annotations

import os
import ssl
import stat
from pathlib import Path

import pytest
import yaml

from bbrlab.campaign import distributed as d
from bbrlab.campaign import tls as tlsconf
from bbrlab.campaign.attempt import Attempt, Finished
from bbrlab.cli.main import main
from bbrlab.core.errors import ValidationError

RUN, TOKEN = "cubic-ts10ms-sh100-rtt20ms-50mbit-r00-abc", "t0k3n"


def _outcome(**over) -> Finished:
    base = Finished(Attempt(RUN, 1, None, 0), "ok", None, {"pid": 1}, "t0", "t1",
                    files={"iperf.json": b"{}", "samples.log": b"x"}, testbed="a", worker_host="h", cpus=[0],
                    token=TOKEN)
    for key, value in over.items():
        setattr(base, key, value)
    return base


def test_an_outcome_of_the_submitted_attempt_is_accepted():
    d.check_outcome(_outcome(), RUN, 1, TOKEN)
    d.check_outcome(_outcome(status="failed", reason="boom", cpus=None), RUN, 1, TOKEN)


@pytest.mark.parametrize("over, says", [
    ({"attempt": Attempt("bbr-other-run", 1, None, 0)}, "this task was attempt 1"),
    ({"attempt": Attempt(RUN, 2, None, 0)}, "this task was attempt 1"),
    ({"attempt": (RUN, 1)}, "this task was attempt 1"),
    ({"wall_s": 1.5}, "wall time"),
    ({"token": "another-campaign"}, "this task was attempt 1"),
    ({"status": "done"}, "status"),
    ({"metadata": ["not", "a", "mapping"]}, "metadata"),
    ({"metadata": {"x": object()}}, "not JSON"),
    ({"testbed": 7}, "testbed"),
    ({"cpus": ["0"]}, "cpus"),
    ({"files": {"iperf.json": "text, not bytes"}}, "not bytes"),
])
def test_an_outcome_that_is_not_the_submitted_attempts_is_refused(over, says):
    with pytest.raises(d.RefusedOutcome, match=says):
        d.check_outcome(_outcome(**over), RUN, 1, TOKEN)


def test_something_else_than_an_outcome_is_refused():
    with pytest.raises(d.RefusedOutcome, match="not a bbrlab Finished"):
        d.check_outcome({"run_id": RUN}, RUN, 1, TOKEN)


@pytest.mark.parametrize("name", ["../x", "../../../escaped", "/etc/passwd", "a/b", "..", ".", ".hidden", "x\0y",
                                  "a b", "", "n" * (d.MAX_NAME_CHARS + 1), "record.json", "x\\y"])
def test_a_file_name_that_is_not_a_plain_name_is_refused(name):
    with pytest.raises(d.RefusedOutcome, match="not a plain name"):
        d.check_outcome(_outcome(files={name: b"x"}), RUN, 1, TOKEN)


def test_files_beyond_the_bounds_are_refused(monkeypatch):
    monkeypatch.setattr(d, "MAX_FILE_BYTES", 10)
    monkeypatch.setattr(d, "MAX_OUTCOME_BYTES", 40)
    d.check_outcome(_outcome(files={"a.log": b"x" * 10}), RUN, 1, TOKEN)
    with pytest.raises(d.RefusedOutcome, match="at most"):
        d.check_outcome(_outcome(files={"a.log": b"x" * 11}), RUN, 1, TOKEN)
    with pytest.raises(d.RefusedOutcome, match="more than"):
        d.check_outcome(_outcome(files={f"f{i}.log": b"x" * 10 for i in range(4)}), RUN, 1, TOKEN)
    with pytest.raises(d.RefusedOutcome, match="files"):
        d.check_outcome(_outcome(files={f"f{i}": b"" for i in range(d.MAX_FILES + 1)}), RUN, 1, TOKEN)


# -- files handed by path (a worker on the driver's machine) ------------------------------------------------

def _staged(out: Path, name: str | None = None, files: dict | None = None) -> Path:
    from bbrlab.campaign import handoff

    out.mkdir(parents=True, exist_ok=True)
    path = handoff.stage(out, RUN, 1)
    if name is not None:
        path = path.rename(path.parent / name)
    for file, data in (files if files is not None else {"iperf.json": b"{}"}).items():
        (path / file).write_bytes(data)
    return path


def test_a_staged_directory_of_this_attempt_is_accepted_and_becomes_the_commit(tmp_path):
    staged = _staged(tmp_path, files={"iperf.json": b"{}", "samples.log": b"x" * 100})
    outcome = _outcome(files={}, staging=staged)
    d.check_outcome(outcome, RUN, 1, TOKEN, tmp_path)
    finished = d.finished_of(outcome, d.Attempt(RUN, 1, None, 0))
    assert finished.staging == staged and finished.files == {}


@pytest.mark.parametrize("make, says", [
    (lambda out: _staged(out, name=f"{RUN}.a2.w1"), "not this attempt's directory"),
    (lambda out: _staged(out, name="other-run.a1.w1"), "not this attempt's directory"),
    (lambda out: Path("/tmp") / f"{RUN}.a1.w1", "not this attempt's directory"),
    (lambda out: _staged(out, files={"x.log": b""}).parent / f"{RUN}.a1.w99", "No such file"),
    (lambda out: _staged(out, files={".hidden": b""}), "not a plain file name"),
    (lambda out: _staged(out, files={"record.json": b"{}"}), "not a plain file name"),
])
def test_a_staged_directory_that_is_not_this_attempts_is_refused(tmp_path, make, says):
    with pytest.raises(d.RefusedOutcome, match=says):
        d.check_outcome(_outcome(files={}, staging=make(tmp_path)), RUN, 1, TOKEN, tmp_path)


def test_a_staged_directory_with_links_foreign_owners_or_open_modes_is_refused(tmp_path):
    """What another user could plant, or a link out of the campaign, is never renamed into runs/."""
    outside = tmp_path / "secret"
    outside.write_bytes(b"s")
    cases = []
    link = _staged(tmp_path, files={})
    (link / "iperf.json").symlink_to(outside)
    cases.append((link, "not a regular file"))
    hard = _staged(tmp_path / "b", files={})
    os.link(outside, hard / "iperf.json")
    cases.append((hard, "not a regular file"))
    writable = _staged(tmp_path / "c")
    writable.chmod(0o777)
    cases.append((writable, "only it may write"))
    theirs = _staged(tmp_path / "e")
    os.chown(theirs, 65534, 65534)
    cases.append((theirs, "only it may write"))
    foreign_file = _staged(tmp_path / "f")
    os.chown(foreign_file / "iperf.json", 65534, 65534)
    cases.append((foreign_file, "not a regular file of this user"))
    as_link = tmp_path / "g" / ".tmp" / f"{RUN}.a1.w5"
    as_link.parent.mkdir(parents=True, mode=0o700)
    as_link.symlink_to(_staged(tmp_path / "h"))
    cases.append((as_link, "not a directory"))
    for staged, says in cases:
        out = staged.parent.parent
        with pytest.raises(d.RefusedOutcome, match=says):
            d.check_outcome(_outcome(files={}, staging=staged), RUN, 1, TOKEN, out)


def test_a_staged_directory_beyond_the_bounds_or_beside_files_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(d, "MAX_FILE_BYTES", 10)
    monkeypatch.setattr(d, "MAX_OUTCOME_BYTES", 40)
    staged = _staged(tmp_path, files={"a.log": b"x" * 11})
    with pytest.raises(d.RefusedOutcome, match="more than 10"):
        d.check_outcome(_outcome(files={}, staging=staged), RUN, 1, TOKEN, tmp_path)
    staged = _staged(tmp_path / "b", files={f"f{i}.log": b"x" * 10 for i in range(4)})
    with pytest.raises(d.RefusedOutcome, match="more than"):
        d.check_outcome(_outcome(files={}, staging=staged), RUN, 1, TOKEN, tmp_path / "b")
    with pytest.raises(d.RefusedOutcome, match="beside files"):
        d.check_outcome(_outcome(staging=_staged(tmp_path / "c")), RUN, 1, TOKEN, tmp_path / "c")
    with pytest.raises(d.RefusedOutcome, match="takes none"):
        d.check_outcome(_outcome(files={}, staging=_staged(tmp_path / "e")), RUN, 1, TOKEN)
    with pytest.raises(d.RefusedOutcome, match="beside files"):  # a path as text: not what a worker sends
        d.check_outcome(_outcome(files={}, staging=str(_staged(tmp_path / "g"))), RUN, 1, TOKEN, tmp_path / "g")


def test_only_a_driver_on_this_machine_and_boot_is_handed_files_by_path():
    from bbrlab.campaign import handoff

    key = handoff.machine_key()
    assert handoff.same_machine(key)
    machine, boot, uid = key.split("/")
    assert not handoff.same_machine(f"{machine}/00000000-0000-0000-0000-000000000000/{uid}")
    assert not handoff.same_machine(f"{machine}/{boot}/{int(uid) + 1}")  # another user's worker sends bytes
    assert not handoff.same_machine(None) and not handoff.same_machine("/")


# -- certificates ---------------------------------------------------------------------------------------

def _handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> None:
    """A real TLS handshake between two contexts through memory buffers; raises ssl.SSLError when refused."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_side=False)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, side, out, peer_in in (("client", client, c_out, s_in), ("server", server, s_out, c_in)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            peer_in.write(out.read())
        if all(done.values()):
            client.write(b"ping")  # TLS 1.3: the server checks the client's certificate after its own handshake
            s_in.write(c_out.read())
            assert server.read(4) == b"ping"
            return
    raise AssertionError("the handshake did not finish")


def test_a_campaigns_certificate_is_private_and_admits_only_its_own(tmp_path):
    files = tlsconf.campaign_files(tmp_path / "tls")
    assert stat.S_IMODE((tmp_path / "tls").stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "tls").iterdir()} == {0o600}
    assert len(list((tmp_path / "tls").iterdir())) == 3  # no CA key kept: nothing else can be signed
    ours = tlsconf.security(files)
    assert ours.require_encryption
    server = ours.get_listen_args("scheduler")["ssl_context"]
    _handshake(server, ours.get_connection_args("client")["ssl_context"])
    other = tlsconf.campaign_files(tmp_path / "other")
    from distributed.security import Security

    stranger = Security(require_encryption=True, tls_ca_file=str(files.ca_file), tls_client_cert=str(other.cert),
                        tls_client_key=str(other.key))
    with pytest.raises(ssl.SSLError):
        _handshake(server, stranger.get_connection_args("client")["ssl_context"])
    bare = ssl.create_default_context(cafile=str(files.ca_file))
    bare.check_hostname = False
    with pytest.raises(ssl.SSLError):
        _handshake(server, bare)


def test_a_lab_ca_and_host_certificates(tmp_path):
    ca = tlsconf.write_ca(tmp_path / "ca")
    assert stat.S_IMODE(ca.key.stat().st_mode) == 0o600
    with pytest.raises(ValidationError) as e:
        tlsconf.write_ca(tmp_path / "ca")  # never replaced
    assert e.value.field == "--out"
    a = tlsconf.write_host_cert(tmp_path / "ca", "hosta", tmp_path / "a", ["hosta.lab", "10.0.0.7"],
                                role="server")
    b = tlsconf.write_host_cert(tmp_path / "ca", "hostb", tmp_path / "b", role="server")
    assert {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "a").iterdir()} == {0o600}
    _handshake(tlsconf.security(a).get_listen_args("scheduler")["ssl_context"],
               tlsconf.security(b).get_connection_args("worker")["ssl_context"])
    for name in ("../x", "", ".x", "a/b"):
        with pytest.raises(ValidationError) as e:
            tlsconf.write_host_cert(tmp_path / "ca", name, tmp_path / "c", role="server")
        assert e.value.field == "--name"
    with pytest.raises(ValidationError) as e:
        tlsconf.write_host_cert(tmp_path / "nothing", "h", tmp_path / "c", role="server")
    assert e.value.field == "--ca"


def _usages(cert_file) -> set[str]:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    return {oid._name for oid in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value}


def test_a_client_certificate_connects_but_cannot_serve(tmp_path):
    """Roles: a server certificate (scheduler, worker) allows TLS server and client use, a client one (a
    driver) only client use, and OpenSSL holds Dask's own contexts to that: a listener presenting a client
    certificate fails the handshake ("unsuitable certificate purpose")."""
    tlsconf.write_ca(tmp_path / "ca")
    server = tlsconf.write_host_cert(tmp_path / "ca", "sched", tmp_path / "s", role="server")
    driver = tlsconf.write_host_cert(tmp_path / "ca", "me", tmp_path / "me", role="client")
    assert _usages(server.cert) == {"serverAuth", "clientAuth"} and _usages(driver.cert) == {"clientAuth"}
    listen = tlsconf.security(server).get_listen_args("scheduler")["ssl_context"]
    _handshake(listen, tlsconf.security(driver).get_connection_args("client")["ssl_context"])
    _handshake(listen, tlsconf.security(server).get_connection_args("worker")["ssl_context"])
    with pytest.raises(ssl.SSLError, match="unsuitable certificate purpose"):
        _handshake(tlsconf.security(driver).get_listen_args("worker")["ssl_context"],
                   tlsconf.security(server).get_connection_args("scheduler")["ssl_context"])
    for role in ("", "both", "Server"):
        with pytest.raises(ValidationError) as e:
            tlsconf.write_host_cert(tmp_path / "ca", "x", tmp_path / f"r{role}", role=role)
        assert e.value.field == "--role" and "client" in e.value.allowed
        assert not (tmp_path / f"r{role}").exists()


def test_lab_certificates_are_short_lived_and_end_with_their_ca(tmp_path):
    import datetime as dt

    from cryptography import x509

    def end(cert_file) -> dt.datetime:
        return x509.load_pem_x509_certificate(cert_file.read_bytes()).not_valid_after_utc

    def days(cert_file) -> float:
        return (end(cert_file) - dt.datetime.now(dt.UTC)).total_seconds() / 86400

    ca = tlsconf.write_ca(tmp_path / "ca")
    host = tlsconf.write_host_cert(tmp_path / "ca", "h", tmp_path / "h", role="server")
    assert 364.9 < days(ca.ca_file) <= 365 and 89.9 < days(host.cert) <= 90
    tlsconf.write_ca(tmp_path / "short", valid_days=30)
    with pytest.raises(ValidationError) as e:
        tlsconf.write_host_cert(tmp_path / "short", "h", tmp_path / "h2", role="server")  # 90 d > the CA's 30
    assert e.value.field == "--days" and "1 to 30" in e.value.allowed and not (tmp_path / "h2").exists()
    whole = tlsconf.write_host_cert(tmp_path / "short", "h", tmp_path / "h3", role="server", valid_days=30)
    assert end(whole.cert) <= end(tmp_path / "short" / "ca.pem")


def _modes(path) -> tuple[int, int, list[str]]:
    st = os.lstat(path)
    return st.st_mode, st.st_uid, sorted(os.listdir(path))


def test_tls_never_changes_a_directory_it_did_not_make(tmp_path):
    """``--out /tmp`` (what made /tmp 0700 when run as root), a shared or non-empty directory, a symbolic
    link, and an ``--out`` that is the CA's folder or inside it are refused, and left as they were."""
    import tempfile

    tlsconf.write_ca(tmp_path / "ca")
    shared, full, real = tmp_path / "shared", tmp_path / "full", tmp_path / "real"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    full.mkdir(mode=0o700)
    (full / "notes.txt").write_text("x")
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    cases = {Path(tempfile.gettempdir()): "it is", shared: "mode 0755", full: "not empty",
             tmp_path / "link": "a symbolic link", tmp_path / "ca": "outside the CA",
             tmp_path / "ca" / "hosts" / "a": "outside the CA"}
    for out, says in cases.items():
        before = _modes(out) if out.exists() else None
        with pytest.raises(ValidationError) as e:
            tlsconf.write_host_cert(tmp_path / "ca", "h", out, role="server")
        assert e.value.field == "--out" and says in str(e.value), (out, str(e.value))
        assert (_modes(out) if out.exists() else None) == before, out
        if out.exists() and out != tmp_path / "ca":
            with pytest.raises(ValidationError):
                tlsconf.write_ca(out)
            assert (_modes(out) if out.exists() else None) == before, out
    assert sorted(os.listdir(tmp_path / "ca")) == ["ca-key.pem", "ca.pem"]
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    os.chmod(empty, 0o700)
    tlsconf.write_host_cert(tmp_path / "ca", "h", empty, role="client")  # an empty private one is taken
    made = tlsconf.write_host_cert(tmp_path / "ca", "h", tmp_path / "new" / "deeper", role="client")
    assert stat.S_IMODE(made.cert.parent.stat().st_mode) == 0o700


def test_tls_commands_write_what_the_help_says(tmp_path, capsys):
    assert main(["tls", "ca", "--out", str(tmp_path / "ca")]) == 0
    assert main(["tls", "cert", "--ca", str(tmp_path / "ca"), "--role", "server", "--name", "sched",
                 "--host", "127.0.0.1", "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert f"--tls-cert {tmp_path / 's' / 'sched.pem'}" in out
    assert sorted(os.listdir(tmp_path / "s")) == ["ca.pem", "sched-key.pem", "sched.pem"]
    with pytest.raises(SystemExit):  # a role is required
        main(["tls", "cert", "--ca", str(tmp_path / "ca"), "--name", "me", "--out", str(tmp_path / "me")])
    assert "--role" in capsys.readouterr().err
    assert main(["tls", "cert", "--ca", str(tmp_path / "ca"), "--role", "driver", "--name", "me",
                 "--out", str(tmp_path / "me")]) != 0
    err = capsys.readouterr().err
    assert "--role" in err and "server" in err and "client" in err and not (tmp_path / "me").exists()


# -- a lab's transport ------------------------------------------------------------------------------------

def test_tcp_is_refused_unless_insecure_and_then_named_insecure():
    with pytest.raises(ValidationError) as e:
        tlsconf.lab_security("tcp://10.0.0.5:8786", tlsconf.LabTls())
    assert e.value.field == "--scheduler" and "--insecure" in str(e.value)
    sec, transport = tlsconf.lab_security("tcp://10.0.0.5:8786", tlsconf.LabTls(insecure=True))
    assert transport == tlsconf.TRANSPORT_INSECURE and "insecure" in transport
    with pytest.raises(ValidationError) as e:
        tlsconf.lab_security("tcp://10.0.0.5:8786", tlsconf.LabTls(ca_file="ca.pem", insecure=True))
    assert e.value.field == "--tls-ca-file"


def test_tls_needs_all_three_files_or_daskss_config(tmp_path):
    import dask

    files = tlsconf.campaign_files(tmp_path / "t")
    with pytest.raises(ValidationError) as e:
        tlsconf.lab_security("tls://h:8786", tlsconf.LabTls(ca_file=str(files.ca_file), cert=str(files.cert)))
    assert e.value.field == "--tls-key"
    with pytest.raises(ValidationError) as e:
        tlsconf.lab_security("tls://h:8786", tlsconf.LabTls(str(files.ca_file), str(files.cert), str(tmp_path / "no")))
    assert e.value.field == "--tls-key"
    with dask.config.set({"distributed.comm.tls.ca-file": None, "distributed.comm.tls.client.cert": None}):
        with pytest.raises(ValidationError) as e:
            tlsconf.lab_security("tls://h:8786", tlsconf.LabTls())
        assert e.value.field == "--tls-ca-file"
    sec, transport = tlsconf.lab_security("tls://h:8786", tlsconf.LabTls(str(files.ca_file), str(files.cert),
                                                                         str(files.key)))
    assert transport == tlsconf.TRANSPORT_TLS and sec.require_encryption and sec.tls_worker_key == str(files.key)
    with dask.config.set({"distributed.comm.tls.ca-file": str(files.ca_file),
                          "distributed.comm.tls.client.cert": str(files.cert),
                          "distributed.comm.tls.client.key": str(files.key)}):
        sec, transport = tlsconf.lab_security("tls://h:8786", tlsconf.LabTls())
    assert transport == tlsconf.TRANSPORT_TLS and sec.tls_client_cert == str(files.cert) and sec.require_encryption


@pytest.mark.parametrize("options, field", [
    (["--scheduler", "tcp://127.0.0.1:8786"], "--scheduler"),
    (["--scheduler", "tls://127.0.0.1:8786"], "--tls-ca-file"),
    (["--testbed", "a", "--testbed", "b", "--tls-cert", "c.pem"], "--tls-cert"),
    (["--insecure"], "--insecure"),
])
def test_campaign_run_refuses_an_unprotected_scheduler_before_anything(options, field, tmp_path, capsys,
                                                                        monkeypatch):
    import dask

    monkeypatch.setenv("BBRLAB_STATE_DIR", str(tmp_path / "state"))
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "ccas": ["cubic"], "timeslices_ms": [10], "cpu_shares_pct": [100],
                                    "rtts_ms": [20], "rates_mbit": [50], "repetitions": 1, "duration_s": 2}))
    with dask.config.set({"distributed.comm.tls.ca-file": None, "distributed.comm.tls.client.cert": None}):
        assert main(["campaign", "run", str(spec), "--out", str(tmp_path / "o"), *options]) == 1
    assert f"{field} = " in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_worker_refuses_tcp_without_insecure(capsys):
    assert main(["worker", "--testbed", "x", "--scheduler", "tcp://127.0.0.1:8786"]) == 1
    err = capsys.readouterr().err
    assert "--scheduler = 'tcp://127.0.0.1:8786'" in err and "--insecure" in err
