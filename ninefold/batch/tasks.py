"""Batch worker tasks: one trace file → canonical Parquet; one job's Parquet → ledger Parquet; its report.

All three are pure functions of content-hashed inputs that never raise (an error comes back in the result) and
end by writing a JSON "done" marker atomically under ``<db dir>/batch_state/done/<job>/``, so a task whose
marker and outputs exist returns at once: a batch killed anywhere resumes where it stopped.
"""
from __future__ import annotations

import json
import os
import time
import traceback
import uuid
from pathlib import Path

from ninefold.analysis.ledgers import LEDGERS
from ninefold.store.errors import NinefoldError, disk_full

LEDGER_TABLES = ("ledger_totals", "ledger_segments", "ledger_names", "step_windows", "clock_offsets",
                 "kernel_classes", "pg_axes", "collective_matches")
NULL_PART = "__HIVE_DEFAULT_PARTITION__"
LOST_TOP = 10            # kernels by lost time carried per job (the index's table)


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

    from ninefold.store.schema import create_all

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
    from ninefold.ingest.load import load_kineto
    from ninefold.ingest.registry import loader_for
    from ninefold.store.schema import TABLES

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
        full = disk_full(e, None, "its parsed rows")
        if full is not None:
            return {"ok": False, "path": path, "sha": sha, "error": f"{path}: {full}"}
        return {"ok": False, "path": path, "sha": sha, "error": f"{path}: {type(e).__name__}: {e}",
                "traceback": traceback.format_exc()}


def _work_db(db: Path, job: str, key: str) -> Path:
    return state_root(db) / "work" / f"{job}-{key[:16]}.duckdb"


def _build_job_db(db: Path, job: str, key: str, parses: list[dict], threads: int) -> Path:
    """A fresh per-job DuckDB from the job's canonical Parquet, attributed. Returns its path."""
    from ninefold.analysis.attribution.attribute import attribute_job
    from ninefold.store.connection import connect

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


def lost_kernels(con, job: str, top: int = LOST_TOP) -> dict:
    """JOB's TOP kernels by lost time (ninefold.analysis.efficiency, not stored), summed over ranks per kernel name and unit
    (ninefold.analysis.efficiency.by_kernel):
    {"rows": [{kernel, kclass, calls, time_ns, lost_ns, efficiency (time-weighted), unit}], "reason": why there
    are none, or what the rows leave out (the kernels whose work is not known), "unknown": {"kernels", "time_ns",
    "note"} of those kernels or None}."""
    from ninefold.analysis.efficiency import UNKNOWN_WORK, EfficiencyError, by_kernel, compute_efficiency

    try:
        rows, _ = compute_efficiency(con, job)
    except EfficiencyError as e:
        return {"rows": [], "reason": f"efficiency: {e}", "unknown": None}
    except Exception as e:  # the table is an extra: it never fails the job
        return {"rows": [], "reason": f"efficiency: {type(e).__name__}: {e}", "unknown": None}
    agg = by_kernel(rows)
    out = [{k: a[k] for k in ("kernel", "kclass", "calls", "time_ns", "lost_ns", "efficiency", "unit")}
           for a in agg["kernels"][:top]]
    unk = None
    if agg["unknown_kernels"]:
        notes = [why for why, _, _ in agg["missing"] if why != UNKNOWN_WORK]
        unk = {"kernels": agg["unknown_kernels"], "time_ns": sum(ns for _, _, ns in agg["missing"]),
               "note": notes[0] if notes else None}
    reason = None
    if unk:
        reason = (f"{unk['kernels']} kernels ({unk['time_ns'] / 1e6:.3f} ms over all ranks) without a known work "
                  "or peak" + (f", e.g. {unk['note']}" if unk["note"] else ""))
    if not out:
        reason = ("no kernel with a known work and peak" + (f": {reason}" if reason else "")
                  if rows else "no kernels in the job")
    return {"rows": out, "reason": reason, "unknown": unk}


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
            lost = lost_kernels(con, job)
            ranks, steps = con.execute("SELECT count(DISTINCT rank), count(DISTINCT step) FROM step_windows "
                                       "WHERE job = ?", [job]).fetchone()
        finally:
            con.close()
        result = {"ok": True, "files": files, "counts": counts, "shares": shares, "lost_time": lost,
                  "ranks": ranks, "steps": steps, "work_db": str(work)}
        _atomic_write_text(marker, json.dumps(result))
        return {**base, **result, "cached": False, "seconds": time.perf_counter() - t0}
    except NinefoldError as e:
        return {**base, "ok": False, "stage": "attribute", "error": f"{job}: attribution: {e}"}
    except Exception as e:
        full = disk_full(e, None, "its ledgers")
        if full is not None:
            return {**base, "ok": False, "stage": "attribute", "error": f"{job}: attribution: {full}"}
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
        from ninefold.dashboards.report import write_report

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
