"""`ninefold ingest --jobs N`: how many files parse side by side changes nothing that is stored."""
import hashlib
import subprocess
import sys

import duckdb
import pytest

from conftest import ROOT
from sample_traces.generate import generate

TABLES = {
    "gpu_ops": "rank, device, stream, kind, name, start_ns, end_ns, correlation, external_id, copy_kind, bytes, args",
    "host_ops": "rank, pid, tid, cat, name, start_ns, end_ns, external_id, correlation, depth, args",
    "collectives": "rank, pg_name, seq, coll, start_ns, end_ns, kernel_name, source",
    "steps": "rank, step, start_ns, end_ns",
    "flows": "*",
    "diagnostics": "rank, source, code, count",
    "traces": "rank, sha256, n_events, time_mode",
}


def _digest(db):
    con = duckdb.connect(str(db), read_only=True)
    out = {}
    for t, cols in TABLES.items():
        rows = con.execute(f"SELECT {cols} FROM {t} ORDER BY ALL").fetchall()
        out[t] = (len(rows), hashlib.sha256(repr(rows).encode()).hexdigest())
    con.close()
    return out


def _ingest(tmp_path, src, *extra):
    db = tmp_path / f"j{'-'.join(extra) or 'default'}.duckdb"
    r = subprocess.run([sys.executable, "-m", "ninefold.cli.main", "ingest", str(src), "--db", str(db), "--job", "j",
                        *extra], cwd=ROOT, capture_output=True, text=True)
    return r, db


def test_jobs_store_the_same_rows(tmp_path):
    src = tmp_path / "job"
    generate(src, ranks=5, steps=2, seed=3)
    runs = {n: _ingest(tmp_path, src, "--jobs", n) for n in ("1", "3")}
    runs["default"] = _ingest(tmp_path, src)
    for n, (r, _) in runs.items():
        assert r.returncode == 0, (n, r.stdout, r.stderr)
        assert "5 stored" in r.stdout and "1 skipped" in r.stdout, r.stdout    # ground_truth.json is skipped
    want = _digest(runs["1"][1])
    assert want["gpu_ops"][0] > 0 and want["traces"][0] == 5
    assert _digest(runs["3"][1]) == want
    assert _digest(runs["default"][1]) == want


@pytest.mark.parametrize("bad", ["0", "-2", "two"])
def test_jobs_below_one_is_refused_in_one_line(tmp_path, bad):
    r, db = _ingest(tmp_path, tmp_path, "--jobs", bad)
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()[-1]             # click's usage lines, then the one error line
    assert err.startswith("Error:") and "--jobs" in err, r.stderr
    assert not db.exists()
