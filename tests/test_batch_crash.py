"""A batch whose worker and then driver are SIGKILLed resumes to exactly the rows of a clean serial run."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import psutil

from analysis.attribution import attribute_job
from ingest.load import ingest_paths
from sample_traces.generate import generate
from service.batch import EXIT_OK, run_batch
from store.connection import connect

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
    driver = subprocess.Popen([sys.executable, "-m", "service.cli", "batch", str(root), "--db", str(db),
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
    for t in ("gpu_ops", "host_ops", "ledger_intervals"):
        via_glob = dict(duckdb.sql(f"SELECT job, count(*) FROM read_parquet('{proot}/{t}/**/*.parquet') "
                                   "GROUP BY job").fetchall())
        assert via_glob == got[t], t
    for job in JOBS:
        assert (reports / f"{job}.html").stat().st_size > 0
        assert (reports / "logs" / f"{job}.log").read_text().count("== night n1") == 2
