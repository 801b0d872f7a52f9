"""Ingest speed and memory against json.load and gzip -dc, side by side on the same file.

    python bench/bench_ingest.py [--mb 520] [--keep DIR]

Each measurement runs in its own child process so peak RSS (ru_maxrss) is that of the work alone.
Prints MB/s and the ratios the targets are stated in.
"""
import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = {
    "ingest": "from ingest.load import load_kineto; from store.connection import connect; "
              "con = connect(sys.argv[2]); r = load_kineto(con, sys.argv[1], 'bench', rank=0); "
              "assert r.status == 'stored', r",
    "json_load": "import json; json.load(open(sys.argv[1], 'rb'))",
}


def run_child(kind, *args):
    code = f"import sys, time, resource; t = time.perf_counter(); {CHILD[kind]}; " \
           "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.split()[-2:]
    return float(out[0]), int(out[1]) * 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=520)
    ap.add_argument("--keep", default=None)
    a = ap.parse_args()
    work = Path(a.keep or tempfile.mkdtemp(prefix="nf-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    trace = work / "rank-0.json"
    if not trace.exists():
        sys.path.insert(0, str(ROOT))
        from sample_traces.generate import generate
        t = time.perf_counter()
        generate(work, ranks=1, steps=3, seed=1, target_mb=a.mb)
        print(f"generated {trace.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t:.1f}s")
    size = trace.stat().st_size
    mb = size / 1e6
    db = work / "bench.duckdb"
    db.unlink(missing_ok=True)
    t_ing, rss_ing = run_child("ingest", trace, db)
    t_json, rss_json = run_child("json_load", trace)
    print(f"file                 {mb:8.0f} MB")
    print(f"ingest               {t_ing:8.2f} s  {mb / t_ing:7.0f} MB/s  peak RSS {rss_ing / 1e6:6.0f} MB")
    print(f"json.load            {t_json:8.2f} s  {mb / t_json:7.0f} MB/s  peak RSS {rss_json / 1e6:6.0f} MB")
    print(f"ratio speed (json.load / ingest)       {t_json / t_ing:5.2f}x   target >= 5")
    print(f"ratio RSS (ingest peak / file size)    {rss_ing / size:5.2f}x   target <= 1.5")

    gz = work / "rank-0.json.gz"
    if not gz.exists():
        subprocess.run(f"gzip -1 -c {trace} > {gz}", shell=True, check=True)
    t = time.perf_counter()
    subprocess.run(f"gzip -dc {gz} > /dev/null", shell=True, check=True)
    t_gz = time.perf_counter() - t
    db.unlink(missing_ok=True)
    t_ing_gz, _ = run_child("ingest", gz, db)
    print(f"gzip -dc             {t_gz:8.2f} s")
    print(f"ingest .json.gz      {t_ing_gz:8.2f} s")
    print(f"ratio gz (ingest .gz / gzip -dc)       {t_ing_gz / t_gz:5.2f}x   target <= 1.3")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
