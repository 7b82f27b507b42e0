"""The one range check every typed parameter uses: an error that names the field, the value and the allowed
range with its unit, so a bad spec is refused before anything on the testbed changes."""

from __future__ import annotations

from bbrlab.core.errors import ValidationError


def check_range(field_name: str, value, lo, hi, *, lo_open=False, hi_open=False, unit="") -> None:
    """Raise :class:`ValidationError` naming ``field_name`` and the allowed range unless ``lo <= value <= hi``
    (``lo_open``/``hi_open``: strict); booleans and non-numbers are refused as such."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field_name, value, f"a number{(' in ' + unit) if unit else ''}")
    lo_ok = value > lo if lo_open else value >= lo
    hi_ok = value < hi if hi_open else value <= hi
    if not (lo_ok and hi_ok):
        lo_s = "<" if lo_open else "<="
        hi_s = "<" if hi_open else "<="
        name = field_name.rsplit(".", 1)[-1]
        raise ValidationError(field_name, value, f"{lo} {lo_s} {name} {hi_s} {hi}{(' ' + unit) if unit else ''}")
