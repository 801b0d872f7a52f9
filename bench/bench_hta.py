"""ninefold attribute against Holistic Trace Analysis 0.5's temporal breakdown, side by side on one generated
16-rank job.

    python bench/bench_hta.py [--ranks 16] [--target-mb 32] [--repeat 3]

HTA is installed by this script into its own environment (bench/.venv-hta; never a dependency of ninefold).
Both tools load the same Kineto files first, untimed for the comparison (ninefold: ingest into a DuckDB file;
HTA: TraceAnalysis(trace_dir=...)); then the timed part, best of --repeat: `attribute_job` (nine ledgers, every
interval stored) against `get_temporal_breakdown(visualize=False)` (three buckets per rank, in memory).
Prints both times, the load times beside them, and the ratio.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
HTA_ENV = ROOT / "bench" / ".venv-hta"
HTA_SPEC = ["holistictraceanalysis==0.5.*", "pandas<2.3", "numpy<2.3"]  # HTA 0.5 predates pandas 3

HTA_RUN = r"""
import json, sys, time, warnings, logging
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter()
ta = TraceAnalysis(trace_dir=sys.argv[1])
load = time.perf_counter() - t
best, df = None, None
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    df = ta.get_temporal_breakdown(visualize=False)
    dt = time.perf_counter() - t
    best = dt if best is None else min(best, dt)
print(json.dumps({"load": load, "breakdown": best, "ranks": int(len(df))}))
"""


def hta_python():
    py = HTA_ENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(HTA_ENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *HTA_SPEC], check=True)
    return py


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--target-mb", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    py = hta_python()
    from ninefold.analysis.attribution.attribute import attribute_job
    from ninefold.ingest.load import ingest_paths
    from ninefold.store.connection import connect

    with tempfile.TemporaryDirectory() as d:
        job = Path(d) / "job"
        subprocess.run([sys.executable, "-m", "sample_traces.generate", str(job), "--ranks", str(a.ranks),
                        "--steps", "3", "--seed", "0", "--target-mb", str(a.target_mb)], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
        files = sorted(job.glob("rank-*.json"))
        hta_dir = Path(d) / "hta"  # HTA reads every .json of its folder: the rank files only, not ground_truth.json
        hta_dir.mkdir()
        for f in files:
            (hta_dir / f.name).symlink_to(f)
        con = connect(Path(d) / "n.duckdb")
        t = time.perf_counter()
        ingest_paths(con, files, job="j")
        n_load = time.perf_counter() - t
        n_ops = con.execute("SELECT count(*) FROM gpu_ops WHERE job = 'j'").fetchone()[0]
        attribute_job(con, "j")  # numba's cache and pyarrow are loaded once, as in a long-running service
        best = None
        for _ in range(a.repeat):
            t = time.perf_counter()
            attribute_job(con, "j")
            dt = time.perf_counter() - t
            best = dt if best is None else min(best, dt)
        con.close()
        p = subprocess.run([str(py), "-c", HTA_RUN, str(hta_dir), str(a.repeat)], capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(p.stderr[-3000:])
        h = json.loads(p.stdout.strip().splitlines()[-1])
        mb = sum(f.stat().st_size for f in files) / 2**20
        print(f"job: {a.ranks} ranks, {mb:.0f} MiB of Kineto JSON, {n_ops:,} GPU ops; best of {a.repeat}")
        print(f"{'':28s} {'load_s':>8s} {'analysis_s':>10s}")
        print(f"{'ninefold attribute_job':28s} {n_load:8.2f} {best:10.3f}   (9 ledgers, intervals stored)")
        print(f"{'HTA get_temporal_breakdown':28s} {h['load']:8.2f} {h['breakdown']:10.3f}   (3 buckets, {h['ranks']} ranks)")
        print(f"ratio HTA / ninefold (analysis): {h['breakdown'] / best:.1f}x")


if __name__ == "__main__":
    main()
