"""Ingest speed and memory against json.load and gzip -dc, side by side on the same file.

    python bench/bench_ingest.py [--mb 520] [--keep DIR] [--ranks 16 --rank-mb 40]

Each measurement runs in its own child process so peak RSS (ru_maxrss) is that of the work alone.
Prints MB/s, the ratios the targets are stated in and where ingest's time goes (ninefold.ingest.load.STAGES: read =
hash, locate and copy out the event array; parse = the JSON reader; build = the SQL that builds the stored
tables; write = the commit). With --ranks N it then does the same for a directory of N generated rank files
ingested as `ninefold ingest DIR` does (against json.load of each file in turn; RSS against the largest file).
"""
import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = {
    "ingest": "import ninefold.ingest.load as L; from ninefold.store.connection import connect; L.STAGES = {}; "
              "con = connect(sys.argv[2]); r = L.load_kineto(con, sys.argv[1], 'bench', rank=0); "
              "assert r.status == 'stored', r",
    "ingest_dir": "import ninefold.ingest.load as L; from ninefold.store.connection import connect; L.STAGES = {}; "
                  "con = connect(sys.argv[2]); rs = L.ingest_paths(con, [sys.argv[1]], job='bench'); "
                  "assert rs and all(r.status in ('stored', 'skipped') for r in rs), rs",
    "json_load": "import json; json.load(open(sys.argv[1], 'rb'))",
    "json_load_dir": "import json, pathlib; [json.load(open(f, 'rb')) for f in "
                     "sorted(pathlib.Path(sys.argv[1]).glob('rank-*.json'))]",
}
STAGE_NAMES = ("read", "parse", "build", "write")


def run_child(kind, *args):
    """(wall seconds, peak RSS bytes, stage seconds) of one measurement in a fresh process."""
    code = f"import sys, time, resource, json; t = time.perf_counter(); {CHILD[kind]}; " \
           "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); " \
           "import ninefold.ingest.load as L; print(json.dumps(L.STAGES or {}))" if kind.startswith("ingest") else \
           f"import sys, time, resource; t = time.perf_counter(); {CHILD[kind]}; " \
           "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); print('{}')"
    lines = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.strip().splitlines()
    t, rss = lines[-2].split()
    return float(t), int(rss) * 1024, json.loads(lines[-1])


def stage_line(stages: dict, total: float) -> str:
    parts = [f"{k} {stages.get(k, 0.0):.2f}s" for k in STAGE_NAMES]
    other = total - sum(stages.get(k, 0.0) for k in STAGE_NAMES)
    return "stages               " + "  ".join(parts) + f"  other {other:.2f}s"


def report(label, mb, size, t_ing, rss_ing, stages, t_json, rss_json, total=None):
    print(f"{label:20s} {mb:8.0f} MB")
    print(f"ingest               {t_ing:8.2f} s  {mb / t_ing:7.0f} MB/s  peak RSS {rss_ing / 1e6:6.0f} MB")
    print(stage_line(stages, t_ing))
    print(f"json.load            {t_json:8.2f} s  {mb / t_json:7.0f} MB/s  peak RSS {rss_json / 1e6:6.0f} MB")
    print(f"ratio speed (json.load / ingest)       {t_json / t_ing:5.2f}x   target >= 5")
    print(f"ratio RSS (ingest peak / file size)    {rss_ing / size:5.2f}x   target <= 1.5")
    if total is not None:
        print(f"ratio RSS (ingest peak / all files)    {rss_ing / total:5.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=520)
    ap.add_argument("--keep", default=None)
    ap.add_argument("--ranks", type=int, default=0, help="also a directory of this many rank files")
    ap.add_argument("--rank-mb", type=int, default=40)
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
    t_ing, rss_ing, stages = run_child("ingest", trace, db)
    t_json, rss_json, _ = run_child("json_load", trace)
    report("file", mb, size, t_ing, rss_ing, stages, t_json, rss_json)

    gz = work / "rank-0.json.gz"
    if not gz.exists():
        subprocess.run(f"gzip -1 -c {trace} > {gz}", shell=True, check=True)
    t = time.perf_counter()
    subprocess.run(f"gzip -dc {gz} > /dev/null", shell=True, check=True)
    t_gz = time.perf_counter() - t
    db.unlink(missing_ok=True)
    t_ing_gz, _, stages_gz = run_child("ingest", gz, db)
    print(f"gzip -dc             {t_gz:8.2f} s")
    print(f"ingest .json.gz      {t_ing_gz:8.2f} s")
    print(stage_line(stages_gz, t_ing_gz))
    print(f"ratio gz (ingest .gz / gzip -dc)       {t_ing_gz / t_gz:5.2f}x   target <= 1.3")
    print(f"ratio gz (ingest .gz / ingest .json)   {t_ing_gz / t_ing:5.2f}x   target <= 1.15")

    if a.ranks:
        job = work / f"ranks-{a.ranks}"
        if not job.exists():
            sys.path.insert(0, str(ROOT))
            from sample_traces.generate import generate
            generate(job, ranks=a.ranks, steps=3, seed=2, target_mb=a.rank_mb)
        files = sorted(job.glob("rank-*.json"))
        sizes = [f.stat().st_size for f in files]
        db.unlink(missing_ok=True)
        t_ing, rss_ing, stages = run_child("ingest_dir", job, db)
        t_json, rss_json, _ = run_child("json_load_dir", job)
        report(f"{len(files)} rank files", sum(sizes) / 1e6, max(sizes), t_ing, rss_ing, stages, t_json, rss_json,
               total=sum(sizes))
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
