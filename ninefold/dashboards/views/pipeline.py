"""Pipeline: the stage × time schedule as measured, and its bubble against (p−1)/(m+p−1)."""
from __future__ import annotations

from ninefold.dashboards import queries
from ninefold.dashboards.style import fmt_ns, fmt_pct, html_table, ledger_legend_html, note
from ninefold.dashboards.views._common import div, heading
from ninefold.dashboards.views.timeline import bars_figure

PLOT_NAME = "pipeline_schedule"


def load(con, job: str, step: int | None = None) -> dict:
    d = queries.pipeline(con, job, step)
    d["job"] = job
    return d


def render(data):
    head = heading(2, f"Pipeline: {data['job']}")
    if not data["p"]:
        return [div(head + note("no pipeline send/recv in this job"))]
    p, m = data["p"], data["m"]
    txt = (f"{p} stages, {m} micro-batches per step: bubble formula (p−1)/(m+p−1) = {fmt_pct(data['formula'])}; "
           f"measured (mean non-compute share of a stage's window) = {fmt_pct(data['measured'])}")
    if data.get("predicted") is not None:
        txt += f"; predicted bubble ledger share = {fmt_pct(data['predicted'])}"
    out = [div(head + note(txt) + ledger_legend_html())]
    if data["schedule"].height:
        out.append(bars_figure(data["schedule"], f"schedule of step {data['step']} (stage = rank)",
                               name=PLOT_NAME))
    st = data["stages"]
    if st.height:
        out.append(div(html_table(
            ["stage rank", "window", "compute", "bubble", "idle", "non-compute share", "bubble share"],
            [[r["rank"], fmt_ns(r["window_ns"]), fmt_ns(r["compute_ns"]), fmt_ns(r["bubble_ns"]),
              fmt_ns(r["idle_ns"]), fmt_pct(r["non_compute_fraction"]), fmt_pct(r["bubble_fraction"])]
             for r in st.iter_rows(named=True)])))
    else:
        out.append(div(note(queries.NOT_ATTRIBUTED, "warn")))
    return out
