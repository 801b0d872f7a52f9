"""Stragglers: rank × collective arrival skew (aligned clocks) and the ranks that make others wait, over the
collectives attribution matched across ranks (by process group and sequence, or by order)."""
from __future__ import annotations

import numpy as np
from bokeh.models import BasicTicker, ColorBar, ColumnDataSource, HoverTool, LinearColorMapper
from bokeh.palettes import Viridis256
from bokeh.plotting import figure

from ninefold.dashboards import queries
from ninefold.dashboards.style import fmt_ns, html_table, note
from ninefold.dashboards.views._common import div, heading

PLOT_NAME = "straggler_heatmap"


def load(con, job: str) -> dict:
    return {"job": job, "matrix": queries.straggler_matrix(con, job), "ranks": queries.straggler_ranks(con, job),
            "straggler_ns": queries.straggler_total(con, job)}


def heatmap(mx):
    src = ColumnDataSource({"col": mx["col"].to_numpy(), "rank": mx["rank"].to_numpy(),
                            "skew_us": mx["skew_ns"].to_numpy() / 1e3, "wait_us": mx["wait_ns"].to_numpy() / 1e3,
                            "label": mx["label"].to_list(), "last": mx["last_rank"].to_numpy()})
    hi = float(max(mx["skew_ns"].max() / 1e3, 1e-3))
    cmap = LinearColorMapper(palette=Viridis256, low=0, high=hi)
    n_r = mx["rank"].n_unique()
    n_c = int(mx["col"].max()) + 1
    p = figure(height=min(900, 140 + 18 * n_r), sizing_mode="stretch_width", name=PLOT_NAME,
               title="arrival skew per collective (µs after the first member arrived)",
               x_range=(-0.5, n_c - 0.5), y_range=(float(mx["rank"].max()) + 0.5, float(mx["rank"].min()) - 0.5),
               tools="xpan,xwheel_zoom,box_zoom,reset,save")
    p.rect(x="col", y="rank", width=1, height=1, source=src, line_color=None,
           fill_color={"field": "skew_us", "transform": cmap})
    p.add_tools(HoverTool(tooltips=[("collective", "@label"), ("rank", "@rank"), ("skew", "@skew_us{0.0} µs"),
                                    ("waited", "@wait_us{0.0} µs"), ("last to arrive", "@last")]))
    p.add_layout(ColorBar(color_mapper=cmap, ticker=BasicTicker(), label_standoff=6, width=10), "right")
    p.xaxis.axis_label = "collective (aligned-time order)"
    p.xaxis.ticker = BasicTicker(min_interval=1)  # integer collective indices only
    p.yaxis.axis_label = "rank"
    if n_r <= 64:
        p.yaxis.ticker = sorted(int(r) for r in np.unique(mx["rank"].to_numpy()))
    return p


def ranks_html(data) -> str:
    r = data["ranks"]
    rows = [[x["rank"], fmt_ns(x["caused_wait_ns"]), x["times_last"], fmt_ns(x["own_wait_ns"]),
             fmt_ns(x["straggler_ns"]), x["collectives"]] for x in r.iter_rows(named=True)]
    return html_table(["rank", "others waited for it", "times last", "own wait", "own straggler",
                       "collectives"], rows)


def render(data):
    head = heading(2, f"Stragglers: {data['job']}")
    mx = data["matrix"]
    if mx.height == 0:
        return [div(head + note("no collective other than point-to-point send/recv matched across ranks (by "
                                "process group and sequence, or by order): no straggler wait"))]
    worst = data["ranks"].row(0, named=True)
    txt = note(f"charged to straggler: {fmt_ns(data['straggler_ns'])} over all ranks; rank {worst['rank']} makes "
               f"others wait most: "
               f"{fmt_ns(worst['caused_wait_ns'])} in total, last to arrive in {worst['times_last']} collectives")
    return [div(head + txt), heatmap(mx), div("<h3 class='nf'>Ranks that make others wait</h3>" + ranks_html(data))]
