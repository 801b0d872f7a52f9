"""Whether a job can be read: is it in the store, does it have ledgers, and if it cannot have any, why.

The one place the command line, the report and the app take these answers from, so every reader says the same
thing about a job it cannot show:

    job_names(con) -> [job, ...]
    not_in_store(con, job, where) -> message | None
    lacks(con, job) -> what the job lacks to be attributed | None
    attributed(con, job) -> bool
    not_attributed(con, job, db=None) -> the message for a job without ledgers: why, or what to run
"""
from __future__ import annotations

from ninefold.store.connection import has_table


def _count(con, table: str, where: str, params) -> int:
    if not has_table(con, table):
        return 0
    return con.execute(f"SELECT count(*) FROM {table} WHERE {where}", params).fetchone()[0]


def job_names(con) -> list[str]:
    """Every job in the store, sorted: those ingested (jobs, traces), those whose every upload failed (uploads:
    the app lists them) and those with ledgers (a store holding only results)."""
    have = [t for t in ("jobs", "traces", "uploads", "ledger_totals") if has_table(con, t)]
    if not have:
        return []
    union = " UNION ".join(f"SELECT DISTINCT job FROM {t}" for t in have)
    return [r[0] for r in con.execute(f"SELECT job FROM ({union}) ORDER BY job").fetchall()]


def not_in_store(con, job: str, where: str = "the store") -> str | None:
    """The message for a JOB that WHERE (the store's path, or 'the store') does not hold, naming the jobs it
    does hold; None when the job is there."""
    names = job_names(con)
    if job in names:
        return None
    shown = ", ".join(names[:20]) + (f", … ({len(names)} jobs)" if len(names) > 20 else "")
    return f"job {job!r} is not in {where} (jobs: {shown or 'none'})"


def lacks(con, job: str) -> str | None:
    """What JOB lacks that attribution needs: no profiler trace, no GPU op, or steps that are all zero-length;
    None when it lacks none of these."""
    if not _count(con, "traces", "job = ?", [job]):
        return "it has no profiler trace (only logs or dumps): ingest its Kineto JSON or Nsight Systems SQLite files"
    if not _count(con, "gpu_ops", "job = ? AND kind IN ('kernel', 'memcpy', 'memset')", [job]):
        return ("its traces hold no GPU ops (no kernel, memcpy or memset): profile with "
                "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")
    n = _count(con, "steps", "job = ?", [job])
    if n and n == _count(con, "steps", "job = ? AND end_ns <= start_ns", [job]):
        return (f"all {n} of its steps are zero-length (ProfilerStep#N ranges with no duration): nothing falls "
                "inside a step")
    return None


def attributed(con, job: str) -> bool:
    """JOB has ledger totals."""
    return bool(_count(con, "ledger_totals", "job = ?", [job]))


def not_attributed(con, job: str, db: str | None = None) -> str:
    """The one-line message for a JOB with no ledgers in DB (the store's path; None where the reader does not
    know it, as in the app): what it lacks when it cannot have any, else the command that computes them."""
    why = lacks(con, job)
    if why:
        return f"job {job!r} has no attributable steps: {why}"
    where = f"--db {db} " if db else ""
    return (f"job {job!r} is not attributed yet: run `ninefold attribute {where}--job {job}` first"
            + ("" if db else " (or upload it again)"))
