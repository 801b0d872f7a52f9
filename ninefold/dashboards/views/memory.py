"""Memory: the predicted byte ledger stacked per rank against the measured peak (when the trace has memory
events)."""
from __future__ import annotations

import numpy as np
from bokeh.models import ColumnDataSource, FactorRange, HoverTool
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from ninefold.dashboards import queries
from ninefold.dashboards.style import fmt_bytes, html_table, note
from ninefold.dashboards.views._common import div, heading

PLOT_NAME = "memory_stack"
NO_MEASURED = "no memory events stored for this job (profile with profile_memory=True to see the measured peak)"


def load(con, job: str) -> dict:
    d = queries.memory(con, job)
    d["job"] = job
    return d


def render(data):
    head = heading(2, f"Memory: {data['job']}")
    pred, meas = data["predicted"], data["measured"]
    notes = []
    if pred.height == 0:
        notes.append(note(queries.NO_PREDICTION))
    if meas.height == 0:
        notes.append(note(NO_MEASURED))
    out = [div(head + "".join(notes))]
    if pred.height == 0 and meas.height == 0:
        return out
    pr = pred.with_columns(pred["rank"].fill_null(-1))
    ranks = sorted(set(pr["rank"].to_list()) | set(meas["rank"].to_list()))
    labels = [("all" if r == -1 else str(r)) for r in ranks]
    items = sorted(set(pr["item"].to_list()))
    data_ = {"rank": labels}
    for it in items:
        sub = dict(zip(pr.filter(pr["item"] == it)["rank"].to_list(), pr.filter(pr["item"] == it)["bytes"].to_list()))
        data_[it] = np.array([sub.get(r, 0) / 2 ** 30 for r in ranks], dtype=float)
    mp = dict(zip(meas["rank"].to_list(), meas["peak_bytes"].to_list()))
    data_["peak"] = np.array([mp.get(r, np.nan) / 2 ** 30 if r in mp else np.nan for r in ranks], dtype=float)
    src = ColumnDataSource(data_)
    p = figure(x_range=FactorRange(*labels), height=340, sizing_mode="stretch_width", name=PLOT_NAME,
               title="predicted bytes by owner (stacked) and measured peak (black)", tools="save,reset")
    if items:
        p.vbar_stack(items, x="rank", width=0.8, source=src, legend_label=items,
                     color=[Category10_10[i % 10] for i in range(len(items))])
    if meas.height:
        p.scatter(x="rank", y="peak", source=src, size=12, marker="dash", color="black", line_width=3,
                  legend_label="measured peak")
    p.add_tools(HoverTool(tooltips=[("rank", "@rank"), ("measured peak", "@peak{0.00} GiB")]
                          + [(it, f"@{{{it}}}{{0.00}} GiB") for it in items]))
    p.yaxis.axis_label = "GiB"
    p.legend.location = "top_left"
    out.append(p)
    rows = [[("all" if r["rank"] is None else r["rank"]), r["item"], fmt_bytes(r["bytes"])]
            for r in pred.iter_rows(named=True)]
    if rows:
        out.append(div(html_table(["rank", "item", "predicted"], rows)))
    return out
