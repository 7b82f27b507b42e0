"""Drawn points a reader cannot see: a figure's points (``points.json``) outside their panel's axis limits, and a
line that says so (issue 31: no figure hides data it was given)."""

from __future__ import annotations


def points_outside_axes(points: list[dict], rel_tol: float = 1e-9) -> list[dict]:
    """The drawn points a reader cannot see: those outside their panel's axis limits.

    Parameters
    ----------
    points : list of dict
        :func:`bbrlab.analysis.facets.plotted_points` of a figure, or a ``points.json`` read back. Panels without ``xlim`` /
        ``ylim`` (files written before the limits were recorded) and reference lines are not checked;
        missing values (None) are not points.
    rel_tol : float, default 1e-9
        A point this close to a limit (relative to the axis span) counts as inside.

    Returns
    -------
    list of dict
        One per hidden point: ``panel`` (its title), ``label`` (the line's), ``x``, ``y``.

    Examples
    --------
    >>> offaxis.points_outside_axes(json.loads(Path("fig05_timeseries.points.json").read_text()))  # doctest: +SKIP
    []
    """
    hidden = []
    for panel in points:
        if "xlim" not in panel or "ylim" not in panel:
            continue
        inside = _inside(panel["xlim"], panel["ylim"], rel_tol)
        for line in panel["lines"]:
            if line.get("reference"):
                continue
            hidden += [{"panel": panel["title"], "label": line["label"], "x": x, "y": y}
                       for x, y in _line_points(line) if x is not None and y is not None and not inside(x, y)]
        for band in panel.get("bands", []):
            hidden += [{"panel": panel["title"], "label": f"{band['label']} ({band['shows']})", "x": x, "y": y}
                       for x, y in [*zip(band["x"], band["low"], strict=True), *zip(band["x"], band["high"], strict=True)]
                       if x is not None and y is not None and not inside(x, y)]
    return hidden


def _line_points(line: dict):
    if "segments" in line:
        return [tuple(p) for seg in line["segments"] for p in seg]
    return list(zip(line["x"], line["y"], strict=True))


def _inside(xlim, ylim, rel_tol: float):
    (x0, x1), (y0, y1) = sorted(xlim), sorted(ylim)
    dx, dy = rel_tol * max(x1 - x0, 1e-300), rel_tol * max(y1 - y0, 1e-300)
    return lambda x, y: x0 - dx <= x <= x1 + dx and y0 - dy <= y <= y1 + dy


def hidden_points_summary(name: str, hidden: list[dict], shown: int = 3) -> str:
    """One line saying how many points of figure ``name`` lie outside their panels, with a few examples."""
    examples = "; ".join(f"{h['panel'] or 'panel'} / {h['label']}: ({h['x']:g}, {h['y']:g})" for h in hidden[:shown])
    return f"{name}: {len(hidden)} drawn points outside their panel's axes, e.g. {examples}"
