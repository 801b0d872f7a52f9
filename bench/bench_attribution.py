"""Attribution throughput on a synthetic job, 1e5 to 1e7 GPU ops (1e8 with --sizes), against a baseline of one
numpy argsort of the same start times (the floor any interval sweep pays), run side by side.

    python bench/bench_attribution.py [--sizes 1e5,1e6,1e7] [--ranks 64] [--threads 1,2]
    python bench/bench_attribution.py --sizes 1e6,1e8 --ranks 1024 --threads 2     # the 1,024-rank job

Each attribution runs in its own process over a DuckDB file built beforehand, so its peak RSS
(resource.getrusage) is its own: printed as bytes per GPU op, raw and above the process's RSS after imports.
Prints ops/s per core used (threads = DuckDB's and the rank passes'), the stage split, the ratio to the argsort
floor and the time-per-op ratio against the first size (linearity).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build(con, n_ops, ranks):
    per = n_ops // ranks
    # kernels of 4 classes on 2 streams, 10 steps per rank, launch lag 0-20 us
    con.execute(f"""INSERT INTO traces (job, rank, path, sha256, format, world_size)
        SELECT 'b', r, 'p' || r, 's' || r, 'kineto', {ranks} FROM range({ranks}) t(r)""")
    con.execute(f"""INSERT INTO gpu_ops (job, rank, device, stream, kind, name, start_ns, end_ns, correlation)
        SELECT 'b', r, 0, 7 + (i % 2), CASE WHEN i % 17 = 0 THEN 'memcpy' ELSE 'kernel' END,
               CASE i % 4 WHEN 0 THEN 'sm90_xmma_gemm' WHEN 1 THEN 'flash_fwd_kernel'
                          WHEN 2 THEN 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL' ELSE 'vectorized_elementwise' END,
               i * 10000 + (hash(i, r) % 3000), i * 10000 + (hash(i, r) % 3000) + 4000 + (hash(r, i) % 9000),
               r * {per} + i
        FROM range({ranks}) a(r), range({per}) b(i)""")
    con.execute("""INSERT INTO host_ops (job, rank, pid, tid, cat, name, start_ns, end_ns, correlation)
        SELECT 'b', rank, '1', '1', 'cuda_runtime', 'cudaLaunchKernel', start_ns - 5000, start_ns - 4000, correlation
        FROM gpu_ops""")
    # every AllReduce kernel is one collective of the whole group (matched across ranks by sequence)
    con.execute(f"""INSERT INTO collectives (job, rank, pg_name, seq, coll, group_size, start_ns, end_ns, source,
                                            kernel_name)
        SELECT job, rank, '0', (correlation - rank * {per}) // 4,
               'allreduce', {ranks}, start_ns, end_ns, 'kernel', name
        FROM gpu_ops WHERE name LIKE 'nccl%'""")
    con.execute(f"""INSERT INTO steps SELECT 'b', r, s, s * {per // 10} * 10000 - 10000,
                                             (s + 1) * {per // 10} * 10000 - 10000
        FROM range({ranks}) a(r), range(10) b(s)""")
    con.execute("CHECKPOINT")


def child(db, threads):
    """Attribute job 'b' of DB with THREADS threads; print the result as one JSON line."""
    from ninefold.analysis.attribution.attribute import attribute_job
    from ninefold.store.connection import connect

    con = connect(db)
    con.execute(f"SET threads = {threads}")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    res = attribute_job(con, "b")
    dt = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"s": dt, "stages": res["seconds"], "intervals": res["intervals"],
                      "peak_kb": peak, "base_kb": base}))


def run_child(db, threads):
    p = subprocess.run([sys.executable, __file__, "--child", str(db), "--threads", str(threads)],
                       capture_output=True, text=True, cwd=ROOT)
    if p.returncode:
        raise SystemExit(p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1e5,1e6,1e7")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        return child(a.child, int(a.threads))
    from ninefold.store.connection import connect

    sizes = [int(float(s)) for s in a.sizes.split(",")]
    threads = [int(t) for t in a.threads.split(",")]
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as d:
        warm = Path(d) / "warm.duckdb"
        con = connect(warm)
        build(con, 10_000, min(a.ranks, 16))
        con.close()
        run_child(warm, 1)  # numba's on-disk cache and DuckDB extensions are ready before the first timing
        print(f"ranks {a.ranks}; cores used = threads")
        print(f"{'ops':>11s} {'thr':>3s} {'attr_s':>7s} {'ops/s/core':>11s} {'argsort_s':>9s} {'ratio':>6s} "
              f"{'ns/op vs 1st':>12s} {'B/op peak':>9s} {'B/op >base':>10s}  stages (s): align / read / sweep / write")
        base_per_op = {}
        for n in sizes:
            db = Path(d) / f"b{n}.duckdb"
            con = connect(db)
            t = time.perf_counter()
            build(con, n, a.ranks)
            t_build = time.perf_counter() - t
            starts = con.execute("SELECT start_ns FROM gpu_ops").fetchnumpy()["start_ns"]
            n_real = starts.size
            con.close()
            t = time.perf_counter()
            np.argsort(starts, kind="stable")
            dt_base = time.perf_counter() - t
            del starts
            for th in threads:
                r = run_child(db, th)
                per_op = r["s"] / n_real
                base_per_op.setdefault(th, per_op)
                st = " / ".join(f"{r['stages'][k]:.2f}" for k in ("align", "read", "sweep", "write"))
                print(f"{n_real:11d} {th:3d} {r['s']:7.2f} {n_real / r['s'] / th:11,.0f} {dt_base:9.3f} "
                      f"{r['s'] / dt_base:6.1f} {per_op / base_per_op[th]:12.2f} "
                      f"{r['peak_kb'] * 1024 / n_real:9.0f} {(r['peak_kb'] - r['base_kb']) * 1024 / n_real:10.0f}"
                      f"  {st}   ({r['intervals'] / n_real:.2f} intervals/op; built in {t_build:.0f} s)", flush=True)
            db.unlink()


if __name__ == "__main__":
    main()
