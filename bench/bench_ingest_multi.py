"""Multi-file ingest on both cores: a directory of per-rank files ingested with files parsed ahead on
other cursors, against the same files one at a time (prefetch off), side by side.

    python bench/bench_ingest_multi.py [--ranks 8] [--mb 12]

Prints both wall times, the CPU utilisation of each (process CPU seconds / wall seconds, up to 2 on
two cores) and the speed-up ratio.
"""
import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ninefold.ingest.load as load  # noqa: E402
from sample_traces.generate import generate  # noqa: E402
from ninefold.store.connection import connect  # noqa: E402


def run(files, work, tag, limit):
    load.PREFETCH_MAX_BYTES = limit
    db = work / f"{tag}.duckdb"
    db.unlink(missing_ok=True)
    con = connect(db)
    t, c = time.perf_counter(), time.process_time()
    res = load.ingest_paths(con, files, job="j")
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    assert all(r.status == "stored" for r in res), res
    n = con.execute("SELECT count(*) FROM gpu_ops").fetchone()[0]
    con.close()
    return wall, cpu, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--mb", type=int, default=12)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="nf-multi-"))
    try:
        generate(work / "job", ranks=a.ranks, steps=3, seed=2, target_mb=a.mb)
        files = sorted((work / "job").glob("rank-*.json"))
        mb = sum(f.stat().st_size for f in files) / 1e6
        default = load.PREFETCH_MAX_BYTES
        ws, cs, n1 = run(files, work, "serial", 0)
        wp, cp, n2 = run(files, work, "prefetch", default)
        assert n1 == n2
        print(f"{len(files)} files, {mb:.0f} MB, {n1} GPU ops")
        print(f"one at a time   {ws:7.2f} s  {mb / ws:6.0f} MB/s  cpu/wall {cs / ws:4.2f}")
        print(f"parsed ahead    {wp:7.2f} s  {mb / wp:6.0f} MB/s  cpu/wall {cp / wp:4.2f}")
        print(f"ratio (one at a time / parsed ahead)  {ws / wp:5.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
