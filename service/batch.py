"""Nightly batch: every job under a drop directory → canonical Parquet, ledgers, one report per job, a trend.

    run_batch(root, db, reports, scheduler="local", workers=N, ...) -> BatchOutcome

Work fans out over Dask distributed as three kinds of task, all pure functions of content-hashed inputs:

* ``parse_task`` (one per trace file): loads the file into a private in-memory DuckDB with the ordinary
  loaders (``ingest.load.load_kineto`` or the registry's loader) and writes each canonical table's rows as
  ``<db dir>/parquet/<table>/job=<job>/rank=<rank>/part-<sha256>.parquet`` (tmp file + rename);
* ``attribute_task`` (one per job): builds a per-job DuckDB from that job's Parquet, runs
  ``analysis.attribution.attribute_job`` and writes the ledger tables as Parquet too;
* ``report_task`` (one per job): ``dashboards.report.write_report`` from the per-job DuckDB.

Each task ends by writing a JSON "done" marker (atomically) under ``<db dir>/batch_state/done/<job>/``; a task
whose marker and outputs exist returns at once, so a batch interrupted anywhere (a worker or the driver killed)
resumes where it stopped. Workers never open the catalog: the driver is its only writer and loads each finished
job's Parquet in one transaction (delete the job's rows, insert the new ones), so the catalog never holds a
job twice or half a job. Superseded Parquet parts of a job are removed once its new rows are committed.

History lives in the catalog too: ``batch_nights`` (label → order), ``batch_runs`` (one row per night and job)
and ``batch_shares`` (ledger share per night, job and ledger). A regression is a job whose share of a
non-compute ledger grew by more than ``regression_points`` percentage points against the job's previous
successful night.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import html
import json
import os
import re
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from analysis.ledgers import LEDGERS
from store.errors import NinefoldError

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_REGRESSION = 3
EXIT_FAILED = 4

# Ledgers whose growth is a regression (compute growing is the job getting better).
REGRESSION_LEDGERS = tuple(n for n in LEDGERS if n != "compute")
LEDGER_TABLES = ("ledger_totals", "ledger_intervals", "step_windows", "clock_offsets", "kernel_classes", "pg_axes",
                 "collective_matches")
NULL_PART = "__HIVE_DEFAULT_PARTITION__"
JOB_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
HISTORY_NIGHTS = 30
FLUSH_JOBS = 16          # finished jobs loaded into the catalog together ...
FLUSH_SECONDS = 15.0     # ... or after this long, whichever comes first

BATCH_DDL = {
    "batch_nights": """night VARCHAR PRIMARY KEY, seq INTEGER NOT NULL, started_at TIMESTAMP""",
    "batch_runs": """night VARCHAR NOT NULL, job VARCHAR NOT NULL, job_key VARCHAR, status VARCHAR NOT NULL,
                     error VARCHAR, n_files INTEGER, ranks INTEGER, steps INTEGER, seconds DOUBLE,
                     finished_at TIMESTAMP, PRIMARY KEY (night, job)""",
    "batch_shares": """night VARCHAR NOT NULL, job VARCHAR NOT NULL, ledger VARCHAR NOT NULL, share DOUBLE,
                       ns BIGINT, PRIMARY KEY (night, job, ledger)""",
    # the Parquet parts whose rows the catalog holds: the shared store is pruned to exactly these
    "batch_parts": """job VARCHAR NOT NULL, path VARCHAR NOT NULL, PRIMARY KEY (job, path)""",
}


class BatchUsageError(NinefoldError):
    """A bad root, manifest, date or scheduler: nothing was processed."""


# ------------------------------------------------------------------ layout

def parquet_root(db: Path) -> Path:
    return Path(db).resolve().parent / "parquet"


def state_root(db: Path) -> Path:
    return Path(db).resolve().parent / "batch_state"


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _copy_parquet(con, sql: str, params: list, out: Path) -> None:
    """COPY a query to OUT through a hidden temporary name in the same directory, then rename."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        con.execute(f"COPY ({sql}) TO '{_sql_str(tmp)}' (FORMAT parquet)", params)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _sql_str(p) -> str:
    return str(p).replace("'", "''")


def _read_marker(path: Path) -> dict | None:
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    files = [f for fs in m.get("files", {}).values() for f in fs]
    if all(Path(f).exists() for f in files):
        return m
    return None


# ------------------------------------------------------------------ worker side

_PRIVATE: dict = {}
_COLUMNS: dict = {}


def _private_con(threads: int):
    """This process's private in-memory DuckDB with the canonical tables (emptied of the previous file)."""
    import duckdb

    from store.schema import create_all

    con = _PRIVATE.get("con")
    if con is None:
        con = duckdb.connect()
        con.execute("SET enable_progress_bar = false")
        create_all(con)
        _PRIVATE["con"] = con
        _PRIVATE["dirty"] = set()
    con.execute(f"SET threads = {int(threads)}")
    for t in _PRIVATE["dirty"]:
        con.execute(f"DELETE FROM {t}")
    _PRIVATE["dirty"] = set()
    return con


def _table_columns(con, table: str) -> list[str]:
    key = (id(con), table)
    if key not in _COLUMNS:
        _COLUMNS[key] = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
    return _COLUMNS[key]


def _export_job_rows(con, job: str, tag: str, proot: Path, tables) -> tuple[dict, dict]:
    """Write the rows of JOB in each table as hive-style Parquet; returns ({table: [files]}, {table: rows})."""
    files: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    tables = [t for t in tables if "job" in _table_columns(con, t)]
    union = " UNION ALL ".join(
        f"SELECT '{t}', " + ("list(DISTINCT rank ORDER BY rank)" if "rank" in _table_columns(con, t) else "NULL")
        + f", count(*) FROM {t} WHERE job = $job" for t in tables)
    for t, ranks, n in con.execute(union, {"job": job}).fetchall():
        if not n:
            continue
        counts[t] = n
        base = proot / t / f"job={job}"
        if ranks is not None:
            for r in ranks:
                out = base / f"rank={NULL_PART if r is None else r}" / f"part-{tag}.parquet"
                if r is None:
                    _copy_parquet(con, f"SELECT * FROM {t} WHERE job = ? AND rank IS NULL", [job], out)
                else:
                    _copy_parquet(con, f"SELECT * FROM {t} WHERE job = ? AND rank = ?", [job, r], out)
                files.setdefault(t, []).append(str(out))
        else:
            out = base / f"part-{tag}.parquet"
            _copy_parquet(con, f"SELECT * FROM {t} WHERE job = ?", [job], out)
            files.setdefault(t, []).append(str(out))
    return files, counts


def parse_task(db: str, job: str, path: str, sha: str, threads: int = 1) -> dict:
    """One trace file → its canonical rows as Parquet. Never raises: an error comes back in the result."""
    t0 = time.perf_counter()
    proot, sroot = parquet_root(Path(db)), state_root(Path(db))
    marker = sroot / "done" / job / f"parse-{sha}.json"
    m = _read_marker(marker)
    if m is not None:
        return {**m, "cached": True, "seconds": 0.0}
    from ingest.load import load_kineto
    from ingest.registry import loader_for
    from store.schema import TABLES

    try:
        con = _private_con(threads)
        f = Path(path)
        ld = loader_for(f)
        _PRIVATE["dirty"] = set(TABLES)      # whatever happens next, empty every table before the next file
        res = ld.load(con, f, job, rank=None, replace=False, salvage=False) if ld else load_kineto(con, f, job)
        res = res if isinstance(res, list) else [res]
        bad = [r for r in res if r.status == "failed"]
        if bad:
            return {"ok": False, "path": path, "sha": sha, "error": bad[0].message}
        ranks = sorted({r.rank for r in res if r.rank is not None})
        files, counts = _export_job_rows(con, job, sha, proot, [t for t in TABLES if t != "jobs"])
        _PRIVATE["dirty"] = set(counts) | {"jobs"}
        out = {"ok": True, "path": path, "sha": sha, "ranks": ranks, "files": files, "counts": counts,
               "format": (ld.name if ld else "kineto"), "messages": [r.message for r in res if r.message]}
        _atomic_write_text(marker, json.dumps(out))
        return {**out, "cached": False, "seconds": time.perf_counter() - t0}
    except NinefoldError as e:
        return {"ok": False, "path": path, "sha": sha, "error": str(e)}
    except Exception as e:  # anything else is still this file's failure, not the batch's
        return {"ok": False, "path": path, "sha": sha, "error": f"{path}: {type(e).__name__}: {e}",
                "traceback": traceback.format_exc()}


def _work_db(db: Path, job: str, key: str) -> Path:
    return state_root(db) / "work" / f"{job}-{key[:16]}.duckdb"


def _build_job_db(db: Path, job: str, key: str, parses: list[dict], threads: int) -> Path:
    """A fresh per-job DuckDB from the job's canonical Parquet, attributed. Returns its path."""
    from analysis.attribution import attribute_job
    from store.connection import connect

    path = _work_db(db, job, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    for p in (path, path.with_name(path.name + ".wal")):
        p.unlink(missing_ok=True)
    con = connect(path)
    try:
        con.execute(f"SET threads = {int(threads)}")
        by_table: dict[str, list[str]] = {}
        for p in parses:
            for t, fs in p["files"].items():
                by_table.setdefault(t, []).extend(fs)
        for t, fs in by_table.items():
            con.execute(f"INSERT INTO {t} BY NAME SELECT * FROM read_parquet(?)", [fs])
        con.execute("INSERT INTO jobs (job, world_size) SELECT ?, max(world_size) FROM traces WHERE job = ?",
                    [job, job])
        attribute_job(con, job)
        con.execute("CHECKPOINT")
    finally:
        con.close()
    return path


def _shares(con, job: str) -> dict[str, dict]:
    """Per ledger: share = ledger ns / step window ns, averaged over ranks and steps; and total ns."""
    ledgers = ", ".join(f"('{n}')" for n in LEDGERS)
    rows = con.execute(f"""
        WITH w AS (SELECT rank, step, end_ns - start_ns AS w FROM step_windows
                   WHERE job = ? AND end_ns > start_ns),
             t AS (SELECT rank, step, ledger, sum(ns) AS ns FROM ledger_totals WHERE job = ? GROUP BY ALL),
             l AS (SELECT * FROM (VALUES {ledgers}) v(ledger))
        SELECT l.ledger, avg(coalesce(t.ns, 0) / w.w), sum(coalesce(t.ns, 0))
        FROM w CROSS JOIN l
        LEFT JOIN t ON t.rank = w.rank AND t.step = w.step AND t.ledger = l.ledger
        GROUP BY l.ledger""", [job, job]).fetchall()
    return {led: {"share": float(s or 0.0), "ns": int(ns or 0)} for led, s, ns in rows}


def attribute_task(db: str, job: str, key: str, parses: list[dict], threads: int = 1) -> dict:
    """A job's parsed files → ledger tables (Parquet) and ledger shares. Never raises."""
    t0 = time.perf_counter()
    base = {"job": job, "key": key, "parses": parses}
    bad = [p for p in parses if not p.get("ok")]
    if bad:
        return {**base, "ok": False, "stage": "parse", "error": "; ".join(p["error"] for p in bad)}
    seen: dict[int, str] = {}
    for p in parses:
        for r in p["ranks"]:
            if r in seen:
                return {**base, "ok": False, "stage": "parse",
                        "error": f"{p['path']}: rank {r} is also in {seen[r]} (one file per rank)"}
            seen[r] = p["path"]
    dbp = Path(db)
    marker = state_root(dbp) / "done" / job / f"attr-{key}.json"
    m = _read_marker(marker)
    if m is not None:
        return {**base, **m, "cached": True, "seconds": 0.0}
    try:
        import duckdb

        work = _build_job_db(dbp, job, key, parses, threads)
        con = duckdb.connect(str(work))
        try:
            con.execute("SET enable_progress_bar = false")
            con.execute(f"SET threads = {int(threads)}")
            proot = parquet_root(dbp)
            files, counts = _export_job_rows(con, job, f"ledgers-{key}", proot, LEDGER_TABLES)
            con.execute("CREATE TEMP TABLE attribution_diagnostics AS "
                        "SELECT * FROM diagnostics WHERE job = ? AND source = 'attribution'", [job])
            out = proot / "diagnostics" / f"job={job}" / f"rank={NULL_PART}" / f"part-attribution-{key}.parquet"
            n = con.execute("SELECT count(*) FROM attribution_diagnostics").fetchone()[0]
            if n:
                _copy_parquet(con, "SELECT * FROM attribution_diagnostics", [], out)
                files["diagnostics"] = [str(out)]
                counts["diagnostics"] = n
            shares = _shares(con, job)
            ranks, steps = con.execute("SELECT count(DISTINCT rank), count(DISTINCT step) FROM step_windows "
                                       "WHERE job = ?", [job]).fetchone()
        finally:
            con.close()
        result = {"ok": True, "files": files, "counts": counts, "shares": shares, "ranks": ranks,
                  "steps": steps, "work_db": str(work)}
        _atomic_write_text(marker, json.dumps(result))
        return {**base, **result, "cached": False, "seconds": time.perf_counter() - t0}
    except NinefoldError as e:
        return {**base, "ok": False, "stage": "attribute", "error": f"{job}: attribution: {e}"}
    except Exception as e:
        return {**base, "ok": False, "stage": "attribute", "error": f"{job}: attribution: {type(e).__name__}: {e}",
                "traceback": traceback.format_exc()}


def report_task(db: str, attr: dict, reports: str, threads: int = 1) -> dict:
    """The job's static HTML report, from its per-job DuckDB (rebuilt from Parquet if it is gone)."""
    if not attr.get("ok"):
        return attr
    t0 = time.perf_counter()
    job, key = attr["job"], attr["key"]
    dbp = Path(db)
    out = Path(reports) / f"{job}.html"
    marker = state_root(dbp) / "done" / job / f"report-{key}.json"
    m = _read_marker(marker)
    if m is not None and out.exists():
        return {**attr, "report": str(out), "report_seconds": 0.0, "report_cached": True}
    try:
        from dashboards.report import write_report

        work = Path(attr["work_db"])
        if not work.exists():
            work = _build_job_db(dbp, job, key, attr["parses"], threads)
        write_report(work, job, out)
        _atomic_write_text(marker, json.dumps({"report": str(out), "files": {}}))
        return {**attr, "report": str(out), "report_seconds": time.perf_counter() - t0, "report_cached": False}
    except NinefoldError as e:
        return {**attr, "ok": False, "stage": "report", "error": f"{job}: report: {e}"}
    except Exception as e:
        return {**attr, "ok": False, "stage": "report", "error": f"{job}: report: {type(e).__name__}: {e}",
                "traceback": traceback.format_exc()}


# ------------------------------------------------------------------ discovery

@dataclass
class JobSpec:
    name: str
    files: list[Path] = field(default_factory=list)
    shas: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def key(self) -> str:
        h = hashlib.sha256()
        for f, s in sorted(zip((p.name for p in self.files), self.shas)):
            h.update(f"{f}\0{s}\n".encode())
        return h.hexdigest()


def _parse_since(since) -> float | None:
    if since in (None, ""):
        return None
    if isinstance(since, (_dt.date, _dt.datetime)):
        d = since
    else:
        try:
            d = _dt.datetime.fromisoformat(str(since))
        except ValueError:
            raise BatchUsageError(f"--since {since!r}: not a date (YYYY-MM-DD or an ISO date-time)") from None
    if not isinstance(d, _dt.datetime):
        d = _dt.datetime(d.year, d.month, d.day)
    return d.timestamp()


def _from_manifest(path: Path) -> list[JobSpec]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BatchUsageError(f"{path}: cannot read the manifest ({e})") from None
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if isinstance(jobs, dict):
        items = list(jobs.items())
    elif isinstance(jobs, list) and all(isinstance(j, dict) and "job" in j for j in jobs):
        items = [(j["job"], j.get("files", [])) for j in jobs]
    else:
        raise BatchUsageError(f"{path}: manifest needs \"jobs\": {{job: [files]}} or [{{\"job\", \"files\"}}]")
    out = []
    for name, files in items:
        js = JobSpec(str(name))
        if not isinstance(files, list) or not files:
            js.error = f"{path}: job {name!r}: no files listed"
        else:
            js.files = [(path.parent / f) if not Path(f).is_absolute() else Path(f) for f in map(str, files)]
            missing = [str(f) for f in js.files if not f.is_file()]
            if missing:
                js.error = f"{missing[0]}: no such file (listed in {path})"
        out.append(js)
    return out


def discover_jobs(root, manifest=None, since=None, exclude=()) -> list[JobSpec]:
    """The jobs under ROOT (one sub-directory each, or a manifest), with every file hashed.

    EXCLUDE: directories that are not jobs even when they sit under ROOT (the reports, the catalog's)."""
    from ingest.load import discover, sha256_of

    root = Path(root)
    if not root.is_dir():
        raise BatchUsageError(f"{root}: no such directory")
    mpath = Path(manifest) if manifest else (root / "manifest.json")
    if manifest and not mpath.is_file():
        raise BatchUsageError(f"{mpath}: no such manifest file")
    if mpath.is_file():
        jobs = _from_manifest(mpath)
    else:
        jobs = []
        skip = {Path(x).resolve() for x in exclude}
        for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if any(x == d.resolve() or d.resolve() in x.parents for x in skip):
                continue
            js = JobSpec(d.name)
            try:
                js.files = [f for f, _ in discover([d])]
            except NinefoldError as e:
                js.error = str(e)
            jobs.append(js)
    names = [j.name for j in jobs]
    for j in jobs:
        if not JOB_NAME.match(j.name):
            j.error = f"job name {j.name!r}: use letters, digits and . _ + - only"
        elif names.count(j.name) > 1 and j.error is None:
            j.error = f"job {j.name!r} is listed more than once"
    cutoff = _parse_since(since)
    if cutoff is not None:
        jobs = [j for j in jobs if j.error or max(f.stat().st_mtime for f in j.files) >= cutoff]
    todo = [f for j in jobs if j.error is None for f in j.files]
    with ThreadPoolExecutor(max_workers=4) as pool:
        digests = dict(zip(todo, pool.map(sha256_of, todo)))
    for j in jobs:
        if j.error is None:
            j.shas = [digests[f] for f in j.files]
    return jobs


# ------------------------------------------------------------------ driver side

class JobLog:
    def __init__(self, reports: Path, job: str):
        self.path = reports / "logs" / f"{job}.log"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, *lines: str) -> None:
        stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        with open(self.path, "a", encoding="utf-8") as fh:
            for line in lines:
                for part in str(line).rstrip("\n").split("\n"):
                    fh.write(f"{stamp} {part}\n")


def ensure_batch_tables(con) -> None:
    from analysis.attribution import _ensure_tables

    _ensure_tables(con)
    for t, cols in BATCH_DDL.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {t} ({cols})")


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
        for spec, res, seconds in items:
            job = spec.name
            leds = sorted(res["shares"])
            con.execute("INSERT INTO batch_shares SELECT ?, ?, unnest(?), unnest(?), unnest(?)",
                        [night, job, leds, [res["shares"][x]["share"] for x in leds],
                         [res["shares"][x]["ns"] for x in leds]])
            con.execute("INSERT INTO batch_parts SELECT ?, unnest(?)",
                        [job, sorted({f for fs in _job_files(res).values() for f in fs})])
            con.execute("INSERT OR REPLACE INTO batch_runs VALUES (?, ?, ?, 'ok', NULL, ?, ?, ?, ?, "
                        "current_timestamp)", [night, job, spec.key, len(spec.files), res["ranks"], res["steps"],
                                               seconds])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def load_job_into_catalog(con, night: str, spec: JobSpec, res: dict, seconds: float) -> None:
    load_jobs_into_catalog(con, night, [(spec, res, seconds)])


def record_failure(con, night: str, spec: JobSpec, error: str, seconds: float = 0.0) -> None:
    con.execute("INSERT OR REPLACE INTO batch_runs VALUES (?, ?, ?, 'failed', ?, ?, NULL, NULL, ?, current_timestamp)",
                [night, spec.name, spec.key if spec.error is None else None, error, len(spec.files), seconds])
    con.execute("DELETE FROM batch_shares WHERE night = ? AND job = ?", [night, spec.name])


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
    """Jobs of NIGHT whose share of a non-compute ledger grew by more than POINTS against their previous run."""
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


# ------------------------------------------------------------------ index.html

def _sparkline(values: list[float | None], color: str, w: int = 90, h: int = 22) -> str:
    pts = [(i, v) for i, v in enumerate(values) if v is not None]
    if not pts:
        return ""
    top = max(max(v for _, v in pts), 1e-9)
    n = max(len(values) - 1, 1)

    def xy(i, v):
        return f"{2 + i * (w - 4) / n:.1f},{h - 2 - v / top * (h - 4):.1f}"

    poly = " ".join(xy(i, v) for i, v in pts)
    last = xy(*pts[-1])
    return (f'<svg class="spark" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img">'
            f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{poly}"/>'
            f'<circle cx="{last.split(",")[0]}" cy="{last.split(",")[1]}" r="2" fill="{color}"/></svg>')


INDEX_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; }
table { border-collapse: collapse; margin: 6px 0 18px; }
th, td { border: 1px solid #ddd; padding: 2px 7px; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
.bad { background: #fde2e1; } .failed { color: #b00020; } .muted { color: #777; }
.tag { display: inline-block; padding: 0 6px; border-radius: 3px; font-size: 12px; margin-left: 6px; }
.tag.reg { background: #d62728; color: #fff; } .tag.fail { background: #555; color: #fff; }
.tag.ok { background: #2ca02c; color: #fff; } .tag.skip { background: #c7c7c7; }
h2 { margin-bottom: 2px; } .spark { vertical-align: middle; }
"""


def write_index(con, reports: Path, night: str, summary: dict) -> Path:
    """reports/index.html: each job's ledger shares across nights (table + sparklines), regressions first."""
    from dashboards.style import LEDGER_COLORS

    esc = html.escape
    nights = [r[0] for r in con.execute("SELECT night FROM batch_nights ORDER BY seq DESC LIMIT ?",
                                        [HISTORY_NIGHTS]).fetchall()][::-1]
    runs = con.execute("""SELECT r.job, r.night, r.status, r.error FROM batch_runs r
                          JOIN batch_nights n USING (night) ORDER BY r.job, n.seq""").fetchall()
    shares = con.execute("SELECT job, night, ledger, share FROM batch_shares").fetchall()
    sh: dict = {}
    for j, n, led, s in shares:
        sh.setdefault(j, {}).setdefault(n, {})[led] = s
    status: dict = {}
    for j, n, st, err in runs:
        status.setdefault(j, {})[n] = (st, err)
    regs: dict = {}
    for r in summary["regressions"]:
        regs.setdefault(r["job"], []).append(r)
    this = {**{j: "processed" for j in summary["jobs"]["processed"]},
            **{j["job"]: "skipped" for j in summary["jobs"]["skipped"]},
            **{j["job"]: "failed" for j in summary["jobs"]["failed"]}}
    jobs = sorted(set(status) | set(this), key=lambda j: (j not in regs, this.get(j) != "failed", j))
    c = summary["counts"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>ninefold batch {esc(night)}</title>"
             f"<style>{INDEX_CSS}</style></head><body>",
             f"<h1>ninefold nightly batch: {esc(night)}</h1>",
             f"<p>{c['processed']} processed, {c['skipped']} unchanged, {c['failed']} failed, "
             f"{len(summary['regressions'])} regressions (a non-compute ledger's share up by more than "
             f"{summary['regression_points']:g} points against the job's previous run).</p>"]
    if summary["regressions"]:
        parts.append("<h2>Regressions</h2><table><tr><th>job</th><th>ledger</th><th>previous night</th>"
                     "<th>previous %</th><th>now %</th><th>+points</th></tr>")
        for r in summary["regressions"]:
            parts.append(f"<tr class='bad'><td><a href='#job-{esc(r['job'])}'>{esc(r['job'])}</a></td>"
                         f"<td>{esc(r['ledger'])}</td><td>{esc(r['previous_night'])}</td>"
                         f"<td>{r['previous_pct']:.2f}</td><td>{r['current_pct']:.2f}</td>"
                         f"<td>{r['delta_points']:.2f}</td></tr>")
        parts.append("</table>")
    for j in jobs:
        tag = {"processed": "<span class='tag ok'>processed</span>", "skipped": "<span class='tag skip'>unchanged"
               "</span>", "failed": "<span class='tag fail'>failed</span>"}.get(this.get(j), "")
        if j in regs:
            tag += "<span class='tag reg'>regression: " + esc(", ".join(r["ledger"] for r in regs[j])) + "</span>"
        if j not in this:
            tag += "<span class='tag skip'>not in tonight's drop</span>"
        links = ([f"<a href='{esc(j)}.html'>report</a>"] if (reports / f"{j}.html").exists() else []) + [
            f"<a href='logs/{esc(j)}.log'>log</a>"]
        parts.append(f"<h2 id='job-{esc(j)}'>{esc(j)}{tag}</h2><p>{' · '.join(links)}</p>")
        err = status.get(j, {}).get(night, (None, None))[1]
        if this.get(j) == "failed" and err:
            parts.append(f"<p class='failed'>{esc(err)}</p>")
        jn = [n for n in nights if n in status.get(j, {})]
        if not jn:
            continue
        bad_leds = {r["ledger"] for r in regs.get(j, [])}
        head = "".join(f"<th style='border-bottom:3px solid {LEDGER_COLORS[n]}'>{esc(n)} %</th>" for n in LEDGERS)
        parts.append(f"<table><tr><th>night</th><th>status</th>{head}</tr>")
        for n in jn:
            st, _ = status[j][n]
            row = sh.get(j, {}).get(n, {})
            cells = "".join(
                f"<td{' class=bad' if n == night and led in bad_leds else ''}>"
                f"{'' if led not in row else f'{100 * row[led]:.2f}'}</td>" for led in LEDGERS)
            parts.append(f"<tr><td>{esc(n)}</td><td class='{'failed' if st != 'ok' else ''}'>{esc(st)}</td>"
                         f"{cells}</tr>")
        sparks = "".join(
            f"<td>{_sparkline([sh.get(j, {}).get(n, {}).get(led) for n in jn], LEDGER_COLORS[led])}</td>"
            for led in LEDGERS)
        parts.append(f"<tr><td class='muted'>trend</td><td></td>{sparks}</tr></table>")
    parts.append("</body></html>")
    out = reports / "index.html"
    _atomic_write_text(out, "\n".join(parts))
    return out


# ------------------------------------------------------------------ the run

@dataclass
class BatchOutcome:
    exit_code: int
    summary: dict
    summary_path: Path | None = None


class _Inline:
    """Runs tasks in this process, in submission order (``scheduler="serial"``)."""

    class _Done:
        def __init__(self, value):
            self._v = value

        def result(self):
            return self._v

    def submit(self, fn, *args, **kwargs):
        kwargs.pop("key", None)
        kwargs.pop("retries", None)

        def value(a):   # like Dask: results of earlier submissions, also inside lists, are passed as values
            if isinstance(a, self._Done):
                return a.result()
            return [value(x) for x in a] if isinstance(a, list) else a

        return self._Done(fn(*[value(a) for a in args], **kwargs))

    def close(self):
        pass


def _connect_scheduler(scheduler: str, workers: int):
    import dask
    from distributed import Client, LocalCluster

    if scheduler == "local":
        # One core per worker: the libraries' own thread pools are held to it too (DuckDB per connection), and
        # no statistical profiler samples the workers every 10 ms.
        with dask.config.set({"distributed.worker.profile.enabled": False}):
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   dashboard_address=None, env={"POLARS_MAX_THREADS": "1"})
        return Client(cluster), cluster
    try:
        return Client(scheduler, timeout="20s"), None
    except (OSError, TimeoutError, ValueError) as e:
        raise BatchUsageError(f"--scheduler {scheduler}: cannot reach the scheduler ({e})") from None


def run_batch(root, db, reports, scheduler: str = "local", workers: int | None = None, since=None,
              regression_points: float = 5.0, night: str | None = None, manifest=None,
              echo=print, task_threads: int = 1) -> BatchOutcome:
    """One night's batch. Exit code: 0 ok, 3 regressions, 4 some jobs failed (takes precedence), 2 usage."""
    from store.connection import connect

    t_start = time.perf_counter()
    started = _dt.datetime.now(_dt.timezone.utc)
    night = night or _dt.date.today().isoformat()
    if workers is not None and int(workers) < 1:
        raise BatchUsageError("--workers must be at least 1")
    workers = int(workers or os.cpu_count() or 2)
    if regression_points < 0:
        raise BatchUsageError("--regression-points must be >= 0")
    db = Path(db).resolve()
    reports = Path(reports).resolve()
    specs = discover_jobs(root, manifest=manifest, since=since, exclude=(reports, db.parent))
    reports.mkdir(parents=True, exist_ok=True)
    db.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = connect(db)
    except Exception as e:
        raise BatchUsageError(f"{db}: cannot open the catalog for writing ({e})") from None
    try:
        ensure_batch_tables(con)
        seq = _night_seq(con, night)
        latest = {j: (k, n) for j, k, n in con.execute("""
            SELECT r.job, arg_max(r.job_key, n.seq), arg_max(r.night, n.seq)
            FROM batch_runs r JOIN batch_nights n USING (night) WHERE r.status = 'ok' GROUP BY r.job""").fetchall()}
        this_night = {j: (k, s) for j, k, s in con.execute(
            "SELECT job, job_key, status FROM batch_runs WHERE night = ?", [night]).fetchall()}
        processed: list[str] = []
        skipped: list[dict] = []
        failed: list[dict] = []
        todo: list[JobSpec] = []
        logs = {s.name: JobLog(reports, s.name) for s in specs}
        for s in specs:
            logs[s.name].write(f"== night {night}: {len(s.files)} files ==")
            if s.error:
                failed.append({"job": s.name, "stage": "discover", "error": s.error, "log": str(logs[s.name].path)})
                record_failure(con, night, s, s.error)
                logs[s.name].write(f"FAILED: {s.error}")
                continue
            k = s.key
            if this_night.get(s.name) == (k, "ok"):
                processed.append(s.name)
                logs[s.name].write(f"already processed this night (job key {k[:16]}); nothing to do")
            elif s.name in latest and latest[s.name][0] == k:
                skipped.append({"job": s.name, "last_night": latest[s.name][1]})
                logs[s.name].write(f"unchanged since night {latest[s.name][1]} (job key {k[:16]}); skipped")
            else:
                todo.append(s)
        echo(f"night {night}: {len(specs)} jobs ({len(todo)} to process, {len(skipped)} unchanged, "
             f"{len(processed)} already done tonight, {len(failed)} unreadable)")
        client = cluster = None
        try:
            if todo:
                if scheduler == "serial":
                    client = _Inline()
                else:
                    client, cluster = _connect_scheduler(scheduler, workers)
                    if cluster is not None:
                        echo(f"cluster: {workers} local worker processes at {client.scheduler.address}")
                    else:
                        echo(f"cluster: {scheduler} ({len(client.scheduler_info().get('workers', {}))} workers)")
                _run_jobs(client, con, db, reports, night, todo, logs, processed, failed, echo, task_threads,
                          total=len(todo))
        finally:
            if client is not None:
                client.close()
            if cluster is not None:
                cluster.close()
        regs = regressions_for(con, night, regression_points)
        for r in regs:
            logs.get(r["job"], JobLog(reports, r["job"])).write(
                f"REGRESSION: {r['ledger']} {r['previous_pct']:.2f}% (night {r['previous_night']}) -> "
                f"{r['current_pct']:.2f}% (+{r['delta_points']:.2f} points > {regression_points:g})")
        shares = {j: {led: round(100 * s, 4) for led, s in con.execute(
            "SELECT ledger, share FROM batch_shares WHERE night = ? AND job = ?", [night, j]).fetchall()}
            for j in sorted(processed)}
        code = EXIT_FAILED if failed else (EXIT_REGRESSION if regs else EXIT_OK)
        summary = {
            "night": night, "night_seq": seq, "root": str(Path(root).resolve()), "db": str(db),
            "reports": str(reports), "scheduler": scheduler, "workers": workers,
            "started_at": started.isoformat(timespec="seconds"),
            "seconds": round(time.perf_counter() - t_start, 3),
            "regression_points": regression_points,
            "counts": {"jobs": len(specs), "processed": len(processed), "skipped": len(skipped),
                       "failed": len(failed)},
            "jobs": {"processed": sorted(processed), "skipped": sorted(skipped, key=lambda d: d["job"]),
                     "failed": sorted(failed, key=lambda d: d["job"])},
            "shares_pct": shares,
            "regressions": regs,
            "exit_code": code,
        }
        write_index(con, reports, night, summary)
        spath = reports / "summary.json"
        _atomic_write_text(spath, json.dumps(summary, indent=1))
    finally:
        con.close()
    echo(f"done in {time.perf_counter() - t_start:.1f}s: {len(processed)} processed, {len(skipped)} unchanged, "
         f"{len(failed)} failed, {len(regs)} regressions -> {spath} (exit {code})")
    return BatchOutcome(code, summary, spath)


def _run_jobs(client, con, db, reports, night, todo, logs, processed, failed, echo, threads, total) -> None:
    specs = {}
    finals = []
    for s in todo:
        tag = uuid.uuid4().hex[:8]
        pf = [client.submit(parse_task, str(db), s.name, str(f), sha, threads,
                            key=f"nf-parse-{s.name}-{f.name}-{sha[:12]}-{tag}", retries=1)
              for f, sha in zip(s.files, s.shas)]
        af = client.submit(attribute_task, str(db), s.name, s.key, pf, threads,
                           key=f"nf-attribute-{s.name}-{s.key[:12]}-{tag}", retries=1)
        rf = client.submit(report_task, str(db), af, str(reports), threads,
                           key=f"nf-report-{s.name}-{s.key[:12]}-{tag}", retries=1)
        specs[rf.key if hasattr(rf, "key") else id(rf)] = s
        finals.append(rf)
    if isinstance(client, _Inline):
        batches = ([f] for f in finals)
    else:
        from distributed import as_completed

        # the jobs that finished while the previous ones were being loaded are loaded together
        batches = as_completed(finals).batches()
    done = 0
    pending: list = []
    last_flush = time.monotonic()

    def flush():
        # Finished jobs are loaded into the catalog a few at a time: one transaction for several jobs costs
        # the single-writer driver about what one costs, and leaves the cores to the workers.
        nonlocal last_flush
        good = [(s, res, _work_seconds(res)) for s, res in pending]
        pending.clear()
        last_flush = time.monotonic()
        if not good:
            return
        t0 = time.perf_counter()
        try:
            load_jobs_into_catalog(con, night, good)
        except Exception:
            for s, res, sec in good:     # one bad job must not take the others down: load them one by one
                try:
                    load_jobs_into_catalog(con, night, [(s, res, sec)])
                except Exception as e:
                    res.update(ok=False, stage="catalog", error=f"{s.name}: loading into the catalog: "
                               f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        load_s = time.perf_counter() - t0
        for s, res, _ in good:
            if res.get("ok"):
                removed = collect_garbage(db, s.name, {f for fs in _job_files(res).values() for f in fs}, s.key)
                processed.append(s.name)
                logs[s.name].write(f"catalog: loaded in {load_s:.2f}s (one transaction with {len(good) - 1} other "
                                   f"jobs); {removed} superseded Parquet parts removed")
            else:
                _job_failed(con, db, night, s, res, logs[s.name], failed, echo, "[catalog]")

    for group in batches:
        for fut in group:
            s = specs[fut.key if hasattr(fut, "key") else id(fut)]
            try:
                res = fut.result()
            except Exception as e:  # the task itself was lost (e.g. its workers kept dying)
                res = {"ok": False, "stage": "scheduler", "error": f"{s.name}: task lost: {type(e).__name__}: {e}",
                       "parses": []}
            done += 1
            _log_job(s, res, logs[s.name])
            if res.get("ok"):
                pending.append((s, res))
                echo(f"[{done}/{total}] {s.name} attributed ({res['ranks']} ranks, parse "
                     f"{sum(p.get('seconds', 0.0) for p in res['parses']):.1f}s, attribute "
                     f"{res.get('seconds', 0):.1f}s, report {res.get('report_seconds', 0):.1f}s; "
                     f"{_work_seconds(res):.1f}s)")
            else:
                _job_failed(con, db, night, s, res, logs[s.name], failed, echo, f"[{done}/{total}]")
        if len(pending) >= FLUSH_JOBS or time.monotonic() - last_flush >= FLUSH_SECONDS:
            flush()
    flush()


def _work_seconds(res: dict) -> float:
    return (sum(p.get("seconds", 0.0) for p in res.get("parses", [])) + res.get("seconds", 0.0)
            + res.get("report_seconds", 0.0))


def _log_job(s, res, log) -> None:
    for p in res.get("parses", []):
        if p.get("ok"):
            log.write(f"parsed {p['path']} sha256={p['sha'][:16]} ranks={p['ranks']} "
                      + ("(done earlier)" if p.get("cached") else f"in {p.get('seconds', 0):.2f}s")
                      + " rows " + json.dumps(p["counts"], sort_keys=True))
        else:
            log.write(f"parse FAILED {p['path']}: {p['error']}")
            if p.get("traceback"):
                log.write(p["traceback"])
    if res.get("ok"):
        top = sorted(((v["share"], led) for led, v in res["shares"].items()), reverse=True)[:3]
        log.write(f"attributed {res['ranks']} ranks x {res['steps']} steps "
                  + ("(done earlier)" if res.get("cached") else f"in {res.get('seconds', 0):.2f}s")
                  + "; shares " + ", ".join(f"{led} {100 * v:.1f}%" for v, led in top),
                  f"report {res['report']}" + (" (done earlier)" if res.get("report_cached")
                                               else f" in {res.get('report_seconds', 0):.2f}s"))


def _job_failed(con, db, night, s, res, log, failed, echo, counter) -> None:
    failed.append({"job": s.name, "stage": res.get("stage"), "error": res["error"], "log": str(log.path)})
    record_failure(con, night, s, res["error"], _work_seconds(res))
    collect_garbage(db, s.name, committed_parts(con, s.name), None)
    log.write(f"FAILED ({res.get('stage')}): {res['error']}")
    if res.get("traceback"):
        log.write(res["traceback"])
    echo(f"{counter} {s.name} FAILED: {res['error']}")
