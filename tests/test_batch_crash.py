"""A batch whose worker and then driver are SIGKILLed resumes to exactly the rows of a clean serial run."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import psutil

from ninefold.analysis.attribution.attribute import attribute_job
from ninefold.ingest.load import ingest_paths
from sample_traces.generate import generate
from ninefold.batch.nightly import EXIT_OK, run_batch
from ninefold.store.connection import connect

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ["traces", "gpu_ops", "host_ops", "collectives", "steps", "flows", "diagnostics",
           "ledger_totals", "ledger_intervals", "step_windows", "clock_offsets"]
JOBS = [f"night-job-{i}" for i in range(6)]


def _counts(db: Path) -> dict:
    con = duckdb.connect(str(db), read_only=True)
    out = {t: dict(con.execute(f"SELECT job, count(*) FROM {t} GROUP BY job").fetchall()) for t in CHECKED}
    out["ledger_rows"] = con.execute("SELECT job, rank, step, ledger, ns FROM ledger_totals ORDER BY ALL").fetchall()
    con.close()
    return out


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_killed_worker_then_driver_then_rerun(tmp_path):
    root = tmp_path / "drop"
    for i, job in enumerate(JOBS):
        generate(root / job, ranks=2, steps=3, seed=20 + i)
        (root / job / "ground_truth.json").unlink()
    db, reports = tmp_path / "store" / "catalog.duckdb", tmp_path / "reports"
    out = open(tmp_path / "driver.out", "w")
    driver = subprocess.Popen([sys.executable, "-m", "ninefold.cli.main", "batch", str(root), "--db", str(db),
                               "--reports", str(reports), "--workers", "2", "--night", "n1"],
                              cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    started: set[int] = set()
    try:
        proot = db.parent / "parquet"
        _wait(lambda: proot.is_dir() and any(proot.rglob("*.parquet")), 90, "the first Parquet part")

        def workers():
            kids = psutil.Process(driver.pid).children(recursive=True)
            started.update(k.pid for k in kids)
            out = []
            for k in kids:
                try:
                    if "spawn_main" in " ".join(k.cmdline()):
                        out.append(k)
                except psutil.Error:   # exited meanwhile
                    pass
            return out

        victim = _wait(workers, 30, "a worker process")[0]
        os.kill(victim.pid, signal.SIGKILL)
        # let the batch go on a little (the nanny restarts the worker), then kill the driver mid-batch
        time.sleep(1.5)
        workers()
        assert driver.poll() is None, "the batch finished before the driver could be killed"
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(30)
    finally:
        if driver.poll() is None:
            os.kill(driver.pid, signal.SIGKILL)
            driver.wait(30)
        for pid in started:        # worker processes of the killed driver, if any outlived it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out.close()
    assert not (reports / "summary.json").exists()
    partial = len(list((db.parent / "parquet").rglob("*.parquet")))
    assert partial > 0

    res = run_batch(root, db, reports, scheduler="local", workers=2, night="n1", echo=lambda s: None)
    assert res.exit_code == EXIT_OK, res.summary
    assert res.summary["jobs"]["processed"] == JOBS and res.summary["jobs"]["failed"] == []

    serial = connect(tmp_path / "serial.duckdb")
    for job in JOBS:
        assert all(r.status == "stored" for r in ingest_paths(serial, [root / job], job=job))
        attribute_job(serial, job)
    serial.close()
    got, want = _counts(db), _counts(tmp_path / "serial.duckdb")
    assert got == want
    assert set(got["gpu_ops"]) == set(JOBS) and all(n > 0 for n in got["ledger_totals"].values())

    proot = db.parent / "parquet"
    dirs: dict = {}
    for p in proot.rglob("*.parquet"):
        dirs.setdefault(p.parent, []).append(p.name)
    assert all(len(v) == 1 for v in dirs.values()), {str(k): v for k, v in dirs.items() if len(v) > 1}
    assert not list(proot.rglob(".*.tmp-*"))
    # the intervals travel coded (ledger_segments): one row per ledger_intervals row
    for t, stored in (("gpu_ops", "gpu_ops"), ("host_ops", "host_ops"), ("ledger_segments", "ledger_intervals")):
        via_glob = dict(duckdb.sql(f"SELECT job, count(*) FROM read_parquet('{proot}/{t}/**/*.parquet') "
                                   "GROUP BY job").fetchall())
        assert via_glob == got[stored], t
    for job in JOBS:
        assert (reports / f"{job}.html").stat().st_size > 0
        assert (reports / "logs" / f"{job}.log").read_text().count("== night n1") == 2


def _job_state(db: Path) -> dict:
    """Per job: its rows in every checked table (counts) and its ledger rows; absent jobs are absent."""
    c = _counts(db)
    jobs = set().union(*(set(c[t]) for t in CHECKED))
    return {j: ({t: c[t].get(j, 0) for t in CHECKED}, [r for r in c["ledger_rows"] if r[0] == j]) for j in jobs}


def _serial_state(tmp_path: Path, root: Path, jobs: list[str], name: str) -> dict:
    path = tmp_path / f"{name}.duckdb"
    con = connect(path)
    for job in jobs:
        assert all(r.status == "stored" for r in ingest_paths(con, [root / job], job=job))
        attribute_job(con, job)
    con.close()
    return _job_state(path)


def _final_checks(db: Path, work: Path) -> None:
    proot = db.parent / "parquet"
    dirs: dict = {}
    for p in proot.rglob("*.parquet"):
        dirs.setdefault(p.parent, []).append(p.name)
    assert dirs and all(len(v) == 1 for v in dirs.values()), {str(k): v for k, v in dirs.items() if len(v) > 1}
    assert not list(proot.rglob(".*.tmp-*"))
    assert not list((db.parent / "batch_state").rglob("*.tmp-*"))
    assert not list((db.parent / "batch_state" / "work").glob("*.duckdb*")), "per-job work stores left behind"
    assert not (work.is_dir() and any(work.iterdir())), f"ingest work folders left: {list(work.iterdir())}"


def _driver(root, db, reports, env):
    p = subprocess.Popen([sys.executable, "-m", "ninefold.cli.main", "batch", str(root), "--db", str(db),
                          "--reports", str(reports), "--scheduler", "serial", "--night", "n2"],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = p.stdout.readline()      # the driver has discovered the jobs and opened the catalog
    assert first.startswith("night n2"), first
    return p, time.monotonic()


def test_driver_killed_at_seeded_points_leaves_each_job_old_or_new(tmp_path, monkeypatch):
    """Night n1 is stored whole; night n2 changes three of four jobs. From the n1 store, n2 is SIGKILLed at seeded
    points of its run: after each kill every job holds exactly its n1 rows or its n2 rows (a job marked ok for n2
    its n2 rows), and the rerun ends with the n2 rows only, each Parquet part once, no temporary or work files."""
    import random
    import shutil

    root = tmp_path / "drop"
    jobs = [f"job-{i}" for i in range(4)]
    for i, job in enumerate(jobs):
        generate(root / job, ranks=2, steps=3, seed=40 + i)
        (root / job / "ground_truth.json").unlink()
    store, reports, work = tmp_path / "store", tmp_path / "reports", tmp_path / "work"
    db = store / "catalog.duckdb"
    monkeypatch.setenv("NINEFOLD_TMP", str(work))
    res = run_batch(root, db, reports, scheduler="serial", night="n1", echo=lambda s: None)
    assert res.exit_code == EXIT_OK, res.summary
    old = _job_state(db)
    assert old == _serial_state(tmp_path, root, jobs, "old")
    for i, job in enumerate(jobs[1:], start=1):          # tonight three jobs changed, job-0 did not
        for f in (root / job).iterdir():
            f.unlink()
        generate(root / job, ranks=2, steps=4, seed=90 + i)
        (root / job / "ground_truth.json").unlink()
    new = _serial_state(tmp_path, root, jobs, "new")
    assert all(new[j] != old[j] for j in jobs[1:]) and new["job-0"] == old["job-0"]
    n1_store, n1_reports = tmp_path / "n1-store", tmp_path / "n1-reports"
    shutil.copytree(store, n1_store)
    shutil.copytree(reports, n1_reports)

    def restore():
        for live, saved in ((store, n1_store), (reports, n1_reports)):
            shutil.rmtree(live)
            shutil.copytree(saved, live)

    env = {**os.environ, "NINEFOLD_TMP": str(work)}
    p, t0 = _driver(root, db, reports, env)          # an uninterrupted n2 from the n1 store: how long it runs
    p.communicate(timeout=120)
    assert p.returncode in (EXIT_OK, 3)
    whole = time.monotonic() - t0
    assert _job_state(db) == new
    rng = random.Random(2026)
    seen = {"old": 0, "new": 0}
    for k in range(4):
        restore()
        delay = (k + rng.random()) / 4 * whole     # one seeded point in each quarter of the run
        p, t0 = _driver(root, db, reports, env)
        time.sleep(max(0.0, delay - (time.monotonic() - t0)))
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        p.stdout.close()
        state = _job_state(db)
        assert set(state) == set(jobs), f"kill {k} after {delay:.2f}s: jobs {sorted(state)}"
        for j in jobs:
            assert state[j] in (old[j], new[j]), f"kill {k} after {delay:.2f}s: {j} holds a mix of n1 and n2 rows"
            if j != "job-0":
                seen["old" if state[j] == old[j] else "new"] += 1
        con = duckdb.connect(str(db), read_only=True)
        ok = {r[0] for r in con.execute("SELECT job FROM batch_runs WHERE night = 'n2' AND status = 'ok'").fetchall()}
        con.close()
        assert all(state[j] == new[j] for j in ok), f"kill {k}: a job marked ok for n2 holds its n1 rows"

        res = run_batch(root, db, reports, scheduler="serial", night="n2", echo=lambda s: None)
        assert res.exit_code in (EXIT_OK, 3), res.summary
        assert res.summary["jobs"]["processed"] == jobs[1:], f"kill {k}: {res.summary['jobs']}"
        assert [d["job"] for d in res.summary["jobs"]["skipped"]] == ["job-0"]
        assert _job_state(db) == new, f"kill {k} after {delay:.2f}s: the rerun did not end with the n2 rows"
        _final_checks(db, work)
    print(f"uninterrupted n2 {whole:.2f}s; job states after the kills: {seen}")
    assert seen["old"] > 0, "every kill came after the catalog load: no kill fell inside the night's work"
