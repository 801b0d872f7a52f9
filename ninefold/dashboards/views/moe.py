"""MoE drill-down: per-rank all-to-all bytes, time and wait, expert GEMM time, and the slowest rank's ledgers
against the mean; the predicted busiest-rank makespan when a prediction is stored. The all-to-alls are those
attribution stored (queries.all_to_alls); a one-rank job shows its dispatch/combine and expert GEMM time alone."""
from __future__ import annotations

from bokeh.layouts import gridplot
from bokeh.models import ColumnDataSource, FactorRange, HoverTool
from bokeh.plotting import figure
from bokeh.transform import dodge

from ninefold.dashboards import queries
from ninefold.dashboards.style import LEDGER_COLORS, PREDICTED_COLOR, fmt_bytes, fmt_ns, html_table, note
from ninefold.dashboards.views._common import div, heading

PLOT_NAME = "moe_ranks"


def load(con, job: str) -> dict:
    d = queries.moe(con, job)
    d["job"] = job
    return d


def _bar(ranks, col, title, scale, unit, slowest, name=None):
    r = ranks["rank"].to_numpy()
    src = ColumnDataSource({"rank": [str(x) for x in r], "v": ranks[col].to_numpy() / scale,
                            "color": ["#d62728" if x == slowest else "#1f77b4" for x in r]})
    p = figure(x_range=FactorRange(*[str(x) for x in r]), height=240, sizing_mode="stretch_width", title=title,
               tools="save,reset", name=name)
    p.vbar(x="rank", top="v", width=0.8, color="color", source=src)
    p.add_tools(HoverTool(tooltips=[("rank", "@rank"), (title, f"@v{{0.000}} {unit}")]))
    p.yaxis.axis_label = unit
    p.xaxis.axis_label = "rank" if len(r) <= 64 else "rank (red: slowest)"
    if len(r) > 64:
        p.xaxis.major_label_text_font_size = "0pt"
    return p


def ledgers_figure(led, slowest):
    names = led["ledger"].to_list()
    src = ColumnDataSource({"ledger": names, "slowest": led["slowest_ns"].fill_null(0).to_numpy() / 1e6,
                            "mean": led["mean_ns"].to_numpy() / 1e6, "color": [LEDGER_COLORS[n] for n in names]})
    p = figure(x_range=FactorRange(*names), height=280, sizing_mode="stretch_width", tools="save",
               title=f"rank {slowest} against the mean over ranks, ms per step", name="moe_ledgers")
    p.vbar(x=dodge("ledger", -0.18, range=p.x_range), top="slowest", width=0.34, color="color", source=src,
           legend_label=f"rank {slowest}")
    p.vbar(x=dodge("ledger", 0.18, range=p.x_range), top="mean", width=0.34, color=PREDICTED_COLOR, source=src,
           legend_label="mean", fill_alpha=0.7)
    p.add_tools(HoverTool(tooltips=[("ledger", "@ledger"), (f"rank {slowest}", "@slowest{0.000} ms"),
                                    ("mean", "@mean{0.000} ms")]))
    return p


def render(data):
    head = heading(2, f"MoE: {data['job']}")
    ranks = data["ranks"]
    if data["slowest"] is None:
        return [div(head + note("no all-to-all collectives in this job: nothing to drill into"))]
    s = data["slowest"]
    row = ranks.filter(ranks["rank"] == s).row(0, named=True)
    mean_gemm = float(ranks["expert_gemm_ns"].mean())
    a2a = (f"all-to-all {fmt_ns(row['a2a_ns'])} in {row['a2a_count']} calls, "
           + (f"received {fmt_bytes(row['a2a_out_bytes'])}" if row["a2a_sized"] else "sizes not recorded"))
    if data.get("one_rank"):
        facts = (f"one rank: no cross-rank comparison. Rank {s}: {a2a} (dispatch/combine); expert GEMM "
                 f"{fmt_ns(row['expert_gemm_ns'])} in {row['expert_gemms']} kernels")
    else:
        facts = (f"slowest MoE rank {s}: expert GEMM {fmt_ns(row['expert_gemm_ns'])} (mean {fmt_ns(mean_gemm)}), "
                 f"{a2a}, waited "
                 f"{fmt_ns(row['a2a_wait_ns'])}; last to arrive in {row['times_last']} all-to-alls")
    if data["predicted_makespan_ns"] is None:
        pred = note(queries.NO_PREDICTION)
    else:
        pred = note(f"predicted busiest-rank makespan {fmt_ns(data['predicted_makespan_ns'])} per step; measured "
                    f"{fmt_ns(data['measured_makespan_ns'])}")
    table = html_table(["rank", "all-to-all calls", "bytes sent", "bytes received", "time", "wait", "expert GEMM",
                        "step"],
                       [[r["rank"], r["a2a_count"], fmt_bytes(r["a2a_bytes"]) if r["a2a_sized"] else "-",
                         fmt_bytes(r["a2a_out_bytes"]) if r["a2a_sized"] else "-",
                         fmt_ns(r["a2a_ns"]),
                         fmt_ns(r["a2a_wait_ns"]), fmt_ns(r["expert_gemm_ns"]), fmt_ns(r["step_ns"])]
                        for r in ranks.iter_rows(named=True)])
    grid = gridplot([[_bar(ranks, "a2a_out_bytes", "all-to-all bytes received", 2 ** 20, "MiB", s, PLOT_NAME),
                      _bar(ranks, "a2a_ns", "all-to-all kernel time", 1e6, "ms", s)],
                     [_bar(ranks, "a2a_wait_ns", "all-to-all wait for the last member", 1e6, "ms", s),
                      _bar(ranks, "expert_gemm_ns", "expert GEMM time", 1e6, "ms", s)]],
                    sizing_mode="stretch_width", toolbar_location="right")
    out = [div(head + note(facts) + pred), grid]
    if data["ledgers"].height:
        out.append(ledgers_figure(data["ledgers"], s))
    out.append(div(table))
    return out
