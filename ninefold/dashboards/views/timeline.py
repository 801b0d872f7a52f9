"""Timeline: one step, ledger-coloured intervals per rank on the aligned clock, downsampled in SQL."""
from __future__ import annotations

import numpy as np
from bokeh.models import ColumnDataSource, HoverTool
from bokeh.plotting import figure

from ninefold.dashboards import queries
from ninefold.dashboards.style import LEDGER_COLORS, fmt_ns, ledger_legend_html, note
from ninefold.dashboards.views._common import div, heading

PLOT_NAME = "timeline"
MAX_ROWS = 20_000


def load(con, job: str, step: int | None = None, max_rows: int = MAX_ROWS, width_px: int = 1600) -> dict:
    steps = queries.job_steps(con, job)
    if step is None and steps:
        step = steps[len(steps) // 2]
    bars = queries.timeline(con, job, step, max_rows=max_rows, width_px=width_px) if step is not None \
        else queries.timeline(con, job, None, max_rows=max_rows)
    from ninefold.analysis.critical_path import step_pieces

    return {"job": job, "step": step, "steps": steps, "bars": bars, "max_rows": max_rows,
            "path": step_pieces(con, job, step)}


def add_path(p, path):
    """The step's critical path over the bars: a black line along each piece on its rank, and a dashed one
    where it moves to another rank."""
    xs, ys, xm, ym = [], [], [], []
    for i, (r, k, op, s, e, led) in enumerate(path):
        xs.append([s / 1e6, e / 1e6])
        ys.append([r, r])
        if i + 1 < len(path) and path[i + 1][0] != r:
            xm.append([e / 1e6, e / 1e6])
            ym.append([r, path[i + 1][0]])
    src = ColumnDataSource({"xs": xs, "ys": ys, "what": [f"{k}: {op}" if op else k for _, k, op, *_ in path],
                            "ledger": [x[5] for x in path], "rank": [x[0] for x in path],
                            "dur": [(x[4] - x[3]) / 1e3 for x in path]})
    line = p.multi_line(xs="xs", ys="ys", source=src, line_color="black", line_width=3, name="critical_path",
                        legend_label="critical path")
    if xm:
        p.multi_line(xs=xm, ys=ym, line_color="black", line_width=1.5, line_dash="dashed")
    p.add_tools(HoverTool(renderers=[line], tooltips=[("critical path", "@what"), ("rank", "@rank"),
                                                      ("ledger", "@ledger"), ("length", "@dur{0.0} µs")]))
    p.legend.location = "top_right"


def bars_figure(bars, title: str, height: int | None = None, name: str = PLOT_NAME):
    ranks = np.unique(bars["rank"].to_numpy())
    n = max(len(ranks), 1)
    src = ColumnDataSource({
        "left": bars["start_ns"].to_numpy() / 1e6, "right": bars["end_ns"].to_numpy() / 1e6,
        "bottom": bars["rank"].to_numpy() - 0.42, "top": bars["rank"].to_numpy() + 0.42,
        "rank": bars["rank"].to_numpy(), "ledger": bars["ledger"].to_list(),
        "color": [LEDGER_COLORS.get(x, "#000") for x in bars["ledger"].to_list()],
        "dur": (bars["end_ns"].to_numpy() - bars["start_ns"].to_numpy()) / 1e3, "n": bars["n"].to_numpy(),
    })
    p = figure(height=height or min(900, 120 + 22 * n), sizing_mode="stretch_width", title=title, name=name,
               tools="xpan,xwheel_zoom,box_zoom,reset,save", active_scroll="xwheel_zoom",
               # rank 0 at the top
               y_range=(float(ranks.max()) + 0.6 if len(ranks) else 0.6,
                        float(ranks.min()) - 0.6 if len(ranks) else -0.6))
    p.quad(left="left", right="right", bottom="bottom", top="top", color="color", line_width=0, source=src)
    p.add_tools(HoverTool(tooltips=[("rank", "@rank"), ("ledger", "@ledger"), ("start", "@left{0.000} ms"),
                                    ("length", "@dur{0.0} µs"), ("intervals", "@n")]))
    p.xaxis.axis_label = "ms from the step's first start (aligned clocks)"
    p.yaxis.axis_label = "rank"
    if n <= 64:
        p.yaxis.ticker = [int(r) for r in ranks]
    return p


def render(data):
    bars = data["bars"]
    head = heading(2, f"Timeline: {data['job']} step {data['step']}")
    if bars.height == 0:
        return [div(head + note(queries.NOT_ATTRIBUTED, "warn"))]
    span = int(bars["end_ns"].max())
    info = note(f"{bars.height} bars (at most {data['max_rows']}, pooled in SQL) over {fmt_ns(span)}; "
                "short intervals are drawn as their bucket's dominant ledger; zoom with the wheel")
    fig = bars_figure(bars, f"step {data['step']}: ledger per rank over time")
    path = data.get("path")
    if path:
        add_path(fig, path)
        ranks = len({r for r, *_ in path})
        info += note(f"the black line is the step's critical path ({len(path)} pieces on {ranks} rank(s)); "
                     "What if says what it is made of")
    return [div(head + info + ledger_legend_html()), fig]
