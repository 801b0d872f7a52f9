"""The batch catalog: history tables, one-transaction loads of finished jobs (with each night's step samples,
for the diff against the next night: ninefold.batch.diff), pruning of the Parquet store, and each job's ledger
share moves against its previous night."""
from __future__ import annotations

from pathlib import Path

from ninefold.analysis.ledgers import LEDGERS
from ninefold.store.connection import abort

from ninefold.batch.diff import drop_step_samples, ensure_sample_tables, store_step_samples
from ninefold.batch.jobs import JobSpec
from ninefold.batch.tasks import parquet_root, state_root

# Ledgers whose share growing is reported as a share move (compute's share growing is the job getting better).
REGRESSION_LEDGERS = tuple(n for n in LEDGERS if n != "compute")

BATCH_DDL = {
    "batch_nights": """night VARCHAR PRIMARY KEY, seq INTEGER NOT NULL, started_at TIMESTAMP""",
    "batch_runs": """night VARCHAR NOT NULL, job VARCHAR NOT NULL, job_key VARCHAR, status VARCHAR NOT NULL,
                     error VARCHAR, n_files INTEGER, ranks INTEGER, steps INTEGER, seconds DOUBLE,
                     finished_at TIMESTAMP, PRIMARY KEY (night, job)""",
    "batch_shares": """night VARCHAR NOT NULL, job VARCHAR NOT NULL, ledger VARCHAR NOT NULL, share DOUBLE,
                       ns BIGINT, PRIMARY KEY (night, job, ledger)""",
    # each job's top kernels by lost time per night (ninefold.batch.tasks.lost_kernels); pos 0 (kernel NULL) holds
    # the reason there are none, or what the rows leave out
    "batch_lost_kernels": """night VARCHAR NOT NULL, job VARCHAR NOT NULL, pos INTEGER NOT NULL, kernel VARCHAR,
                             kclass VARCHAR, calls BIGINT, time_ns BIGINT, lost_ns BIGINT, efficiency DOUBLE,
                             unit VARCHAR, reason VARCHAR, PRIMARY KEY (night, job, pos)""",
    # the Parquet parts whose rows the catalog holds: the shared store is pruned to exactly these
    "batch_parts": """job VARCHAR NOT NULL, path VARCHAR NOT NULL, PRIMARY KEY (job, path)""",
}


def ensure_batch_tables(con) -> None:
    from ninefold.analysis.attribution.attribute import _ensure_tables

    _ensure_tables(con)
    for t, cols in BATCH_DDL.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {t} ({cols})")
    ensure_sample_tables(con)


def _night_seq(con, night: str) -> int:
    row = con.execute("SELECT seq FROM batch_nights WHERE night = ?", [night]).fetchone()
    if row:
        return row[0]
    seq = con.execute("SELECT coalesce(max(seq), 0) + 1 FROM batch_nights").fetchone()[0]
    con.execute("INSERT INTO batch_nights VALUES (?, ?, current_timestamp)", [night, seq])
    return seq


def _job_tables(con) -> list[str]:
    rows = con.execute("""SELECT table_name FROM information_schema.columns
                          WHERE column_name = 'job' AND table_schema = 'main'
                          AND table_name NOT LIKE 'batch_%'""").fetchall()
    views = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                       "WHERE table_type = 'VIEW'").fetchall()}
    return sorted({r[0] for r in rows} - views)


def _job_files(res: dict) -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for p in res["parses"]:
        for t, fs in p["files"].items():
            files.setdefault(t, []).extend(fs)
    for t, fs in res["files"].items():
        files.setdefault(t, []).extend(fs)
    return files


def load_jobs_into_catalog(con, night: str, items: list) -> None:
    """Replace each job's rows in the catalog by its Parquet, with its run row and shares: one transaction.

    ITEMS: (JobSpec, attribute/report result, seconds) of jobs that finished together."""
    if not items:
        return
    jobs = [spec.name for spec, _, _ in items]
    by_table: dict[str, list[str]] = {}
    for _, res, _ in items:
        for t, fs in _job_files(res).items():
            by_table.setdefault(t, []).extend(fs)
    con.execute("BEGIN TRANSACTION")
    try:
        for t in _job_tables(con):
            con.execute(f"DELETE FROM {t} WHERE job IN ?", [jobs])
        for t, fs in by_table.items():
            con.execute(f"INSERT INTO {t} BY NAME SELECT * FROM read_parquet(?)", [fs])
        con.execute("INSERT INTO jobs (job, world_size) SELECT job, max(world_size) FROM traces WHERE job IN ? "
                    "GROUP BY job", [jobs])
        con.execute("DELETE FROM batch_shares WHERE night = ? AND job IN ?", [night, jobs])
        con.execute("DELETE FROM batch_parts WHERE job IN ?", [jobs])
        con.execute("DELETE FROM batch_lost_kernels WHERE night = ? AND job IN ?", [night, jobs])
        for spec, res, seconds in items:
            job = spec.name
            leds = sorted(res["shares"])
            con.execute("INSERT INTO batch_shares SELECT ?, ?, unnest(?), unnest(?), unnest(?)",
                        [night, job, leds, [res["shares"][x]["share"] for x in leds],
                         [res["shares"][x]["ns"] for x in leds]])
            _store_lost(con, night, job, res.get("lost_time"))
            con.execute("INSERT INTO batch_parts SELECT ?, unnest(?)",
                        [job, sorted({f for fs in _job_files(res).values() for f in fs})])
            con.execute("INSERT OR REPLACE INTO batch_runs VALUES (?, ?, ?, 'ok', NULL, ?, ?, ?, ?, "
                        "current_timestamp)", [night, job, spec.key, len(spec.files), res["ranks"], res["steps"],
                                               seconds])
        store_step_samples(con, night, jobs)
        con.execute("COMMIT")
    except BaseException as e:
        abort(con, e, "the night's results")
        raise


def _store_lost(con, night: str, job: str, lost: dict | None) -> None:
    if lost is None:     # a result from before the table existed: the index shows the last night that has it
        return
    rows = lost.get("rows") or []
    if lost.get("reason") or not rows:
        con.execute("INSERT INTO batch_lost_kernels (night, job, pos, reason) VALUES (?, ?, 0, ?)",
                    [night, job, lost.get("reason") or "no kernel with a known lost time"])
    if not rows:
        return
    con.executemany("INSERT INTO batch_lost_kernels VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                    [[night, job, i + 1, r["kernel"], r["kclass"], r["calls"], r["time_ns"], r["lost_ns"],
                      r["efficiency"], r["unit"]] for i, r in enumerate(rows)])


def lost_kernels_of(con, job: str, night: str) -> tuple[str | None, list[dict], str | None]:
    """JOB's kernels by lost time on NIGHT or, when it has none then (unchanged, failed), on its latest earlier
    night that has them: (that night or None, rows, the reason there are none or what they leave out)."""
    got = con.execute("""SELECT l.night FROM batch_lost_kernels l JOIN batch_nights n USING (night)
                         WHERE l.job = ? AND n.seq <= (SELECT seq FROM batch_nights WHERE night = ?)
                         ORDER BY n.seq DESC LIMIT 1""", [job, night]).fetchone()
    if not got:
        return None, [], None
    cur = con.execute("""SELECT kernel, kclass, calls, time_ns, lost_ns, efficiency, unit, reason
                         FROM batch_lost_kernels WHERE job = ? AND night = ? ORDER BY pos""", [job, got[0]])
    cols = [d[0] for d in cur.description]
    rows = [dict(zip(cols, r)) for r in cur.fetchall()]
    reason = next((r["reason"] for r in rows if r["kernel"] is None), None)
    return got[0], [{k: v for k, v in r.items() if k != "reason"} for r in rows if r["kernel"] is not None], reason


def load_job_into_catalog(con, night: str, spec: JobSpec, res: dict, seconds: float) -> None:
    load_jobs_into_catalog(con, night, [(spec, res, seconds)])


def record_failure(con, night: str, spec: JobSpec, error: str, seconds: float = 0.0) -> None:
    con.execute("INSERT OR REPLACE INTO batch_runs VALUES (?, ?, ?, 'failed', ?, ?, NULL, NULL, ?, current_timestamp)",
                [night, spec.name, spec.key if spec.error is None else None, error, len(spec.files), seconds])
    con.execute("DELETE FROM batch_shares WHERE night = ? AND job = ?", [night, spec.name])
    con.execute("DELETE FROM batch_lost_kernels WHERE night = ? AND job = ?", [night, spec.name])
    drop_step_samples(con, night, spec.name)


def committed_parts(con, job: str) -> set[str]:
    return {r[0] for r in con.execute("SELECT path FROM batch_parts WHERE job = ?", [job]).fetchall()}


def collect_garbage(db: Path, job: str, keep: set[str], key: str | None) -> int:
    """Remove JOB's Parquet parts, markers and work files that the committed catalog does not use.

    Run once the job's tasks are over: after its new rows are committed (KEEP = the new parts), or after it
    failed (KEEP = the parts of its last committed run), so globbing the store never shows half a job."""
    removed = 0
    proot = parquet_root(db)
    if proot.is_dir():
        for tdir in proot.iterdir():
            jdir = tdir / f"job={job}"
            if not jdir.is_dir():
                continue
            for f in jdir.rglob("*.parquet"):
                if str(f) not in keep:
                    f.unlink(missing_ok=True)
                    removed += 1
            for f in jdir.rglob(".*.tmp-*"):     # left by a task whose process was killed mid-write
                f.unlink(missing_ok=True)
    keep_markers = ({f"attr-{key}.json", f"report-{key}.json"} if key else set()) | {
        f"parse-{Path(f).name[len('part-'):-len('.parquet')]}.json" for f in keep if Path(f).name.startswith("part-")}
    mdir = state_root(db) / "done" / job
    if mdir.is_dir():
        for f in mdir.iterdir():
            if f.name not in keep_markers:
                f.unlink(missing_ok=True)
    wdir = state_root(db) / "work"
    if wdir.is_dir():
        for f in wdir.glob(f"{job}-*.duckdb*"):
            f.unlink(missing_ok=True)
    return removed


def regressions_for(con, night: str, points: float) -> list[dict]:
    """Jobs of NIGHT whose share of a non-compute ledger grew by more than POINTS against their previous run: the
    raw share moves, reported beside the diff (they do not set the exit code: ninefold.batch.diff does)."""
    led_list = ", ".join(f"'{n}'" for n in REGRESSION_LEDGERS)
    rows = con.execute(f"""
        WITH cur AS (SELECT r.job, n.seq FROM batch_runs r JOIN batch_nights n USING (night)
                     WHERE r.night = ? AND r.status = 'ok'),
             prev AS (SELECT cur.job, arg_max(r.night, n.seq) AS night FROM cur
                      JOIN batch_runs r ON r.job = cur.job AND r.status = 'ok'
                      JOIN batch_nights n ON n.night = r.night AND n.seq < cur.seq
                      GROUP BY cur.job)
        SELECT c.job, c.ledger, p.night, p.share, c.share, 100 * (c.share - p.share) AS delta
        FROM batch_shares c JOIN prev ON prev.job = c.job
        JOIN batch_shares p ON p.job = c.job AND p.night = prev.night AND p.ledger = c.ledger
        WHERE c.night = ? AND c.ledger IN ({led_list}) AND 100 * (c.share - p.share) > ?
        ORDER BY delta DESC""", [night, night, points]).fetchall()
    return [{"job": j, "ledger": led, "previous_night": pn, "previous_pct": round(100 * ps, 3),
             "current_pct": round(100 * cs, 3), "delta_points": round(d, 3)} for j, led, pn, ps, cs, d in rows]
