"""Issue 35 item 7 against Debian's mirror: the guest image's debootstrap refuses a Release it cannot check.

debootstrap is run with the image's own command (:func:`bbrlab.testbed.local.image.debootstrap_argv`) but a
keyring that holds only keys Debian retired, as if the mirror's signature were a stranger's: it stops at the
Release check (a fraction of a second: only InRelease is fetched), where without ``--force-check-gpg`` and a
usable keyring it would only have warned.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bbrlab.testbed.local import image

pytestmark = pytest.mark.system

RETIRED_KEYS = Path("/usr/share/keyrings/debian-archive-removed-keys.gpg")


@pytest.mark.skipif(not RETIRED_KEYS.is_file(), reason="needs debian-archive-keyring's removed-keys file")
def test_debootstrap_stops_at_a_release_signed_by_a_key_the_keyring_lacks(tmp_path):
    argv = image.debootstrap_argv({"packages": ["iperf3"], "suite": image.SUITE, "mirror": image.MIRROR},
                                  tmp_path / "root", RETIRED_KEYS)
    argv.insert(1, "--download-only")  # should the check ever pass, fetch rather than install
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0, p.stdout[-2000:]
    assert "Release signed by unknown key" in p.stdout + p.stderr
    assert not list((tmp_path / "root").glob("var/cache/apt/archives/*.deb"))  # no package was fetched
