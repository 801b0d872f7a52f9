"""A full disk: ingest (at COMMIT and mid-file), a full work folder, attribute and batch each say one line naming
the disk and what was being written, exit non-zero, attempt the other files, and the store keeps its old rows.

The disk is a real one that fills: a small tmpfs mounted for the test (the tests run as root, as CI does), so
every write fails the way it does on a full volume, with ENOSPC from the kernel, in DuckDB and in Python alike.
"""
import errno
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager

import duckdb

from conftest import ROOT
from sample_traces.generate import generate

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
DP4 = ROOT / "sample_traces" / "dp4"      # the generator's 4-rank job, shipped
TABLES = ("traces", "gpu_ops", "host_ops", "steps", "collectives", "diagnostics")


@contextmanager
def small_disk(path, size: str):
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True,
                   capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(disk, leave: int = 64 << 10):
    """Fill DISK but LEAVE bytes with a file of its own (replacing the one an earlier call wrote)."""
    (disk / "filler").unlink(missing_ok=True)
    st = os.statvfs(disk)
    try:
        with open(disk / "filler", "wb") as f:
            f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    except OSError as e:        # the last page: full is full
        assert e.errno == errno.ENOSPC, e


def cli(*args):
    return subprocess.run([sys.executable, "-m", "ninefold.cli.main", *map(str, args)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=600)


def counts(db, tables=TABLES, job=None):
    con = duckdb.connect(str(db), read_only=True)
    try:
        where = "" if job is None else f" WHERE job = '{job}'"
        return {t: con.execute(f"SELECT count(*) FROM {t}{where}").fetchone()[0] for t in tables}
    finally:
        con.close()


def one_line_disk_full(out: str, disk) -> list[str]:
    assert "Traceback" not in out, out
    lines = [ln for ln in out.splitlines() if "disk full" in ln]
    for ln in lines:
        assert f"({disk})" in ln and "no space left on device" in ln, ln
    return lines


def test_ingest_fails_each_file_in_one_line_at_commit_and_mid_file_and_keeps_the_store(tmp_path):
    generate(tmp_path / "g_big", ranks=1, steps=3, target_mb=10)    # rows past a row group: written mid-file
    generate(tmp_path / "g_small", ranks=2, steps=3)                # a few thousand rows: written at COMMIT
    new = tmp_path / "new"
    new.mkdir()
    shutil.copy(tmp_path / "g_big" / "rank-0.json", new / "rank-0.json")
    shutil.copy(tmp_path / "g_small" / "rank-1.json", new / "rank-1.json")
    with small_disk(tmp_path / "disk", "24m") as disk:
        db = disk / "s.duckdb"
        assert cli("ingest", DP4, "--db", db, "--job", "old").returncode == 0
        before = counts(db)
        fill(disk)
        r = cli("ingest", new, "--db", db, "--job", "new")
        assert r.returncode == 1, r.stdout + r.stderr
        lines = one_line_disk_full(r.stdout + r.stderr, disk)
        assert sorted(ln.split()[1].rstrip(":") for ln in lines) == [str(new / "rank-0.json"), str(new / "rank-1.json")]
        assert all(ln.startswith("FAILED") for ln in lines)
        mid = [ln for ln in lines if f"to {db};" in ln]          # the rows' blocks, during the INSERT
        commit = [ln for ln in lines if f"to {db}.wal;" in ln]   # the log, at COMMIT
        assert len(mid) == 1 and "rank-0.json" in mid[0] and len(commit) == 1 and "rank-1.json" in commit[0], lines
        assert counts(db) == before
        (disk / "filler").unlink()        # room again: the same store takes the files
        r = cli("ingest", new, "--db", db, "--job", "new")
        assert r.returncode == 0 and "2 stored" in r.stdout, r.stdout + r.stderr
        assert counts(db, job="old") == before and counts(db, job="new")["gpu_ops"] > 0


def test_a_full_work_folder_is_blamed_on_the_disk_not_the_file(tmp_path):
    generate(tmp_path / "g", ranks=2, steps=3, target_mb=2, gzip=True)
    with small_disk(tmp_path / "work", "1m") as work:
        fill(work)
        env = {**ENV, "NINEFOLD_TMP": str(work / "n")}
        db = tmp_path / "s.duckdb"
        assert cli("ingest", DP4, "--db", db, "--job", "old").returncode == 0   # (work folder still empty)
        before = counts(db)
        r = subprocess.run([sys.executable, "-m", "ninefold.cli.main", "ingest", str(tmp_path / "g"), "--db", str(db)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        out = r.stdout + r.stderr
        assert r.returncode == 1 and "corrupt gzip" not in out, out
        lines = one_line_disk_full(out, work)
        assert len(lines) == 2 and all("rank-" in ln and "decompressed trace" in ln for ln in lines), lines
        assert counts(db) == before


def test_attribute_on_a_full_disk_is_one_line_and_keeps_the_old_ledgers(tmp_path):
    with small_disk(tmp_path / "disk", "24m") as disk:
        db = disk / "s.duckdb"
        assert cli("ingest", DP4, "--db", db, "--job", "dp4").returncode == 0
        assert cli("attribute", "--db", db).returncode == 0
        before = counts(db, ("ledger_totals", "ledger_segments", "step_windows", "traces"))
        assert before["ledger_totals"] > 0
        fill(disk, 16 << 10)
        r = cli("attribute", "--db", db)
        assert r.returncode == 2, r.stdout + r.stderr
        (line,) = one_line_disk_full(r.stdout + r.stderr, disk)
        assert line.startswith("error: disk full") and "'dp4'" in line, line
        assert counts(db, ("ledger_totals", "ledger_segments", "step_windows", "traces")) == before


def _catalog(db):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {"n1_runs": con.execute("SELECT * FROM batch_runs WHERE night = 'n1' ORDER BY ALL").fetchall(),
                **{t: con.execute(f"SELECT count(*) FROM {t} WHERE job = 'a'").fetchone()[0]
                   for t in ("batch_shares", "ledger_totals", "traces", "gpu_ops")}}
    finally:
        con.close()


def test_batch_on_a_full_disk_fails_each_job_in_one_line_and_keeps_the_catalog(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    shutil.copytree(DP4, root / "a", ignore=shutil.ignore_patterns("ground_truth.json"))
    with small_disk(tmp_path / "disk", "48m") as disk:
        db, reports = disk / "c.duckdb", tmp_path / "reports"
        r = cli("batch", root, "--db", db, "--reports", reports, "--scheduler", "serial", "--night", "n1")
        assert r.returncode == 0, r.stdout + r.stderr
        before = _catalog(db)
        assert before["ledger_totals"] and before["n1_runs"]
        for job, seed in (("b", 3), ("c", 4)):
            generate(root / job, ranks=2, steps=3, seed=seed)
            (root / job / "ground_truth.json").unlink()
        # room for the catalog to record the night, none for the jobs' Parquet and ledgers
        fill(disk, 400 << 10)
        r = cli("batch", root, "--db", db, "--reports", reports, "--scheduler", "serial", "--night", "n2")
        out = r.stdout + r.stderr
        assert r.returncode == 4, out
        lines = one_line_disk_full(out, disk)
        failed = [ln for ln in out.splitlines() if "FAILED" in ln]
        assert [ln.split()[1] for ln in failed] == ["b", "c"] and all(ln in lines for ln in failed), out
        assert _catalog(db) == before
        # none at all: the catalog cannot record the night; one line, exit 2, the catalog as it was
        fill(disk, 0)
        r = cli("batch", root, "--db", db, "--reports", reports, "--scheduler", "serial", "--night", "n3")
        assert r.returncode == 2, r.stdout + r.stderr
        (line,) = one_line_disk_full(r.stdout + r.stderr, disk)
        assert line.startswith("error: disk full") and "batch catalog" in line, line
        assert _catalog(db) == before


def test_a_store_that_cannot_be_created_on_a_full_disk_is_one_line(tmp_path):
    with small_disk(tmp_path / "disk", "1m") as disk:
        fill(disk, 0)
        r = cli("ingest", DP4, "--db", disk / "new.duckdb")
        assert r.returncode == 2, r.stdout + r.stderr
        (line,) = one_line_disk_full(r.stdout + r.stderr, disk)
        assert line.startswith("error: disk full") and "new.duckdb" in line, line
