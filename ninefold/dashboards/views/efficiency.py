"""Efficiency: how far each kernel is from the device's peak, ranked by the time lost to the gap.

The stored ``kernel_efficiency`` rows of the job when ``ninefold efficiency`` (or the batch) wrote them, else
computed on the read-only connection (ninefold.analysis.efficiency.compute_efficiency; nothing is stored by the app).
Per kernel name over every rank: calls, time, the time-weighted efficiency and the lost time; kernels whose
work the trace does not give are listed by the reason, never guessed.
"""
from __future__ import annotations

from bokeh.models import ColumnDataSource, FactorRange, HoverTool
from bokeh.plotting import figure

from ninefold.dashboards.style import LEDGER_COLORS, PREDICTED_COLOR, esc, fmt_ns, html_table, note
from ninefold.dashboards.views._common import div

PLOT_NAME = "efficiency_lost"
TOP = 15


def load(con, job: str) -> dict:
    from ninefold.analysis.efficiency import (EfficiencyError, by_kernel, compute_efficiency, device_line,
                                             resolve_devices, stored_rows)

    rows, source = stored_rows(con, job), "stored by ninefold efficiency"
    try:
        if rows is None:
            rows, devs = compute_efficiency(con, job)
            source = "computed for this view (ninefold efficiency stores it)"
        else:
            devs = resolve_devices(con, job)
        device = device_line(devs)
    except EfficiencyError as e:
        return {"job": job, "error": str(e)}
    return {"job": job, "device": device, "source": source, **by_kernel(rows)}


def _colour(k: dict) -> str:
    """The ledger colour of what the kernel is: a collective (bus bandwidth), a copy, else compute."""
    from ninefold.analysis.efficiency import BUSBW

    if k["unit"] == BUSBW:
        return LEDGER_COLORS["exposed_comm"]
    return LEDGER_COLORS["memcpy"] if k["kclass"] in ("memcpy", "memset") else LEDGER_COLORS["compute"]


def render(data):
    from ninefold.analysis.efficiency import RATE_SCALE, human

    head = f"<h2 class='nf'>Efficiency: {esc(data['job'])}</h2>"
    if data.get("error"):
        return [div(head + note(data["error"], "warn"))]
    ks = data["kernels"]
    txt = note(f"{data['device']}; {fmt_ns(data['total_ns'])} of GPU time over all ranks, "
               f"{fmt_ns(data['known_ns'])} with work the trace's shapes give, of which {fmt_ns(data['lost_ns'])} "
               f"lost against peak ({data['source']}). Lost = time − work / peak: where a faster kernel pays most.")
    out = [div(head + txt)]
    if ks:
        top = ks[:TOP]
        names = [f"{i + 1}. {k['kernel'][:60]}" for i, k in enumerate(top)][::-1]
        src = ColumnDataSource({
            "name": names, "lost": [k["lost_ns"] / 1e6 for k in top][::-1],
            "ideal": [k["ideal_ns"] / 1e6 for k in top][::-1],
            "eff": [100 * (k["efficiency"] or 0) for k in top][::-1],
            "kernel": [k["kernel"] for k in top][::-1], "color": [_colour(k) for k in top][::-1]})
        p = figure(y_range=FactorRange(*names), height=60 + 26 * len(top), sizing_mode="stretch_width",
                   name=PLOT_NAME, title="time per kernel over all ranks: ideal at peak (grey) and lost (colour), ms",
                   tools="save")
        p.hbar_stack(["ideal", "lost"], y="name", height=0.7, color=[PREDICTED_COLOR, "color"], source=src)
        p.add_tools(HoverTool(tooltips=[("kernel", "@kernel"), ("lost", "@lost{0.000} ms"),
                                        ("ideal", "@ideal{0.000} ms"), ("efficiency", "@eff{0.0} %")]))
        p.xaxis.axis_label = "ms over all ranks and steps"
        out.append(p)
        rows = [[k["kernel"] if len(k["kernel"]) <= 70 else k["kernel"][:67] + "...", k["kclass"], k["ranks"],
                 k["calls"], fmt_ns(k["time_ns"]), human(k["achieved"], k["unit"]), human(k["peak"], k["unit"]),
                 RATE_SCALE[k["unit"]][1], "–" if k["efficiency"] is None else f"{100 * k['efficiency']:.1f} %",
                 fmt_ns(k["lost_ns"])] for k in ks[:max(TOP, 30)]]
        table = html_table(["kernel", "class", "ranks", "calls", "time", "achieved", "peak", "unit", "efficiency",
                            "lost"], rows, css_class="nf-table nf-efficiency")
    else:
        table = note("no kernel with known work: the trace records no shapes or sizes the efficiency needs", "warn")
    if data["missing"]:
        table += "<h3 class='nf'>Without known work</h3>" + html_table(
            ["reason", "calls", "time"], [[w, c, fmt_ns(ns)] for w, c, ns in data["missing"][:12]],
            css_class="nf-table nf-efficiency-missing")
    out.append(div(table))
    return out
