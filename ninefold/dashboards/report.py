"""Self-contained offline HTML report of one job: every view, BokehJS and CSS inline, no network needed. A job
without ledgers gets the header saying why (what it lacks, or what to run), its efficiency, memory and
diagnostics, and none of the views built on ledgers.

    write_report(db_path, job, out_path, con=None) -> Path
"""
from __future__ import annotations

import datetime as _dt
import os
import tempfile
from pathlib import Path

from bokeh.embed import file_html
from bokeh.layouts import column
from bokeh.resources import INLINE

from ninefold.dashboards import queries
from ninefold.dashboards.style import esc, fmt_ns, fmt_pct, html_table, ledger_legend_html, note
from ninefold.dashboards.views import efficiency, memory, moe, overview, pipeline, stragglers, timeline, whatif
from ninefold.dashboards.views._common import div
from ninefold.store.connection import connect
from ninefold.store.errors import NinefoldError

REPORT_ROOT = "ninefold_report"


class UnknownJob(NinefoldError):
    pass


def load_all(con, job: str, timeline_rows: int = 20_000, db=None) -> dict:
    """Everything the report shows, through the named queries on one read-only connection; "not_attributed" is
    the line saying why the job has no ledgers (None when it has them; DB, the store's path, goes into the
    command it names), and the ledger views are then not loaded."""
    from ninefold.analysis.readiness import attributed, not_attributed, not_in_store

    known = queries.jobs(con)
    missing = not_in_store(con, job)
    if missing:
        raise UnknownJob(missing)
    data = {
        "job": job,
        "summary": queries.job_summary(con, job),
        "status": known.filter(known["job"] == job).row(0, named=True),
        "not_attributed": None if attributed(con, job) else not_attributed(con, job, str(db or "STORE")),
        "efficiency": efficiency.load(con, job),
        "memory": memory.load(con, job),
        "diagnostics": queries.diagnostics(con, job),
    }
    if data["not_attributed"] is None:
        data.update(overview=overview.load(con, job), timeline=timeline.load(con, job, max_rows=timeline_rows),
                    stragglers=stragglers.load(con, job), moe=moe.load(con, job), pipeline=pipeline.load(con, job),
                    whatif=whatif.load(con, job))
    return data


def _header(data) -> str:
    s, st = data["summary"], data["status"]
    facts = [["ranks", s["ranks"]], ["world size", s["world_size"] or "–"], ["device", s["device"] or "–"],
             ["backend", s["backend"] or "–"], ["NCCL", s["nccl_version"] or "–"],
             ["steps", ", ".join(map(str, s["steps"])) or "–"], ["status", st["status"]],
             ["median step", fmt_ns(st["step_ns"])],
             ["largest non-compute ledger", (f"{st['worst_ledger']} ({fmt_pct(st['worst_share'])} of all rank-step time)"
                                             if st["worst_ledger"] else "–")],
             ["trace events", s["events"]]]
    made = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    why = data.get("not_attributed")
    title = esc(data["job"]) + (" (not attributed)" if why else "")
    return (f"<h1 class='nf'>ninefold report: {title}</h1>" + (note(why, "warn") if why else "")
            + html_table(["", ""], facts) + note(f"generated {made}") + ledger_legend_html())


def _diagnostics(data) -> str:
    d = data["diagnostics"]
    if d.height == 0:
        return "<h2 class='nf'>Diagnostics</h2>" + note("no diagnostics recorded")
    rows = [["–" if r["rank"] is None else r["rank"], r["source"], r["code"], r["count"], r["example"]]
            for r in d.iter_rows(named=True)]
    return "<h2 class='nf'>Diagnostics</h2>" + html_table(["rank", "source", "code", "count", "example"], rows)


def render(data):
    """The report's Bokeh layout (one column of every section; the ledger views only for an attributed job)."""
    models = [div(_header(data))]
    if data.get("not_attributed") is None:
        models += overview.render(data["overview"])
        models += timeline.render(data["timeline"])
        models += whatif.render(data["whatif"])
        models += stragglers.render(data["stragglers"])
        models += moe.render(data["moe"])
        models += pipeline.render(data["pipeline"])
    models += efficiency.render(data["efficiency"])
    models += memory.render(data["memory"])
    models.append(div(_diagnostics(data)))
    return column(*models, sizing_mode="stretch_width", name=REPORT_ROOT)


def write_report(db_path, job: str, out_path, con=None) -> Path:
    """Write ONE self-contained HTML file for JOB (atomically: a temp file renamed into place), read through CON
    when given (the caller's open read connection; the CLI's waits for a busy store as --wait says), else
    through a short read-only connection of its own (the store's connect, which waits for a lock as --wait says)."""
    if con is None:
        if not Path(db_path).exists():
            raise NinefoldError(f"{db_path}: no such DuckDB store (run ninefold ingest first)")
        own = connect(db_path, read_only=True)
        try:
            data = load_all(con=own, job=job, db=db_path)
        finally:
            own.close()
    else:
        data = load_all(con, job, db=db_path)
    html = file_html(render(data), resources=INLINE, title=f"ninefold report: {job}")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(html)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)    # mkstemp makes it private; a report is for sharing
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
