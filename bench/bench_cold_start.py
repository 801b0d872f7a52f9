"""The first `ninefold attribute` after an install or an upgrade: numba compiles the attribution kernels (and
writes them to its on-disk cache) before they run. Times `ninefold attribute` on a generated 4-rank job in a
fresh process with an empty numba cache (cold), then again with the cache it left (warm), side by side.

    python bench/bench_cold_start.py [--runs 2]

Prints each run's cold and warm seconds, the compile overhead (cold − warm) and the ratio cold / warm.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timed(cmd, env):
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    from sample_traces.generate import main as generate

    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        generate([str(d / "job")])
        cli = [sys.executable, "-m", "ninefold.cli.main"]
        db = d / "store.duckdb"
        timed(cli + ["ingest", str(d / "job"), "--db", str(db), "--quiet"], dict(os.environ))
        print(f"{'run':>3s} {'cold_s':>7s} {'warm_s':>7s} {'compile_s':>9s} {'cold/warm':>9s}")
        for run in range(a.runs):
            cache = d / f"numba-cache-{run}"
            env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
            out = []
            for _ in range(2):          # empty cache, then the cache the first run wrote
                shutil.copy(db, d / "work.duckdb")
                out.append(timed(cli + ["attribute", "--db", str(d / "work.duckdb"), "--job", "job"], env))
            cold, warm = out
            print(f"{run:3d} {cold:7.2f} {warm:7.2f} {cold - warm:9.2f} {cold / warm:9.1f}", flush=True)


if __name__ == "__main__":
    main()
