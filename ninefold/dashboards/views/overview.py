"""Job overview: the nine ledgers stacked per rank (slowest rank first), measured against predicted."""
from __future__ import annotations

import numpy as np
from bokeh.models import ColumnDataSource, FactorRange, HoverTool, NumeralTickFormatter
from bokeh.plotting import figure
from bokeh.transform import dodge

from ninefold.analysis.cost_model.residual import HEADING as RESIDUAL_HEADING
from ninefold.analysis.ledgers import LEDGERS
from ninefold.dashboards import queries
from ninefold.dashboards.style import LEDGER_COLORS, PALETTE, PREDICTED_COLOR, esc, fmt_ns, html_table, note
from ninefold.dashboards.views._common import div, heading

PLOT_NAME = "overview_ledgers"


def load(con, job: str) -> dict:
    from ninefold.analysis.readiness import attributed, not_attributed

    return {"job": job, "not_attributed": None if attributed(con, job) else not_attributed(con, job),
            "ranks": queries.job_overview(con, job), "compare": queries.ledger_compare(con, job),
            "predicted": queries.predicted_overview(con, job), "config_sha": queries.prediction_config(con, job),
            "breakdown": queries.ledger_breakdown(con, job), "overlap": queries.comm_overlap(con, job),
            "terms": queries.predicted_terms(con, job)}


def ledger_figure(ranks, height: int = 360):
    """vbar_stack of the nine ledgers (ms per step), one bar per rank at x = position in step-time order.

    Numeric x (not one categorical factor per rank) keeps the axis and the glyphs cheap at 1,000+ ranks."""
    n = ranks.height
    pos = np.arange(n)
    data = {"pos": pos, "rank": ranks["rank"].to_numpy(), "step_ms": ranks["step_ns"].to_numpy() / 1e6}
    for name in LEDGERS:
        data[name] = ranks[name].to_numpy() / 1e6
    src = ColumnDataSource(data)
    p = figure(height=height, sizing_mode="stretch_width", name=PLOT_NAME,
               title=f"ledgers per rank, mean per step ({n} ranks, slowest first)",
               x_range=(-0.5, max(n, 1) - 0.5), tools="xpan,xwheel_zoom,box_zoom,reset,save",
               output_backend="canvas")
    p.vbar_stack(list(LEDGERS), x="pos", width=0.9 if n < 200 else 1.0, color=PALETTE, source=src,
                 legend_label=list(LEDGERS), line_width=0 if n >= 200 else 0.5)
    p.add_tools(HoverTool(tooltips=[("rank", "@rank"), ("step", "@step_ms{0.000} ms")]
                          + [(name, f"@{name}{{0.000}} ms") for name in LEDGERS]))
    p.xaxis.axis_label = "ranks by step time (slowest left); hover for the rank"
    p.yaxis.axis_label = "ms per step"
    p.legend.orientation = "horizontal"
    p.legend.location = "top_right"
    p.legend.label_text_font_size = "9pt"
    p.add_layout(p.legend[0], "below")
    if n <= 64:
        p.xaxis.ticker = list(range(n))
        p.xaxis.major_label_overrides = {i: str(r) for i, r in enumerate(data["rank"])}
        p.xaxis.axis_label = "rank (slowest left)"
    return p


def compare_figure(cmp, height: int = 300):
    """Measured vs predicted ns per ledger, side by side."""
    led = cmp["ledger"].to_list()
    src = ColumnDataSource({"ledger": led, "measured": cmp["measured_ns"].to_numpy() / 1e6,
                            "predicted": cmp["predicted_ns"].fill_null(0).to_numpy() / 1e6,
                            "color": [LEDGER_COLORS[x] for x in led]})
    p = figure(x_range=FactorRange(*led), height=height, sizing_mode="stretch_width",
               title="measured vs predicted, ms per rank-step", tools="save", name="overview_compare")
    p.vbar(x=dodge("ledger", -0.18, range=p.x_range), top="measured", width=0.34, color="color", source=src,
           legend_label="measured")
    p.vbar(x=dodge("ledger", 0.18, range=p.x_range), top="predicted", width=0.34, color=PREDICTED_COLOR,
           source=src, legend_label="predicted", fill_alpha=0.7)
    p.yaxis.formatter = NumeralTickFormatter(format="0.[000]")
    p.add_tools(HoverTool(tooltips=[("ledger", "@ledger"), ("measured", "@measured{0.000} ms"),
                                    ("predicted", "@predicted{0.000} ms")]))
    return p


def compare_html(data) -> str:
    cmp = data["compare"]
    if cmp.height == 0:
        return note(queries.NOT_ATTRIBUTED, "warn")
    has_pred = cmp["predicted_ns"].null_count() < cmp.height
    rows = [[r["ledger"], fmt_ns(r["measured_ns"]), fmt_ns(r["predicted_ns"]), fmt_ns(r["residual_ns"]),
             _pct(r)] for r in cmp.iter_rows(named=True)]
    out = html_table(["ledger", "measured / rank-step", "predicted", "residual", RESIDUAL_HEADING], rows)
    if not has_pred:
        out = note(queries.NO_PREDICTION) + out
    else:
        out = note(f"prediction config {data['config_sha']}") + out + terms_html(cmp, data.get("terms") or {})
    return out


def _pct(r) -> str:
    """A ledger_compare row's residual_pct as the report and `ninefold compare` print it."""
    return "–" if r["residual_pct"] is None else f"{r['residual_pct']:+.1f} %"


def terms_html(cmp, terms: dict) -> str:
    """Each ledger's residual leading to the terms of its prediction (value, source), one <details> a ledger."""
    if not terms:
        return ""
    parts = ["<h3 class='nf'>Where each prediction comes from</h3>",
             note("open a ledger to see the terms its prediction is made of, with their values and sources "
                  "(ninefold compare --explain prints the same)")]
    for r in cmp.iter_rows(named=True):
        ts = terms.get(r["ledger"])
        if not ts:
            continue
        res = f"{_pct(r)} of the measured step"
        rows = [[t["term"], f"{t['value']:.6g}", t["unit"], t["source"]] for t in ts]
        parts.append(f"<details class='nf-terms' data-ledger='{esc(r['ledger'])}'><summary>{esc(r['ledger'])}: "
                     f"measured {esc(fmt_ns(r['measured_ns']))}, predicted {esc(fmt_ns(r['predicted_ns']))}, "
                     f"residual {esc(res)} — {len(ts)} terms</summary>"
                     + html_table(["term", "value", "unit", "source"], rows, css_class="nf-table nf-terms-table")
                     + "</details>")
    return "".join(parts)


def render(data):
    ranks = data["ranks"]
    if ranks.height == 0:
        why = data.get("not_attributed") or queries.NOT_ATTRIBUTED
        return [div(heading(2, f"Overview: {data['job']}") + note(why, "warn"))]
    slow = ranks.row(0, named=True)
    head = (heading(2, f"Overview: {data['job']}")
            + note(f"{ranks.height} ranks; slowest rank {slow['rank']} at {fmt_ns(slow['step_ns'])} per step over "
                   f"{slow['n_steps']} steps"))
    out = [div(head), ledger_figure(ranks)]
    cmp = data["compare"]
    if cmp.height and cmp["predicted_ns"].null_count() < cmp.height:
        out.append(compare_figure(cmp))
    out.append(div(compare_html(data)))
    bd = data.get("breakdown")
    if bd is not None and bd.height:
        rows = [[r["ledger"], r["key"], fmt_ns(r["ns"]), f"{100 * r['share']:.1f} %"] for r in bd.iter_rows(named=True)]
        out.append(div("<h3 class='nf'>Where the time went</h3>"
                       + html_table(["ledger", "on", "per rank-step", "share of step time"], rows)))
    ov = [o for o in (data.get("overlap") or []) if o["comm_ns"]]
    if ov:
        rows = [[o["rank"], fmt_ns(o["comm_ns"]), fmt_ns(o["hidden_ns"]), f"{100 * o['overlap']:.1f} %"] for o in ov]
        n = ranks["n_steps"].max()
        out.append(div(f"<h3 class='nf'>Communication hidden under compute, totals over {n} steps</h3>"
                       + note("each rank's communication kernel time summed over its steps (the tables above are "
                              "per rank-step); the overlap share is the same either way")
                       + html_table(["rank", f"comm kernel time over {n} steps",
                                     f"overlapped by compute over {n} steps", "overlap"], rows)))
    return out
