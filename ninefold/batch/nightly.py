"""Nightly batch: every job under a drop directory → canonical Parquet, ledgers, one report per job, a trend.

    run_batch(root, db, reports, scheduler="local", workers=N, ...) -> BatchOutcome

Work fans out over Dask distributed as three kinds of task, all pure functions of content-hashed inputs:

* ``parse_task`` (one per trace file): loads the file into a private in-memory DuckDB with the ordinary
  loaders (``ninefold.ingest.load.load_kineto`` or the registry's loader) and writes each canonical table's rows as
  ``<db dir>/parquet/<table>/job=<job>/rank=<rank>/part-<sha256>.parquet`` (tmp file + rename);
* ``attribute_task`` (one per job): builds a per-job DuckDB from that job's Parquet, runs
  ``ninefold.analysis.attribution.attribute.attribute_job`` and writes the ledger tables as Parquet too;
* ``report_task`` (one per job): ``ninefold.dashboards.report.write_report`` from the per-job DuckDB.

Each task ends by writing a JSON "done" marker (atomically) under ``<db dir>/batch_state/done/<job>/``; a task
whose marker and outputs exist returns at once, so a batch interrupted anywhere (a worker or the driver killed)
resumes where it stopped. Workers never open the catalog: the driver is its only writer and loads each finished
job's Parquet in one transaction (delete the job's rows, insert the new ones), so the catalog never holds a
job twice or half a job. Superseded Parquet parts of a job are removed once its new rows are committed.

History lives in the catalog too: ``batch_nights`` (label → order), ``batch_runs`` (one row per night and job),
``batch_shares`` (ledger share per night, job and ledger), ``batch_step_samples`` (each step's time per
ledger, kernel class, collective and kernel, for the diff) and ``batch_lost_kernels`` (each job's ten kernels
by lost time, from ninefold.analysis.efficiency in ``attribute_task``; summary.json's ``lost_time``). Each job processed
tonight is diffed against its previous successful night (ninefold.batch.diff): a regression is a step or ledger
significantly longer tonight (the bootstrap interval over the steps excludes zero, at ``confidence`` for the
whole table), so step-to-step noise alone is none. The raw share moves (a non-compute ledger's share up by more
than ``regression_points``) are still reported, as ``share_moves``; they no longer set the exit code.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path

from ninefold.store.errors import disk_full

from ninefold.batch.catalog import (_job_files, _night_seq, collect_garbage, committed_parts, ensure_batch_tables,
                            load_jobs_into_catalog, lost_kernels_of, record_failure, regressions_for)
from ninefold.batch.diff import night_diffs, prune_step_samples, regression_line, regressions
from ninefold.batch.index import write_index
from ninefold.batch.jobs import BatchUsageError, JobLog, JobSpec, discover_jobs
from ninefold.batch.tasks import _atomic_write_text, attribute_task, parse_task, report_task

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_REGRESSION = 3
EXIT_FAILED = 4

FLUSH_JOBS = 16          # finished jobs loaded into the catalog together ...
FLUSH_SECONDS = 15.0     # ... or after this long, whichever comes first


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
              echo=print, task_threads: int = 1, confidence: float = 0.95) -> BatchOutcome:
    """One night's batch. Exit code: 0 ok, 3 regressions (a step or ledger significantly longer than on the job's
    previous night), 4 some jobs failed (takes precedence), 2 usage."""
    from ninefold.store.connection import connect

    t_start = time.perf_counter()
    started = _dt.datetime.now(_dt.timezone.utc)
    night = night or _dt.date.today().isoformat()
    if workers is not None and int(workers) < 1:
        raise BatchUsageError("--workers must be at least 1")
    workers = int(workers or os.cpu_count() or 2)
    if regression_points < 0:
        raise BatchUsageError("--regression-points must be >= 0")
    if not 0.5 <= confidence < 1:
        raise BatchUsageError("--confidence must be in [0.5, 1)")
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
        moves = regressions_for(con, night, regression_points)
        for r in moves:
            logs.get(r["job"], JobLog(reports, r["job"])).write(
                f"share move: {r['ledger']} {r['previous_pct']:.2f}% (night {r['previous_night']}) -> "
                f"{r['current_pct']:.2f}% (+{r['delta_points']:.2f} points > {regression_points:g})")
        diffs = night_diffs(con, night, processed, confidence)
        regs = regressions(diffs, night)
        prune_step_samples(con, processed)
        for j, d in diffs.items():
            logs.get(j, JobLog(reports, j)).write(
                f"diff against night {d['previous_night']}: {d['significant_rows']} significant rows; top: "
                + (", ".join(f"{r['level']} {r['key']} {r['delta_ns'] / 1e6:+.3f} ms" for r in d["top"]) or "none"))
        for r in regs:
            logs.get(r["job"], JobLog(reports, r["job"])).write(regression_line(r, confidence))
        shares = {j: {led: round(100 * s, 4) for led, s in con.execute(
            "SELECT ledger, share FROM batch_shares WHERE night = ? AND job = ?", [night, j]).fetchall()}
            for j in sorted(processed)}
        lost = {}
        for j in sorted(processed):
            ln, rows, why = lost_kernels_of(con, j, night)
            if ln == night:
                lost[j] = {"rows": rows, "reason": why}
        code = EXIT_FAILED if failed else (EXIT_REGRESSION if regs else EXIT_OK)
        summary = {
            "night": night, "night_seq": seq, "root": str(Path(root).resolve()), "db": str(db),
            "reports": str(reports), "scheduler": scheduler, "workers": workers,
            "started_at": started.isoformat(timespec="seconds"),
            "seconds": round(time.perf_counter() - t_start, 3),
            "regression_points": regression_points,
            "confidence": confidence,
            "counts": {"jobs": len(specs), "processed": len(processed), "skipped": len(skipped),
                       "failed": len(failed)},
            "jobs": {"processed": sorted(processed), "skipped": sorted(skipped, key=lambda d: d["job"]),
                     "failed": sorted(failed, key=lambda d: d["job"])},
            "shares_pct": shares,
            "regressions": regs,
            "diffs": diffs,
            "lost_time": lost,
            "share_moves": moves,
            "exit_code": code,
        }
        write_index(con, reports, night, summary)
        spath = reports / "summary.json"
        _atomic_write_text(spath, json.dumps(summary, indent=1))
    except Exception as e:      # the catalog's or the reports' disk is full: one line; committed nights stay
        full = disk_full(e, db, "the batch catalog or its reports")
        if full is not None:
            raise full from None
        raise
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
