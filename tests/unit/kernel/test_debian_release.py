"""Issue 35 item 7: a signed index is checked for what it says, not only for who signed it, and nothing is taken
from the mirror without Debian's archive keyring.

The fixture is a real ``InRelease`` (bookworm-security, as Debian's mirror served it, signed by the security
archive's key), verified with ``gpgv`` against this machine's debian-archive-keyring; the checks are then made
at chosen times, so the test does not age with the fixture.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from bbrlab.core import errors
from bbrlab.kernel import debian
from bbrlab.testbed.local import image

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "debian" / "bookworm-security.InRelease"
SUITE = "bookworm-security"

pytestmark = pytest.mark.skipif(not debian.KEYRING.is_file(), reason="needs debian-archive-keyring (make setup)")


@pytest.fixture(scope="module")
def info() -> debian.ReleaseInfo:
    return debian.release_info(FIXTURE.read_text())


def test_the_real_index_verifies_and_says_which_suite_and_until_when(info):
    assert (info.suite, info.codename) == ("oldstable-security", SUITE)
    assert info.valid_until is not None and info.valid_until > info.date  # the security suite's index expires
    text = debian.verify_release(FIXTURE, SUITE, now=info.date + dt.timedelta(hours=1))
    assert "Codename: bookworm-security" in text and "-----BEGIN PGP" not in text  # the signed text only
    debian.verify_release(FIXTURE, "oldstable-security", now=info.date)  # its Suite names it too


def test_an_expired_index_is_refused_though_its_signature_is_good(info):
    with pytest.raises(debian.DebianError, match="InRelease expired: Valid-Until"):
        debian.verify_release(FIXTURE, SUITE, now=info.valid_until + dt.timedelta(seconds=1))  # main: accepted
    debian.verify_release(FIXTURE, SUITE, now=info.valid_until)  # the last second it holds


def test_another_suites_signed_index_is_refused(info):
    with pytest.raises(debian.DebianError, match="is bookworm-security's .*Suite/Codename must name bullseye-security"):
        debian.verify_release(FIXTURE, "bullseye-security", now=info.date)


def test_an_index_older_than_the_one_verified_before_is_a_replay(info):
    with pytest.raises(debian.DebianError, match="older than the one verified here before"):
        debian.verify_release(FIXTURE, SUITE, now=info.date, previous=info.date + dt.timedelta(seconds=1))
    debian.verify_release(FIXTURE, SUITE, now=info.date, previous=info.date)  # the same one again is fine


def test_an_index_dated_ahead_of_the_clock_is_refused(info):
    ahead = dt.timedelta(seconds=debian.RELEASE_FUTURE_SKEW_S + 1)
    with pytest.raises(debian.DebianError, match="ahead of this machine's clock"):
        debian.verify_release(FIXTURE, SUITE, now=info.date - ahead)


def test_a_changed_byte_fails_the_signature(tmp_path, info):
    changed = tmp_path / "InRelease"
    changed.write_text(FIXTURE.read_text().replace("Codename: bookworm-security", "Codename: bookworm-securitY"))
    with pytest.raises(debian.DebianError, match="does not verify"):
        debian.verify_release(changed, SUITE, now=info.date)


def test_unreadable_or_missing_fields_are_named():
    with pytest.raises(debian.DebianError, match="no Codename field"):
        debian.release_info("Suite: stable\nDate: Sat, 11 Jul 2026 10:16:37 UTC\n")
    with pytest.raises(debian.DebianError, match="Valid-Until is not an RFC 2822 date"):
        debian.release_info("Suite: s\nCodename: c\nDate: Sat, 11 Jul 2026 10:16:37 UTC\nValid-Until: soon\n")


def test_without_the_keyring_nothing_is_downloaded(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    missing = tmp_path / "no-keyring.gpg"
    with pytest.raises(debian.DebianError, match=f"archive keyring {missing} is missing.*debian-archive-keyring"):
        debian.suite_index("bullseye", keyring=missing)  # main: downloaded InRelease first
    assert not (tmp_path / "bbrlab").exists()  # not even the cache folder: nothing was fetched


def test_the_guest_image_is_not_built_without_the_keyring(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    missing = tmp_path / "no-keyring.gpg"
    with pytest.raises(errors.TestbedError, match=f"not building the guest image: .*{missing} is missing"):
        image.build_image(keyring=missing)  # main: debootstrap only warns and installs unchecked
    assert not (tmp_path / "bbrlab").exists()  # no work folder, no download


def test_debootstrap_is_told_to_check_the_release_with_the_keyring():
    argv = image.debootstrap_argv({"packages": ["iperf3"], "suite": "bookworm", "mirror": image.MIRROR},
                                  Path("/x"), debian.KEYRING)
    assert f"--keyring={debian.KEYRING}" in argv and "--force-check-gpg" in argv
    assert argv.index("--force-check-gpg") < argv.index("bookworm")  # options before the suite
