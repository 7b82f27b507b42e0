"""Findings that cannot drift (issue #36 item 6): every number the prose states about data/ is a registered claim,
recomputed from the committed runs, and printed where the prose says it.

The data folders are read through their parquet caches (``data/*/tables/``, :mod:`bbrlab.analysis.table_cache`),
so after the first ingest the whole check takes a few seconds.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bbrlab.analysis import claims, data

ROOT = Path(__file__).resolve().parents[3]
REGISTRY = ROOT / "docs" / "claims.yaml"


@pytest.fixture(scope="module")
def registry() -> claims.Registry:
    return claims.load_registry(REGISTRY)


@pytest.fixture(scope="module")
def recomputed(registry) -> dict[str, str]:
    return claims.recompute_all(registry, ROOT / "data")


def test_every_claim_recomputes_to_its_printed_value(registry, recomputed):
    differ = [claims.Difference(c.id, c.data, c.value, recomputed[c.id]) for c in registry.claims
              if recomputed[c.id] != c.value]
    assert not differ, "\n" + claims.table(differ)


def test_every_marker_in_the_prose_states_its_claim(registry):
    differ = claims.prose_differences(registry, claims.prose_files(ROOT), ROOT)
    assert not differ, "\n" + claims.table(differ)


def test_every_claim_is_stated_in_the_prose(registry):
    used = {cid for path in claims.prose_files(ROOT) for cid, _ in claims.markers(path.read_text())}
    unused = {c.id for c in registry.claims} - used
    assert not unused, f"registered but stated nowhere: {sorted(unused)}"


def test_every_number_in_the_findings_carries_a_claim(registry):
    found = {str(p.relative_to(ROOT)): claims.unclaimed_numbers(p.read_text(), registry.parameters)
             for p in claims.prose_files(ROOT)}
    found = {k: v for k, v in found.items() if v}
    assert not found, "\n".join(f"{k}: {n}" for k, v in found.items() for n in v)


def test_the_findings_sections_hold_the_named_findings():
    """The sections the issue found stale are findings sections, so the test above covers each of their numbers."""
    text = {p: (ROOT / p).read_text() for p in ("README.md", "data/README.md")}
    sections = {p: "".join(m.group(1) for m in claims.FINDINGS.finditer(t)) for p, t in text.items()}
    for phrase in ("undecided after", "p99", "fq-paced Cubic", "deep queue", "does not bind"):
        assert phrase in sections["README.md"], phrase
    for phrase in ("p99", "recorded 2026-11-26"):
        assert phrase in sections["data/README.md"], phrase


def test_a_stale_number_in_a_copy_of_the_readme_fails(tmp_path, registry):
    """Change one claimed number in a temporary copy of the repository's prose: the check reports it."""
    for rel in ("README.md", "data/README.md", "docs"):
        src, dst = ROOT / rel, tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    readme = tmp_path / "README.md"
    text = readme.read_text()
    claim = registry.by_id()["fq-cubic-25-fq"]
    marked = f"{claim.value}<!-- claim:{claim.id} -->"
    assert marked in text
    readme.write_text(text.replace(marked, f"7.9<!-- claim:{claim.id} -->", 1))
    differ = claims.prose_differences(registry, claims.prose_files(tmp_path), tmp_path)
    assert [(d.claim, d.where, d.recomputed) for d in differ] == [(claim.id, "README.md", claim.value)]
    # an unmarked number inside a findings section is caught too
    readme.write_text(text.replace(marked, "7.9", 1))
    assert any("'7.9'" in n for n in claims.unclaimed_numbers(readme.read_text(), registry.parameters))


def test_a_stale_value_in_a_copy_of_the_registry_fails(tmp_path):
    """A registry whose printed value no longer matches the data: `bbrlab claims check` exits 1 and names it.

    The copy holds the fq-local claims only (one small folder, so the command takes a second or two) and the
    root is an empty folder (no prose), so the one difference is the stale value."""
    lines = REGISTRY.read_text().split("\nclaims:\n")
    fq = [x for x in lines[1].splitlines() if "data: fq-local," in x]
    stale_line = next(x for x in fq if "id: fq-cubic-25-fq," in x)
    stale = tmp_path / "claims.yaml"
    stale.write_text(lines[0] + "\nclaims:\n" + "\n".join(fq).replace(stale_line, stale_line.replace(
        'value: "7.6"', 'value: "7.9"')) + "\n")
    assert claims.load_registry(stale).by_id()["fq-cubic-25-fq"].value == "7.9"
    res = subprocess.run([sys.executable, "-m", "bbrlab.cli.main", "claims", "check", "--root", str(tmp_path),
                          "--registry", str(stale), "--data", str(ROOT / "data")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    [header, row] = res.stdout.splitlines()[:2]
    assert header.split() == ["claim", "where", "stated", "recomputed"]
    assert row.split() == ["fq-cubic-25-fq", "data/fq-local", "7.9", "7.6"]
    good = tmp_path / "good.yaml"
    good.write_text(stale.read_text().replace('value: "7.9"', 'value: "7.6"'))
    res = subprocess.run([sys.executable, "-m", "bbrlab.cli.main", "claims", "check", "--root", str(tmp_path),
                          "--registry", str(good), "--data", str(ROOT / "data")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "recompute to their values" in res.stdout, res.stdout + res.stderr


def test_statistics_on_a_small_table():
    """count, range, interval and its level (n = 2: [min, max] at 50 %), by/across and where, on four runs."""
    import pandas as pd

    runs = pd.DataFrame({"run_id": list("abcd"), "status": "ok", "path": list("abcd"),
                         "q": ["x", "x", "y", "y"], "v": [1.0, 3.0, 10.0, 14.0]})
    tables = data.Tables.of_frames({"runs": runs}, [], [])

    def value(**kw) -> str:
        return claims.recompute(claims.Claim(id="t", data="d", value="?", **kw), tables, Path("."))

    assert value(stat="count", format="d") == "4"
    assert value(stat="range", column="v", select={"q": "y"}) == "10.0-14.0"
    assert value(stat="interval", column="v", select={"q": "x"}) == "1.0-3.0"
    assert value(stat="level", column="v", select={"q": "x"}, format=".0f") == "50"
    assert value(stat="median", column="v", by=("q",), across="range") == "2.0-12.0"
    assert value(stat="fraction", where={"v": {"at_least": 3}}, format=".0f") == "75"
    assert value(stat="count", where={"v": {"below": 3}}, format="d") == "1"
    assert value(stat="median", column="v", select={"q": "z"}) == "(no runs)"


def test_bad_registry_entries_name_the_field(tmp_path):
    with pytest.raises(Exception, match="no such file .*--root"):
        claims.load_registry(tmp_path / "docs" / "claims.yaml")
    bad = tmp_path / "claims.yaml"
    bad.write_text("claims:\n  - {id: a, data: demo, stat: modal, column: v, value: '1'}\n")
    with pytest.raises(Exception, match=r"claims\[0\]\.stat = 'modal'"):
        claims.load_registry(bad)
    bad.write_text("claims:\n  - {id: a, data: demo, stat: median, value: '1'}\n")
    with pytest.raises(Exception, match="needs a column"):
        claims.load_registry(bad)
    bad.write_text("claims:\n  - {id: a, data: demo, stat: calibration, column: inside, value: '1'}\n")
    with pytest.raises(Exception, match="calibration needs against"):
        claims.load_registry(bad)


def test_calibration_claims_on_small_tables():
    """stat calibration: a field of bbrlab compare of the claim's `against` folder held against its `data`."""
    import pandas as pd

    def tables(values: list[float]) -> data.Tables:
        runs = pd.DataFrame({"run_id": [f"r{i}" for i in range(len(values))], "status": "ok", "variant": "X",
                             "cpu_share_pct": [25, 25, 50, 50], "rate_mbit": 100.0, "throughput_mbit": values})
        return data.Tables.of_frames({"runs": runs}, [], [])

    a, b = tables([40.0, 50.0, 60.0, 70.0]), tables([44.0, 46.0, 80.0, 82.0])

    def value(column: str, fmt: str = "d") -> str:
        claim = claims.Claim(id="t", data="a", against="b", stat="calibration", column=column, format=fmt, value="?")
        return claims._calibration(claim, a, b)

    assert (value("matched"), value("inside"), value("fraction", ".2f")) == ("2", "1", "0.50")
    assert value("half_width.all", ".3f") == "0.050" and value("levels.0.level", ".2f") == "0.50"
    with pytest.raises(Exception, match="not a field of bbrlab compare"):
        value("nothing.here")
