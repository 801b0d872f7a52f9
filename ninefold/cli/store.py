"""The checks every read command makes before it reads, so each says the same thing about the same mistake: the
store exists and opens, the job is in it, the job has ledgers (ninefold.analysis.readiness says why not). Each failure is
a NinefoldError: the command group prints it as one line and exits 2."""
from __future__ import annotations

from pathlib import Path

from ninefold.store.errors import NinefoldError


class NotReady(NinefoldError):
    """The store, the job or its ledgers are not there to read."""


def missing_store(db) -> str:
    return f"no store at {db}: create it with `ninefold ingest TRACES --db {db}`"


def open_store(db, read_only: bool = True):
    """A connection to the existing store DB (never creates one); one line when it is missing or not a store."""
    import duckdb

    from ninefold.store.connection import connect

    if not Path(db).exists():
        raise NotReady(missing_store(db))
    try:
        return connect(db, read_only=read_only)
    except duckdb.Error as e:
        first = " ".join(str(e).splitlines()[0].split()) if str(e) else type(e).__name__
        raise NotReady(f"cannot open {db} as a ninefold store: {first}") from None


def check_job(con, db, job: str) -> None:
    """JOB is in the store DB, else one line naming the jobs it holds."""
    from ninefold.analysis.readiness import not_in_store

    msg = not_in_store(con, job, f"the store {db}")
    if msg:
        raise NotReady(msg)


def check_ledgers(con, db, job: str) -> None:
    """JOB is in DB and has ledgers, else one line: not in the store, what it lacks, or what to run."""
    from ninefold.analysis.readiness import attributed, not_attributed

    check_job(con, db, job)
    if not attributed(con, job):
        raise NotReady(not_attributed(con, job, db))


def open_job(db, jobs, ledgers: bool = True, read_only: bool = True):
    """open_store + check_job (check_ledgers when LEDGERS) for each of JOBS (one name or several); the
    connection is closed when a check fails."""
    con = open_store(db, read_only=read_only)
    try:
        for j in [jobs] if isinstance(jobs, str) else jobs:
            (check_ledgers if ledgers else check_job)(con, db, j)
    except BaseException:
        con.close()
        raise
    return con
