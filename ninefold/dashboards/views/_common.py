"""Bokeh building blocks shared by the views.

Stored text (job, file, kernel, op, process group, device and host names, diagnostics, error messages) is HTML
only through ``esc`` (ninefold.dashboards.style): ``html_table`` and ``note`` escape every cell and line, ``heading``
every title. Bokeh's own text (figure titles, axis and legend labels, factors) is drawn on the canvas, and
hover tooltips are (label, "@field") pairs, which Bokeh fills in as text; no view gives a tooltip an HTML
template or the ``{safe}`` format."""
from __future__ import annotations

import numpy as np
from bokeh.models import ColumnDataSource, Div

from ninefold.dashboards.style import CSS, esc


def div(html: str, css: str = CSS, **kw) -> Div:
    """A Div with its style: each renders in its own shadow root, so the page's CSS goes with it."""
    kw.setdefault("sizing_mode", "stretch_width")
    return Div(text=f"<style>{css}</style>{html}", **kw)


def heading(level: int, text) -> str:
    """An <h1>..<h3> of TEXT, escaped (a title may hold a job's name)."""
    return f"<h{int(level)} class='nf'>{esc(text)}</h{int(level)}>"


def source(df, **extra) -> ColumnDataSource:
    """A ColumnDataSource of numpy columns of a polars frame (plus extra computed columns)."""
    data = {c: df[c].to_numpy() for c in df.columns}
    data.update({k: np.asarray(v) for k, v in extra.items()})
    return ColumnDataSource(data)
