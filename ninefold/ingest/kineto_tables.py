"""The canonical tables built from one Kineto trace's parsed events (the view ``_ev``, see ninefold.ingest.kineto):
gpu_ops, host_ops (with nesting depths, ninefold.ingest.depths), steps, flows, memory_events, collectives, diagnostics,
traces. ninefold.ingest.load calls insert_tables inside the file's one transaction."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ninefold.ingest.depths import sorted_depths
from ninefold.ingest.host_colls import insert_host_collectives
from ninefold.ingest.kineto import DTYPE_BYTES, FLOW_CATS, GPU_CATS, base_ns
from ninefold.store.arrays import from_numpy, to_numpy
from ninefold.store.schema import PER_TRACE

# The args keys the canonical columns come from. Each event's args are parsed once, into a struct
# of these (as text, exactly what json_extract_string gives), instead of once per extracted column.
ARG_KEYS = ("device", "stream", "correlation", "External id", "bytes", "Process Group Name",
            "Process Group Description", "Process Group Ranks", "Seq", "Collective name", "In msg nelems",
            "Out msg nelems", "dtype", "Group size")
ARG_SPEC = json.dumps({k: "VARCHAR" for k in ARG_KEYS}).replace("'", "''")
HOST_SPEC = json.dumps({k: "VARCHAR" for k in ("External id", "correlation")})   # all a host op's columns need


MEM_SPEC = json.dumps({k: "VARCHAR" for k in ("Device Type", "Device Id", "Addr", "Bytes", "Total Allocated",
                                               "Total Reserved")})


def _arg(key: str, col: str = "a") -> str:
    assert key in ARG_KEYS, key
    return f'{col}."{key}"'


def _arg_int(key: str, col: str = "a") -> str:
    return f"TRY_CAST({_arg(key, col)} AS BIGINT)"



def insert_tables(con, path, job, rank, meta, km, digest) -> dict:
    """Replace (JOB, RANK)'s rows by the canonical rows of the parsed events (``_ev``), inside the caller's
    transaction; returns the per-table counts."""
    for t in PER_TRACE:
        con.execute(f"DELETE FROM {t} WHERE job = ? AND rank = ?", [job, rank])
    con.execute("DELETE FROM traces WHERE job = ? AND rank = ?", [job, rank])
    diags: list[tuple[str, str, int, str]] = []

    base = base_ns(meta)
    max_ts = con.execute("SELECT max(ts) FROM _ev WHERE ph = 'X'").fetchone()[0]
    if base is not None:
        time_mode = "relative_base"
    elif max_ts is not None and max_ts > 10**14:
        # before 2024-03 Kineto wrote absolute Unix-epoch integer microseconds
        base, time_mode = 0, "absolute_us"
    else:
        base, time_mode = 0, "relative_unknown"
        diags.append(("kineto", "no_base_time", 1, "relative ts with no baseTimeNanoseconds: ranks cannot be "
                      "aligned by wall clock; alignment falls back to collectives"))

    # _xv: every complete event with its category, ns times and raw args (a view: read where it is used);
    # _x: the ones whose args columns come from many keys (GPU activity, record_param_comms), args parsed once.
    # Both are dropped before returning; on an error the caller's ROLLBACK removes them.
    gpu_list = ", ".join(f"'{c}'" for c in GPU_CATS)
    con.execute("""CREATE OR REPLACE TEMP VIEW _xv AS
        SELECT ord, xcat AS cat, name, pid, tid, start_ns, end_ns, dur, args
        FROM _ev WHERE ph = 'X' AND ts IS NOT NULL""")
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _x AS SELECT *, json_transform(args, '{ARG_SPEC}') AS a FROM _xv
        WHERE cat IN ({gpu_list}, 'cuda_sync') OR name = 'record_param_comms'""")
    neg = con.execute("SELECT count(*), any_value(name) FROM _xv WHERE dur < 0").fetchone()
    if neg[0]:
        diags.append(("kineto", "negative_duration", neg[0], f"{neg[1]} (clamped to 0)"))
    neg_ts = con.execute("SELECT count(*), any_value(name) FROM _ev WHERE ph = 'X' AND ts < 0").fetchone()
    if neg_ts[0]:
        diags.append(("kineto", "negative_ts", neg_ts[0], f"{neg_ts[1]} (stored as given: before the trace's "
                      "base time)"))
    nots = con.execute("SELECT count(*) FROM _ev WHERE ph = 'X' AND ts IS NULL").fetchone()[0]
    if nots:
        diags.append(("kineto", "missing_ts", nots, "complete events without ts were dropped"))

    gpu_case = " ".join(f"WHEN '{k}' THEN '{v}'" for k, v in GPU_CATS.items())
    con.execute(f"""INSERT INTO gpu_ops
        SELECT ?, ?, coalesce(TRY_CAST(pid AS INTEGER), TRY_CAST({_arg('device')} AS INTEGER)),
               coalesce({_arg_int('stream')}, TRY_CAST(tid AS BIGINT)),
               CASE cat {gpu_case} ELSE 'sync' END, name, start_ns, end_ns,
               {_arg_int('correlation')}, {_arg_int('External id')},
               CASE WHEN cat = 'gpu_memcpy' THEN nullif(regexp_extract(name, 'Memcpy (\\w+)', 1), '') END,
               {_arg_int('bytes')}, args
        FROM _x WHERE cat IN ({", ".join(f"'{c}'" for c in GPU_CATS)}, 'cuda_sync')""", [job, rank])

    # host side: every other complete event, with its depth on its thread (ninefold.ingest.depths: intervals open at its
    # start). Threads are numbered per distinct (pid, tid) pair, NULLs alike, so the sort runs over integers.
    host = f"cat NOT IN ({gpu_list}, 'cuda_sync')"
    hs = con.sql(f"""
        WITH h AS (SELECT ord, pid, tid, start_ns, end_ns FROM _xv WHERE {host}),
        th AS (SELECT pid, tid, row_number() OVER ()::INTEGER AS th FROM (SELECT DISTINCT pid, tid FROM h))
        SELECT h.ord, th.th, h.start_ns, h.end_ns FROM h
        JOIN th ON h.pid IS NOT DISTINCT FROM th.pid AND h.tid IS NOT DISTINCT FROM th.tid
        ORDER BY th.th, h.start_ns, h.end_ns DESC, h.ord""").to_arrow_table()
    import pyarrow as pa
    depth = sorted_depths(*(to_numpy(hs.column(k)) for k in ("th", "start_ns", "end_ns")))
    con.register("_hdepth", pa.table({"ord": hs.column("ord"), "depth": from_numpy(depth.astype(np.int32))}))
    del hs, depth
    try:
        con.execute(f"""INSERT INTO host_ops
            SELECT ?, ?, h.pid, h.tid, h.cat, h.name, h.start_ns, h.end_ns,
                   {_arg_int('External id', 'h.a')}, {_arg_int('correlation', 'h.a')}, d.depth,
                   -- runtime/driver args hold only cbid and the ids already in their own columns
                   CASE WHEN h.cat IN ('cuda_runtime', 'cuda_driver') THEN NULL ELSE h.args END
            FROM (SELECT *, json_transform(args, '{HOST_SPEC}') AS a FROM _xv WHERE {host}) h
            JOIN _hdepth d ON d.ord = h.ord""", [job, rank])
    finally:
        con.unregister("_hdepth")

    con.execute("""INSERT INTO steps
        SELECT ?, ?, CAST(regexp_extract(name, 'ProfilerStep#(\\d+)', 1) AS INTEGER) AS step,
               min(start_ns), max(end_ns)
        FROM _xv WHERE regexp_matches(name, '^ProfilerStep#\\d+$') AND cat IN ('user_annotation', 'cpu_op')
        GROUP BY step ORDER BY step""", [job, rank])

    flow_list = ", ".join(f"'{c}'" for c in FLOW_CATS)
    con.execute(f"""INSERT INTO flows
        SELECT ?, ?, xcat, TRY_CAST(id AS BIGINT), ph, start_ns
        FROM _ev WHERE ph IN ('s', 'f', 't') AND xcat IN ({flow_list})""", [job, rank])   # lower(cat): no flow cat is legacy

    # profile_memory=True: allocator instant events; bytes > 0 allocate, < 0 free
    con.execute(f"""INSERT INTO memory_events
        SELECT ?, ?, start_ns, TRY_CAST(m."Device Type" AS INTEGER), TRY_CAST(m."Device Id" AS INTEGER),
               TRY_CAST(m."Addr" AS BIGINT), TRY_CAST(m."Bytes" AS BIGINT), TRY_CAST(m."Total Allocated" AS BIGINT),
               TRY_CAST(m."Total Reserved" AS BIGINT)
        FROM (SELECT start_ns, json_transform(args, '{MEM_SPEC}') AS m FROM _ev
              WHERE ph = 'i' AND name = '[memory]' AND ts IS NOT NULL)""", [job, rank])

    dtype_case = " ".join(f"WHEN '{k}' THEN {v}" for k, v in DTYPE_BYTES.items())
    coll_cols = f"""{_arg('Process Group Name')} AS pg_name, {_arg('Process Group Description')} AS pg_desc,
        {_arg('Process Group Ranks')} AS pg_ranks, {_arg_int('Seq')} AS seq, {_arg('Collective name')} AS coll,
        {_arg_int('In msg nelems')} AS in_nelems, {_arg_int('Out msg nelems')} AS out_nelems,
        {_arg('dtype')} AS dtype, TRY_CAST({_arg('Group size')} AS INTEGER) AS group_size,
        {_arg_int('External id')} AS external_id"""
    con.execute(f"""INSERT INTO collectives
        WITH cpu AS (
            SELECT {coll_cols}, start_ns, end_ns FROM _x
            WHERE name = 'record_param_comms' AND {_arg('Collective name')} IS NOT NULL
        ), k AS (
            SELECT {coll_cols}, name AS kernel_name, start_ns, end_ns FROM _x
            WHERE cat = 'kernel' AND {_arg('Collective name')} IS NOT NULL
        ), kx AS (  -- comm kernels without args, joined to the record_param_comms op by External id
            SELECT {_arg_int('External id')} AS external_id, name AS kernel_name, start_ns, end_ns FROM _x
            WHERE cat = 'kernel' AND {_arg('Collective name')} IS NULL AND {_arg_int('External id')} IS NOT NULL
        ), j AS (
            SELECT cpu.pg_name, cpu.pg_desc, cpu.pg_ranks, cpu.seq, cpu.coll, cpu.in_nelems, cpu.out_nelems,
                   cpu.dtype, cpu.group_size,
                   coalesce(k.start_ns, kx.start_ns, cpu.start_ns) AS start_ns,
                   coalesce(k.end_ns, kx.end_ns, cpu.end_ns) AS end_ns,
                   coalesce(k.kernel_name, kx.kernel_name) AS kernel_name, cpu.external_id,
                   CASE WHEN coalesce(k.kernel_name, kx.kernel_name) IS NULL THEN 'cpu_op' ELSE 'kernel' END AS source
            FROM cpu LEFT JOIN k ON k.external_id = cpu.external_id
                     LEFT JOIN kx ON kx.external_id = cpu.external_id AND k.external_id IS NULL
            UNION ALL
            SELECT k.pg_name, k.pg_desc, k.pg_ranks, k.seq, k.coll, k.in_nelems, k.out_nelems, k.dtype,
                   k.group_size, k.start_ns, k.end_ns, k.kernel_name, k.external_id, 'kernel'
            FROM k WHERE k.external_id IS NULL OR k.external_id NOT IN (SELECT external_id FROM cpu
                                                                       WHERE external_id IS NOT NULL)
        )
        SELECT ?, ?, pg_name, pg_desc, pg_ranks, seq, coll, in_nelems, out_nelems, dtype,
               in_nelems * (CASE dtype {dtype_case} ELSE NULL END), group_size, start_ns, end_ns,
               kernel_name, external_id, source
        FROM j ORDER BY start_ns""", [job, rank])
    # communication kernels that no named record_param_comms describes, typed by the host op that launched them
    insert_host_collectives(con, job, rank)

    counts = dict(zip(
        ["kernel", "memcpy", "memset", "sync"],
        con.execute("""SELECT count(*) FILTER (kind = 'kernel'), count(*) FILTER (kind = 'memcpy'),
                       count(*) FILTER (kind = 'memset'), count(*) FILTER (kind = 'sync')
                       FROM gpu_ops WHERE job = ? AND rank = ?""", [job, rank]).fetchone()))
    counts["host_ops"] = con.execute("SELECT count(*) FROM host_ops WHERE job = ? AND rank = ?", [job, rank]).fetchone()[0]
    counts["steps"] = con.execute("SELECT count(*) FROM steps WHERE job = ? AND rank = ?", [job, rank]).fetchone()[0]
    counts["memory_events"] = con.execute("SELECT count(*) FROM memory_events WHERE job = ? AND rank = ?",
                                          [job, rank]).fetchone()[0]
    counts["collectives"] = con.execute("SELECT count(*) FROM collectives WHERE job = ? AND rank = ?",
                                        [job, rank]).fetchone()[0]

    if counts["kernel"] and not counts["steps"]:
        diags.append(("kineto", "no_profiler_steps", 1, "no ProfilerStep#N annotation: the trace is one window"))
    no_corr = con.execute("SELECT count(*) FROM gpu_ops WHERE job = ? AND rank = ? AND kind <> 'sync' "
                          "AND correlation IS NULL", [job, rank]).fetchone()[0]
    if no_corr:
        diags.append(("kineto", "gpu_op_without_correlation", no_corr, "GPU activity with no launch correlation"))
    di = meta.get("distributedInfo")
    if not isinstance(di, dict):
        diags.append(("kineto", "no_distributed_info", 1, "rank taken from the file name or --rank"))
    if km.repaired:
        diags.append(("kineto", "repaired_surrogates", km.repaired, "lone UTF-16 surrogate escapes in strings "
                      "stored as U+FFFD"))
    if km.salvaged:
        n = con.execute("SELECT count(*) FROM _ev").fetchone()[0]
        diags.append(("kineto", "salvaged_truncated", n, f"file cut at byte {km.cut_at}; kept {n} complete events"))
    other = con.execute("""SELECT cat, count(*), any_value(name) FROM _xv
        WHERE cat NOT IN ('kernel','gpu_memcpy','gpu_memset','cuda_sync','cpu_op','user_annotation',
                          'gpu_user_annotation','cuda_runtime','cuda_driver','python_function','trace',
                          'cpu_instant_event','overhead','mtia_ccp_events','mtia_runtime','cuda_profiler_range',
                          'xpu_runtime','xpu_driver','privateuse1_runtime','privateuse1_driver','hpu_op',
                          'collective_comm','cuda_event')
        GROUP BY cat""").fetchall()
    for cat, n, ex in other:
        diags.append(("kineto", f"unknown_category:{cat}", n, str(ex)[:200]))
    for src, code, n, ex in diags:
        con.execute("INSERT INTO diagnostics VALUES (?, ?, ?, ?, ?, ?)", [job, rank, src, code, n, ex])

    devices = meta.get("deviceProperties") or []
    device_name = devices[0].get("name") if devices and isinstance(devices[0], dict) else None
    world = di.get("world_size") if isinstance(di, dict) else None
    n_events = con.execute("SELECT count(*) FROM _ev").fetchone()[0]
    con.execute("INSERT INTO jobs (job, world_size) VALUES (?, ?) ON CONFLICT (job) DO UPDATE SET "
                "world_size = coalesce(excluded.world_size, jobs.world_size)", [job, world])
    con.execute("""INSERT INTO traces (job, rank, path, sha256, format, schema_version, world_size, device_name,
                   base_ns, time_mode, backend, nccl_version, pg_config, n_events, salvaged, host_name)
                   VALUES (?, ?, ?, ?, 'kineto', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                [job, rank, str(Path(path).resolve()), digest, str(meta.get("schemaVersion", "")) or None, world,
                 device_name, base, time_mode,
                 di.get("backend") if isinstance(di, dict) else None,
                 str(di.get("nccl_version")) if isinstance(di, dict) and di.get("nccl_version") else None,
                 json.dumps(di.get("pg_config")) if isinstance(di, dict) and di.get("pg_config") else None,
                 n_events, km.salvaged, _host_name(meta)])
    con.execute("DROP TABLE _x")
    con.execute("DROP VIEW _xv")
    return counts


def _host_name(meta: dict) -> str | None:
    h = meta.get("host_name", meta.get("hostname"))
    return str(h)[:255] if isinstance(h, (str, int)) and str(h) else None
