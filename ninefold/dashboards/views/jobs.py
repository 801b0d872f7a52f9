"""Jobs: every job in the store with its status, step time and largest non-compute ledger."""
from __future__ import annotations

from ninefold.dashboards import queries
from ninefold.dashboards.style import fmt_ns, fmt_pct, html_table, note
from ninefold.dashboards.views._common import div

HEADER = ["job", "ranks", "status", "median step", "steps", "largest non-compute ledger", "its share of rank-step time", "updated", "message"]


def load(con) -> dict:
    return {"jobs": queries.jobs(con)}


def rows(data) -> list[list]:
    return [[r["job"], r["n_ranks"], r["status"], fmt_ns(r["step_ns"]), r["n_steps"] or "–",
             r["worst_ledger"] or "–", fmt_pct(r["worst_share"]) if r["worst_share"] is not None else "–",
             str(r["updated_at"])[:19] if r["updated_at"] else "–", r["message"] or ""]
            for r in data["jobs"].iter_rows(named=True)]


def html(data) -> str:
    if data["jobs"].height == 0:
        return note("no jobs stored yet: upload traces or run ninefold ingest")
    return html_table(HEADER, rows(data), "nf-table nf-jobs")


def render(data):
    return [div("<h2 class='nf'>Jobs</h2>" + html(data))]
