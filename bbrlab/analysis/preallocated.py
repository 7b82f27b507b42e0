"""A table's columns allocated once for at most a known number of rows and filled in place.

Built from chunks, a large table is held twice while they are joined (and freed chunks leave the heap fragmented);
allocated once for an upper bound of its rows (a count of the log's lines) it is held once. The columns come out
in the dtypes the table's schema declares (:mod:`bbrlab.analysis.tables`), the arrays given to pandas as they are:
float64 (missing: NaN), Int64 and boolean (values and a mask), bool, and string (one object per distinct text).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .columns import Column


class Preallocated:
    """The columns of ``schema`` for up to ``capacity`` rows; :meth:`add` a row (a mapping of column to value),
    :meth:`put` a chunk of whole columns, :meth:`frame` the rows filled so far."""

    def __init__(self, schema: tuple[Column, ...], capacity: int):
        self.schema, self.capacity, self.rows = schema, capacity, 0
        self.values: dict[str, np.ndarray] = {}
        self.masks: dict[str, np.ndarray] = {}
        self.texts: dict[str, str] = {}
        for col in schema:
            if col.dtype == "float64":
                self.values[col.name] = np.full(capacity, np.nan)
            elif col.dtype in ("Int64", "boolean"):
                self.values[col.name] = np.zeros(capacity, dtype=np.int64 if col.dtype == "Int64" else bool)
                self.masks[col.name] = np.ones(capacity, dtype=bool)
            elif col.dtype == "bool":
                self.values[col.name] = np.zeros(capacity, dtype=bool)
            elif col.dtype == "string":
                self.values[col.name] = np.full(capacity, pd.NA, dtype=object)
            else:
                raise ValueError(f"column {col.name}: dtype {col.dtype} cannot be preallocated")

    def _text(self, value) -> object:
        if value is None or value is pd.NA:
            return pd.NA
        text = str(value)
        return self.texts.setdefault(text, text)

    def add(self, row: dict) -> None:
        """Fill the next row from ``row`` (a missing key or None is missing)."""
        if self.rows >= self.capacity:
            raise ValueError(f"more than the {self.capacity} rows allocated")
        i = self.rows
        for col in self.schema:
            value = row.get(col.name)
            if col.dtype == "string":
                self.values[col.name][i] = self._text(value)
            elif value is None:
                continue
            elif col.name in self.masks:
                self.values[col.name][i] = value
                self.masks[col.name][i] = False
            else:
                self.values[col.name][i] = value
        self.rows += 1

    def put(self, chunk: pd.DataFrame) -> None:
        """Fill the next ``len(chunk)`` rows from a frame already in the schema's dtypes."""
        lo, hi = self.rows, self.rows + len(chunk)
        if hi > self.capacity:
            raise ValueError(f"more than the {self.capacity} rows allocated")
        for col in self.schema:
            series = chunk[col.name]
            if col.dtype == "string":
                self.values[col.name][lo:hi] = [pd.NA if v is pd.NA else self._text(v)
                                                for v in series.astype(object).tolist()]
            elif col.name in self.masks:
                na = series.isna().to_numpy()
                self.masks[col.name][lo:hi] = na
                self.values[col.name][lo:hi] = series.to_numpy(dtype=self.values[col.name].dtype, na_value=0)
            else:
                self.values[col.name][lo:hi] = series.to_numpy(dtype=self.values[col.name].dtype)
        self.rows = hi

    def frame(self) -> pd.DataFrame:
        """The rows filled so far, in the schema's dtypes (views of the numeric arrays, not copies; the text
        columns converted to the string dtype, and given up here: call it once)."""
        n, columns = self.rows, {}
        for col in self.schema:
            values = self.values[col.name][:n]
            if col.dtype == "Int64":
                columns[col.name] = pd.arrays.IntegerArray(values, self.masks[col.name][:n])
            elif col.dtype == "boolean":
                columns[col.name] = pd.arrays.BooleanArray(values, self.masks[col.name][:n])
            elif col.dtype == "string":  # the table's string dtype (Arrow's where pandas has it): compact
                columns[col.name] = pd.array(values, dtype="string")
                self.values[col.name] = values = None
            else:
                columns[col.name] = values
        return pd.DataFrame(columns, copy=False)
