"""Attribution throughput on a synthetic 64-rank job, 1e5 to 1e7 GPU ops, against a baseline of one
numpy argsort of the same start times (the floor any interval sweep pays), run side by side.

    python bench/bench_attribution.py [--max 10000000]

Prints ops/s per core (DuckDB and numpy here use up to 2 threads; the figure divides by the cores used) and
the time-per-op ratio against the smallest size to show the growth is linear.
"""
import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from analysis.attribution import attribute_job
from store.connection import connect

RANKS = 64


def build(con, n_ops):
    per = n_ops // RANKS
    con.execute("DELETE FROM gpu_ops; DELETE FROM host_ops; DELETE FROM traces; DELETE FROM steps; "
                "DELETE FROM collectives")
    con.execute(f"""INSERT INTO traces (job, rank, path, sha256, format, world_size)
        SELECT 'b', r, 'p' || r, 's' || r, 'kineto', {RANKS} FROM range({RANKS}) t(r)""")
    # kernels of 4 classes on 2 streams, 10 steps per rank, launch lag 0-20 us
    con.execute(f"""INSERT INTO gpu_ops (job, rank, device, stream, kind, name, start_ns, end_ns, correlation)
        SELECT 'b', r, 0, 7 + (i % 2), CASE WHEN i % 17 = 0 THEN 'memcpy' ELSE 'kernel' END,
               CASE i % 4 WHEN 0 THEN 'sm90_xmma_gemm' WHEN 1 THEN 'flash_fwd_kernel'
                          WHEN 2 THEN 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL' ELSE 'vectorized_elementwise' END,
               i * 10000 + (hash(i, r) % 3000), i * 10000 + (hash(i, r) % 3000) + 4000 + (hash(r, i) % 9000),
               r * {per} + i
        FROM range({RANKS}) a(r), range({per}) b(i)""")
    con.execute(f"""INSERT INTO host_ops (job, rank, pid, tid, cat, name, start_ns, end_ns, correlation)
        SELECT 'b', rank, '1', '1', 'cuda_runtime', 'cudaLaunchKernel', start_ns - 5000, start_ns - 4000, correlation
        FROM gpu_ops""")
    # every AllReduce kernel is one collective of the 64-rank group (matched across ranks by sequence)
    con.execute(f"""INSERT INTO collectives (job, rank, pg_name, seq, coll, group_size, start_ns, end_ns, source,
                                            kernel_name)
        SELECT job, rank, '0', (correlation - rank * {per}) // 4,
               'allreduce', 64, start_ns, end_ns, 'kernel', name
        FROM gpu_ops WHERE name LIKE 'nccl%'""")
    con.execute(f"""INSERT INTO steps SELECT 'b', r, s, s * {per // 10} * 10000 - 10000, (s + 1) * {per // 10} * 10000 - 10000
        FROM range({RANKS}) a(r), range(10) b(s)""")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max", type=int, default=10_000_000)
    a = ap.parse_args()
    cores = min(2, os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as d:
        con = connect(Path(d) / "b.duckdb")
        sizes = [n for n in (100_000, 1_000_000, 3_000_000, 10_000_000) if n <= a.max]
        build(con, 10_000)
        attribute_job(con, "b")  # warm-up: module imports (pyarrow, DuckDB's Arrow scan) are paid once here
        base_per_op = None
        print(f"{'ops':>10s} {'attr_s':>8s} {'ops/s/core':>12s} {'argsort_s':>9s} {'ratio':>6s} {'ns/op vs 1e5':>12s}"
              "   stages (s): align / read / sweep / write")
        for n in sizes:
            build(con, n)
            t = time.perf_counter()
            res = attribute_job(con, "b")
            dt = time.perf_counter() - t
            starts = con.execute("SELECT start_ns FROM gpu_ops").fetchnumpy()["start_ns"]
            t = time.perf_counter()
            np.argsort(starts, kind="stable")
            dt_base = time.perf_counter() - t
            per_op = dt / n
            base_per_op = base_per_op or per_op
            st = " / ".join(f"{res['seconds'][k]:.2f}" for k in ("align", "read", "sweep", "write"))
            print(f"{n:10d} {dt:8.2f} {n / dt / cores:12,.0f} {dt_base:9.3f} {dt / dt_base:6.1f} {per_op / base_per_op:12.2f}"
                  f"   {st}")


if __name__ == "__main__":
    main()
