"""Typed DataFrames of one table: rows (dicts, tuples or frames read in chunks) given exactly a schema's columns
and dtypes, and frames of one table joined a column at a time (the memory of a large run's tables: issue 35)."""

from __future__ import annotations

import pandas as pd

from .columns import Column


def typed_frame(rows, schema: tuple[Column, ...]) -> pd.DataFrame:
    """Rows (dicts or tuples in the schema's order, or a DataFrame, which is changed in place) as a DataFrame of
    exactly the schema's columns and dtypes."""
    frame = rows if isinstance(rows, pd.DataFrame) else \
        pd.DataFrame.from_records(rows, columns=[c.name for c in schema])
    return normalise_frame(frame, schema, copy=False)


def concat_typed(frames: list[pd.DataFrame], schema: tuple[Column, ...]) -> pd.DataFrame:
    """Typed frames of one table end to end, built a column at a time, each column taken out of the parts as it is
    joined (the parts are emptied): at most one column more than the result is held at once, not two copies."""
    if len(frames) == 1:
        return frames[0]
    if not frames:
        return typed_frame([], schema)
    columns = {}
    for col in schema:
        columns[col.name] = pd.concat([f.pop(col.name) for f in frames], ignore_index=True)
    return pd.DataFrame(columns)


def frame_of_parts(parts: list, schema: tuple[Column, ...]) -> pd.DataFrame:
    """One table from the runs' parts in order: consecutive lists of rows become one frame, frames stay as they are."""
    frames, pending = [], []
    for part in parts:
        if isinstance(part, pd.DataFrame):
            if pending:
                frames.append(typed_frame(pending, schema))
                pending = []
            if len(part):
                frames.append(part)
        else:
            pending.extend(part)
    if pending or not frames:
        frames.append(typed_frame(pending, schema))
    return normalise_frame(concat_typed(frames, schema), schema, copy=False)


def _as(series: pd.Series, dtype: str) -> pd.Series:
    if dtype == "float64":
        return pd.to_numeric(series, errors="coerce").astype("float64")
    if dtype == "Int64":
        return pd.to_numeric(series, errors="coerce").astype("Int64")
    if dtype == "bool":
        return series.astype("boolean").fillna(False).astype(bool)
    if dtype == "boolean":
        return series.astype("boolean")
    return series.astype(dtype)


def normalise_frame(df: pd.DataFrame, schema: tuple[Column, ...], copy: bool = True) -> pd.DataFrame:
    """``df`` with the schema's columns, in its order and dtypes (a column already of its dtype is kept as it is);
    ``copy=False`` changes ``df`` itself (for a frame nobody else holds)."""
    if copy:
        df = df.copy()
    for col in schema:
        if col.name not in df.columns:
            df[col.name] = pd.Series(pd.NA, index=df.index, dtype="object")
        if str(df[col.name].dtype) != col.dtype:
            df[col.name] = _as(df[col.name], col.dtype)
    names = [c.name for c in schema]
    return df if list(df.columns) == names else df[names]


def untyped(df: pd.DataFrame, schema: tuple[Column, ...]) -> bool:
    """Whether ``df`` lacks a column of ``schema`` or holds one in another dtype or order."""
    return list(df.columns) != [c.name for c in schema] or any(str(df[c.name].dtype) != c.dtype for c in schema)
