"""Nsight Systems SQLite ingest throughput, against plain sqlite3 reads of the same table in the same run.

A synthetic export is built with the exact DDL (and ENUM / metadata rows) of a real shared export, then
filled by recursive-CTE INSERTs: N kernels over P processes, one CUDA runtime launch per kernel, a memcpy
every 100 kernels and ProfilerStep#k NVTX ranges. The whole file is then ingested (kernels, launches,
NVTX, steps, one transaction) and the kernel rows per second are printed next to two baselines: a sqlite3
fetchall of 8 kernel columns, and of every column of every table the ingest reads (kernels, runtime and
driver launches, copies, memsets, syncs, NVTX, StringIds) — the same columns.

    .venv/bin/python bench/bench_nsys.py [--kernels 2000000] [--procs 2] [--steps 200] [--keep DIR]
Target: >= 1,000,000 kernel rows/s for the whole ingest.
"""
from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TEMPLATE = ROOT.parent / "shared" / "traces" / "nsys_misc" / "fuser" / "report1.sqlite"
COPY_ROWS = ("META_DATA_EXPORT", "TARGET_INFO_SESSION_START_TIME", "TARGET_INFO_GPU")
N_NAMES = 200
GPID0 = 282323165642752          # a real globalPid layout: host bits | pid << 24


def make_export(path: Path, template: Path, n_kernels: int, procs: int = 2, steps: int = 200) -> None:
    """An nsys-shaped SQLite file with the template's schema and generated rows."""
    from urllib.parse import quote

    path.unlink(missing_ok=True)
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = OFF")
    db.execute("PRAGMA synchronous = OFF")
    db.execute("ATTACH ? AS t", ["file:" + quote(str(template.resolve())) + "?mode=ro&immutable=1"])
    # sqlite3.connect only takes URIs with uri=True; for ATTACH the flag must be set on the main connection
    for name, sql in db.execute("SELECT name, sql FROM t.sqlite_master WHERE type = 'table' AND sql IS NOT NULL"):
        db.execute(sql)
        if name.startswith("ENUM_") or name in COPY_ROWS:
            db.execute(f'INSERT INTO main."{name}" SELECT * FROM t."{name}"')
    db.commit()
    db.execute("DETACH t")
    per = n_kernels // procs
    step_len = max(per // steps, 1)
    db.execute("""INSERT INTO StringIds (id, value)
        WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?)
        SELECT i, 'void gemm_like_kernel_' || i || '<float, 128, 64>(float const*, float*, int)' FROM c""",
               [N_NAMES])
    db.execute("INSERT INTO StringIds VALUES (100000, 'cudaLaunchKernel_v7000'), (100001, 'cudaMemcpyAsync_v3020')")
    db.executemany("INSERT INTO PROCESSES (globalPid, pid, name) VALUES (?, ?, 'python')",
                   [(GPID0 + (p << 24), (GPID0 >> 24 & 0xFFFFFF) + p) for p in range(procs)])
    # kernel i of process p: local index j = i / procs; 2 us apart, 1.2 us long; its launch 0.8 us before
    db.execute(f"""INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, "end", deviceId, contextId, streamId,
            correlationId, globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX,
            blockY, blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId)
        WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i < {per * procs - 1})
        SELECT 1000000000 + (i / {procs}) * 2000, 1000000000 + (i / {procs}) * 2000 + 1200, i % {procs}, 1, 7,
               i / {procs} + 1, {GPID0} + ((i % {procs}) << 24), 1 + i % {N_NAMES}, 1 + i % {N_NAMES}, 32,
               128, 1, 1, 256, 1, 1, 0, 4096, 0, 0, i
        FROM c""")
    db.execute(f"""INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, "end", eventClass, globalTid, correlationId,
            nameId, returnValue)
        WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i < {per * procs - 1})
        SELECT 1000000000 + (i / {procs}) * 2000 - 800, 1000000000 + (i / {procs}) * 2000 - 300, 0,
               {GPID0} + ((i % {procs}) << 24) + 1, i / {procs} + 1, 100000, 0
        FROM c""")
    db.execute(f"""INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, "end", deviceId, contextId, streamId,
            correlationId, globalPid, bytes, copyKind, srcKind, dstKind)
        WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i < {per * procs // 100 - 1})
        SELECT 1000000000 + i * 100 * 2000 / {procs} + 1300, 1000000000 + i * 100 * 2000 / {procs} + 1600,
               i % {procs}, 1, 8, {per + 1} + i, {GPID0} + ((i % {procs}) << 24), 1048576, 1, 1, 2 FROM c""")
    db.execute(f"""INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid, domainId)
        WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i < {steps * procs - 1})
        SELECT 1000000000 + (i / {procs}) * {step_len} * 2000 - 1000,
               1000000000 + ((i / {procs}) + 1) * {step_len} * 2000 - 1000, 59,
               'ProfilerStep#' || (i / {procs}), {GPID0} + ((i % {procs}) << 24) + 1, 0 FROM c""")
    db.commit()
    db.close()


# the columns the ingest reads (ninefold.ingest.nsys_read._read_all), table by table, where the file has them
GPU_COLS = ["start", "end", "globalPid", "deviceId", "streamId", "correlationId"]
API_COLS = ["start", "end", "globalTid", "correlationId", "nameId", "returnValue", "eventClass", "name"]
READS = [("CUPTI_ACTIVITY_KIND_KERNEL", GPU_COLS + ["demangledName", "shortName", "name"]),
         ("CUPTI_ACTIVITY_KIND_RUNTIME", API_COLS), ("CUPTI_ACTIVITY_KIND_DRIVER", API_COLS),
         ("CUPTI_ACTIVITY_KIND_MEMCPY", GPU_COLS + ["bytes", "copyKind", "srcKind", "dstKind", "contextId",
                                                    "graphNodeId"]),
         ("CUPTI_ACTIVITY_KIND_MEMSET", GPU_COLS + ["bytes", "memKind", "value", "contextId", "graphNodeId"]),
         ("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", GPU_COLS + ["syncType", "eventId", "contextId"]),
         ("NVTX_EVENTS", ["start", "end", "eventType", "globalTid", "textId", "domainId", "category", "text"]),
         ("StringIds", ["id", "value"])]


def fetch_ingest_columns(raw) -> tuple[int, int]:
    """sqlite3 fetchall of every column the ingest reads; returns (tables, rows)."""
    tables = rows = 0
    for t, cols in READS:
        have = {r[1] for r in raw.execute(f'PRAGMA table_info("{t}")')}
        cols = [c for c in cols if c in have]
        if cols:
            sel = ", ".join(f'"{c}"' for c in cols)
            rows += len(raw.execute(f'SELECT {sel} FROM "{t}"').fetchall())
            tables += 1
    return tables, rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=2_000_000)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--template", type=Path, default=TEMPLATE)
    ap.add_argument("--keep", type=Path, default=None, help="build the files in this directory and keep them")
    a = ap.parse_args(argv)

    from ninefold.ingest.nsys import load
    from ninefold.store.connection import connect

    work = a.keep or Path(tempfile.mkdtemp(prefix="bench_nsys_"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "synthetic.sqlite"
    t0 = time.perf_counter()
    make_export(src, a.template, a.kernels, a.procs, a.steps)
    print(f"built {src} ({src.stat().st_size / 2**20:.0f} MiB, {a.kernels:,} kernels, {a.procs} processes) "
          f"in {time.perf_counter() - t0:.1f}s from the schema of {a.template.name}")
    try:
        raw = sqlite3.connect(src)
        t0 = time.perf_counter()
        n = raw.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        t_count = time.perf_counter() - t0
        t0 = time.perf_counter()
        rows = raw.execute('SELECT start, "end", deviceId, streamId, correlationId, globalPid, demangledName, '
                           "shortName FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
        t_fetch = time.perf_counter() - t0
        assert len(rows) == n
        del rows
        t0 = time.perf_counter()
        n_tables, n_rows = fetch_ingest_columns(raw)
        t_all = time.perf_counter() - t0
        raw.close()

        dbp = work / "bench.duckdb"
        dbp.unlink(missing_ok=True)
        con = connect(dbp)
        t0 = time.perf_counter()
        res = load(con, src, "bench")
        t_ingest = time.perf_counter() - t0
        stored = con.execute("SELECT count(*) FROM gpu_ops WHERE kind = 'kernel'").fetchone()[0]
        host = con.execute("SELECT count(*) FROM host_ops").fetchone()[0]
        steps = con.execute("SELECT count(*) FROM steps").fetchone()[0]
        con.close()
        assert stored == n, (stored, n)
        assert len(res) == a.procs and all(r.status == "stored" for r in res)

        base_rate = n / t_fetch
        rate = n / t_ingest
        print(f"baseline  sqlite3 SELECT count(*)           {t_count:8.3f} s")
        print(f"baseline  sqlite3 fetchall (8 kernel cols)  {t_fetch:8.3f} s  {base_rate:12,.0f} kernel rows/s")
        print(f"ninefold  nsys ingest (whole file)          {t_ingest:8.3f} s  {rate:12,.0f} kernel rows/s  "
              f"({stored:,} kernels, {host:,} host ops, {steps} steps, {len(res)} ranks)")
        print(f"baseline  sqlite3 fetchall (every column the ingest reads: {n_tables} tables, {n_rows:,} rows)  "
              f"{t_all:8.3f} s  {n / t_all:12,.0f} kernel rows/s")
        print(f"ratio ingest / sqlite3 fetchall: {rate / base_rate:.2f}x of the 8 kernel columns, "
              f"{rate * t_all / n:.2f}x of every column the ingest reads   "
              f"target >= 1,000,000 kernel rows/s: {'met' if rate >= 1_000_000 else 'NOT met'}")
    finally:
        if a.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
