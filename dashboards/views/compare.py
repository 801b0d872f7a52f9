"""Compare two jobs: the nine ledgers side by side with their deltas."""
from __future__ import annotations

from bokeh.models import ColumnDataSource, FactorRange, HoverTool
from bokeh.plotting import figure
from bokeh.transform import dodge

from dashboards import queries
from dashboards.style import LEDGER_COLORS, PREDICTED_COLOR, fmt_ns, html_table, note
from dashboards.views._common import div

PLOT_NAME = "compare_jobs"


def load(con, a: str, b: str) -> dict:
    return {"a": a, "b": b, "cmp": queries.compare_jobs(con, a, b)}


def render(data):
    a, b, cmp = data["a"], data["b"], data["cmp"]
    head = f"<h2 class='nf'>Compare: {a} → {b}</h2>"
    if cmp.height == 0 or (cmp["a_ns"].sum() == 0 and cmp["b_ns"].sum() == 0):
        return [div(head + note(queries.NOT_ATTRIBUTED, "warn"))]
    led = cmp["ledger"].to_list()
    src = ColumnDataSource({"ledger": led, "a": cmp["a_ns"].to_numpy() / 1e6, "b": cmp["b_ns"].to_numpy() / 1e6,
                            "delta": cmp["delta_ns"].to_numpy() / 1e6, "color": [LEDGER_COLORS[x] for x in led]})
    p = figure(x_range=FactorRange(*led), height=320, sizing_mode="stretch_width", name=PLOT_NAME,
               title=f"ms per rank-step: {a} (grey) and {b} (colour)", tools="save")
    p.vbar(x=dodge("ledger", -0.18, range=p.x_range), top="a", width=0.34, color=PREDICTED_COLOR, source=src,
           legend_label=a)
    p.vbar(x=dodge("ledger", 0.18, range=p.x_range), top="b", width=0.34, color="color", source=src,
           legend_label=b)
    p.add_tools(HoverTool(tooltips=[("ledger", "@ledger"), (a, "@a{0.000} ms"), (b, "@b{0.000} ms"),
                                    ("delta", "@delta{+0.000} ms")]))
    rows = [[r["ledger"], fmt_ns(r["a_ns"]), fmt_ns(r["b_ns"]), fmt_ns(r["delta_ns"]),
             "–" if r["delta_pct_of_step"] is None else f"{r['delta_pct_of_step']:+.1f} %"]
            for r in cmp.iter_rows(named=True)]
    return [div(head), p, div(html_table(["ledger", a, b, "delta", f"delta / {a} step"], rows))]
