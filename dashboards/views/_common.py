"""Bokeh building blocks shared by the views."""
from __future__ import annotations

import numpy as np
from bokeh.models import ColumnDataSource, Div

from dashboards.style import CSS


def div(html: str, css: str = CSS, **kw) -> Div:
    """A Div with its style: each renders in its own shadow root, so the page's CSS goes with it."""
    kw.setdefault("sizing_mode", "stretch_width")
    return Div(text=f"<style>{css}</style>{html}", **kw)


def source(df, **extra) -> ColumnDataSource:
    """A ColumnDataSource of numpy columns of a polars frame (plus extra computed columns)."""
    data = {c: df[c].to_numpy() for c in df.columns}
    data.update({k: np.asarray(v) for k, v in extra.items()})
    return ColumnDataSource(data)
