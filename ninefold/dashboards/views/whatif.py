"""What if: every single-ledger removal replayed on the step graphs and ranked by the step time it saves, the
critical path of the selected step by ledger and rank, and the cost model's predicted step beside them."""
from __future__ import annotations

from ninefold.dashboards import queries
from ninefold.dashboards.style import esc, fmt_ns, fmt_pct, html_table, note
from ninefold.dashboards.views._common import div


def _predicted(con, job):
    """The stored prediction's busiest rank's step (queries.predicted_overview, as the MoE view reads it)."""
    cfg = queries.prediction_config(con, job)
    pred = queries.predicted_overview(con, job, cfg) if cfg else None
    if pred is None or not pred.height:
        return None
    return {"config_sha": cfg, "step_ns": int(pred["predicted_step_ns"].max())}


def load(con, job: str, step: int | None = None) -> dict:
    from ninefold.analysis.critical_path import step_pieces
    from ninefold.analysis.whatif import WhatIfError, rank_removals

    steps = queries.job_steps(con, job)
    if step is None and steps:
        step = steps[len(steps) // 2]
    try:
        removals = rank_removals(con, job)
    except WhatIfError:
        removals = None
    from ninefold.analysis.readiness import attributed, not_attributed

    return {"job": job, "step": step, "steps": steps, "removals": removals, "path": step_pieces(con, job, step),
            "predicted": _predicted(con, job),
            "not_attributed": None if attributed(con, job) else not_attributed(con, job)}


def render(data):
    head = f"<h2 class='nf'>What if: {esc(data['job'])}</h2>"
    rem = data["removals"]
    if not rem:
        return [div(head + note(data.get("not_attributed") or queries.NOT_ATTRIBUTED, "warn"))]
    n = max(len(data["steps"]), 1)
    m = rem[0]["measured_ns"]
    txt = note(f"each change replayed on the steps' dependency graphs (all ranks, launches, streams, collectives' "
               f"last arrivals); measured {fmt_ns(m / n)} per step over {n} steps. Fix first what saves most.")
    rows = [[r["remove"], fmt_ns(r["projected_ns"] / n), fmt_ns(r["saved_ns"] / n),
             f"{r['speedup']:.3f}×" if r["speedup"] else "–",
             "–" if r["ledger_ns"] is None else fmt_ns(r["ledger_ns"] / n)] for r in rem]
    table = html_table(["remove", "projected step", "saved per step", "speed-up", "ledger time per step (all ranks)"],
                       rows, css_class="nf-table nf-whatif")
    pred = data["predicted"]
    if pred:
        best = min(r["projected_ns"] for r in rem) / n
        table += note(f"the cost model (config {pred['config_sha'][:10]}) predicts {fmt_ns(pred['step_ns'])} "
                      f"per step; measured {fmt_ns(m / n)}, the best single removal {fmt_ns(best)}")
    out = head + txt + table
    p = data["path"]
    if p:
        L = sum(e - s for _, _, _, s, e, _ in p) or 1
        led, rk, items = {}, {}, {}
        for r, k, op, s, e, lg in p:
            led[lg] = led.get(lg, 0) + e - s
            rk[r] = rk.get(r, 0) + e - s
            key = (r, lg, op if k in ("op", "transfer") and op else k)
            items[key] = items.get(key, 0) + e - s
        out += f"<h3 class='nf'>Critical path of step {data['step']}: {fmt_ns(L)}</h3>"
        out += note("by ledger: " + ", ".join(f"{k} {fmt_pct(v / L)}" for k, v in
                                            sorted(led.items(), key=lambda kv: -kv[1]))
                    + "; by rank: " + ", ".join(f"rank {k} {fmt_pct(v / L)}" for k, v in
                                              sorted(rk.items(), key=lambda kv: -kv[1])))
        top = sorted(items.items(), key=lambda kv: -kv[1])[:8]
        out += html_table(["share", "rank", "ledger", "what"],
                          [[fmt_pct(v / L), r, lg, (w or "")[:90]] for (r, lg, w), v in top],
                          css_class="nf-table nf-critical-path")
    return [div(out)]
