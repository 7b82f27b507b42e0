"""The tables' schema: one declaration drives dtypes, the bbrlab row builder and the docs."""

from pathlib import Path

import pandas as pd

from bbrlab.analysis import tables

DOC = Path(__file__).parents[3] / "docs" / "data-and-figures.md"


def test_docs_list_every_column_with_its_unit():
    assert tables.schema_markdown() in DOC.read_text()


def test_columns_missing_from_a_reader_are_empty_with_the_declared_dtype():
    t = tables.build_tables([tables.RunRows({"run_id": "a", "status": "ok", "bbr_version": 3}, [], [])])
    assert list(t.runs.columns) == list(tables.RUN_COLUMNS)
    assert t.runs["bbr_version"].dtype == "Int64" and t.runs.loc[0, "bbr_version"] == 3
    assert pd.isna(t.runs.loc[0, "rtt_ms"]) and t.runs["rtt_ms"].dtype == "float64"
    assert t.runs.loc[0, "patched"] is False or t.runs.loc[0, "patched"] == False  # noqa: E712
    assert t.runs["variant"].dtype == "string"


def test_every_runs_column_says_how_a_bbrlab_record_fills_it():
    assert all(c.of_record is not None for c in tables.RUN_SCHEMA)
    assert len(set(tables.RUN_COLUMNS)) == len(tables.RUN_COLUMNS)
