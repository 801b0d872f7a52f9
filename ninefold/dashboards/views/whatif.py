"""What if: every single-ledger removal replayed on the step graphs and ranked by the step time it saves, the
critical path of the selected step by ledger and rank, and the cost model's predicted step beside them."""
from __future__ import annotations

from ninefold.dashboards import queries
from ninefold.dashboards.style import esc, fmt_ns, fmt_pct, html_table, note
from ninefold.dashboards.views._common import div


def step_path(con, job: str, step: int | None):
    """The critical path of STEP: the stored rows, else computed (not stored: the app reads only). Rows of
    (rank, kind, op_name, start_ns, end_ns relative to the step's start, ledger); None when not attributed."""
    from ninefold.analysis.critical_path import CriticalPathError, critical_path

    if step is None:
        return None
    if queries.has_table(con, "critical_path"):
        rows = con.execute("SELECT rank, kind, op_name, aligned_start_ns, aligned_end_ns, ledger FROM critical_path "
                           "WHERE job = ? AND step = ? ORDER BY seq", [job, step]).fetchall()
        if rows:
            t0 = rows[0][3]
            return [(r, k, op, s - t0, e - t0, led) for r, k, op, s, e, led in rows]
    try:
        res = critical_path(con, job, steps={step}, store=False)
    except CriticalPathError:
        return None
    if not res["rows"]:
        return None
    r = res["rows"][0]
    t0 = int(r["aligned_start_ns"][0])
    return list(zip(r["rank"].tolist(), r["kind"], list(r["op_name"]), (r["aligned_start_ns"] - t0).tolist(),
                    (r["aligned_end_ns"] - t0).tolist(), r["ledger"]))


def _predicted(con, job):
    if not queries.has_table(con, "predicted_ledgers"):
        return None
    row = con.execute("""SELECT config_sha, max(ns) FROM (SELECT config_sha, rank, step, sum(ns) AS ns
                         FROM predicted_ledgers WHERE job = ? GROUP BY ALL) GROUP BY config_sha
                         ORDER BY config_sha LIMIT 1""", [job]).fetchall()
    row = row[0] if row else None
    return None if row is None else {"config_sha": row[0], "step_ns": int(row[1])}


def load(con, job: str, step: int | None = None) -> dict:
    from ninefold.analysis.whatif import WhatIfError, rank_removals

    steps = queries.job_steps(con, job)
    if step is None and steps:
        step = steps[len(steps) // 2]
    try:
        removals = rank_removals(con, job)
    except WhatIfError:
        removals = None
    from ninefold.analysis.readiness import attributed, not_attributed

    return {"job": job, "step": step, "steps": steps, "removals": removals, "path": step_path(con, job, step),
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
