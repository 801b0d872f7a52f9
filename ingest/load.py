"""The only writer: one trace file → one transaction over the canonical tables."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import duckdb

from ingest.kineto import bind_events, drop_events, DTYPE_BYTES, FLOW_CATS, GPU_CATS, read_events, rank_from_meta_or_name, sniff_kineto
from ingest.depths import sorted_depths
from ingest.host_colls import insert_host_collectives
from ingest.registry import loader_for
from store.errors import IngestConflict, NinefoldError, TraceFormatError
from store.schema import PER_TRACE

TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass
class LoadResult:
    path: str
    job: str
    rank: int | None
    status: str            # stored | unchanged | failed
    message: str = ""
    counts: dict | None = None


# Seconds per stage of Kineto ingest, summed over files (and over the threads that parse files ahead, so with
# several files the sum can pass the wall time), when a caller sets STAGES = {} (bench/bench_ingest.py):
# read (hash the file, locate the event array, copy it out), parse (DuckDB's JSON reader into the event table),
# build (the SQL that builds the stored tables) and write (the commit).
STAGES: dict | None = None


def stage(name: str, seconds: float) -> None:
    if STAGES is not None:
        STAGES[name] = STAGES.get(name, 0.0) + seconds


class _Hasher:
    """sha256 of a file on a thread of its own; digest() waits for it (None when the file does not exist)."""

    def __init__(self, path: Path):
        self._digest = None
        self._error = None
        self._thread = threading.Thread(target=self._run, args=(path,), daemon=True)
        self._thread.start()

    def _run(self, path):
        try:
            self._digest = sha256_of(path) if path.exists() else None
        except BaseException as e:  # re-raised by digest(), on the caller's thread
            self._error = e

    def digest(self) -> str | None:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._digest


def _stored_rank(con, job: str, digest: str):
    row = con.execute("SELECT rank FROM traces WHERE job = ? AND sha256 = ?", [job, digest]).fetchone()
    return None if row is None else row[0]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    buf = bytearray(1 << 20)        # reused: no fresh large buffer mapped in per read
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while k := f.readinto(buf):
            h.update(view[:k])
    return h.hexdigest()


SIDE_FILE_BYTES = 1 << 20


def side_json_reason(f: Path) -> str | None:
    """Why a JSON file met in a directory scan is a side file (a manifest, a ground truth), not a trace:
    a JSON object with no traceEvents, whatever its size (a big one: the key's bytes appear nowhere in it). None for anything else, broken files included: those
    are ingested and fail with their own clear error."""
    if not f.name.endswith((".json", ".json.gz")) or loader_for(f) is not None:
        return None      # another format's loader (a Flight Recorder JSON dump, say) takes it
    why = 'not a Kineto trace: a JSON object with no "traceEvents" array'
    try:
        with (gzip.open(f, "rb") if f.name.endswith(".gz") else open(f, "rb")) as fh:
            head = fh.read(SIDE_FILE_BYTES + 1)
            if b'"traceEvents"' in head:
                return None
            if len(head) > SIDE_FILE_BYTES:
                # a big object: a side file when the key is nowhere in it (read in chunks, never held whole)
                if not head.lstrip().startswith(b"{"):
                    return None
                tail = head[-16:]
                while chunk := fh.read(1 << 22):
                    if b'"traceEvents"' in tail + chunk:
                        return None
                    tail = chunk[-16:]
                return why
    except (OSError, EOFError, zlib.error):
        return None
    try:
        doc = json.loads(head)
    except ValueError:
        return None
    return why if isinstance(doc, dict) else None


def discover(paths: list[str | Path], skipped: list | None = None) -> list[tuple[Path, str]]:
    """(file, default job name) for every trace file named or inside a named directory.

    Side JSON files of a scanned directory are left out; with SKIPPED, (file, job, reason) are added to it."""
    out: list[tuple[Path, str]] = []
    for p in map(Path, paths):
        if p.is_dir():
            from ingest.registry import all_suffixes
            suffixes = all_suffixes()
            files = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(suffixes))
            side = {f: side_json_reason(f) for f in files}
            if skipped is not None:
                skipped.extend((f, p.resolve().name, why) for f, why in side.items() if why)
            files = [f for f in files if not side[f]]
            if not files:
                raise TraceFormatError(p, None, "directory holds no trace files ("
                                       + ", ".join("*" + x for x in suffixes) + ")")
            out.extend((f, p.resolve().name) for f in files)
        elif p.exists():
            out.append((p, p.resolve().parent.name))
        else:
            raise TraceFormatError(p, None, "no such file or directory")
    return out


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


MEMORY_PER_EVENT_BYTE = 0.9     # DuckDB's memory limit while one large file loads, per byte of its event array
SCRATCH = "nf_scratch"          # an in-memory database where files are parsed ahead, in parallel
PREFETCH_MAX_BYTES = 64 << 20   # larger files already parse on several cores by themselves
RUN_CHECKPOINT_THRESHOLD = "256MiB"  # the WAL a run of several files may grow to between checkpoints (1 GiB: no
# faster on 16 rank files of 42 MB, 120 MB more peak RSS)


@dataclass
class Prepared:
    digest: str | None
    km: object = None
    table: str | None = None
    error: BaseException | None = None


def prepare_kineto(con, path: Path, salvage: bool, slot: int) -> Prepared:
    """Hash, locate and parse one file into the scratch database, on a cursor of its own (any thread)."""
    path = Path(path)
    cur = con.cursor()
    try:
        t = time.perf_counter()
        digest = sha256_of(path) if path.exists() else None
        try:
            km = sniff_kineto(path, salvage=salvage)
        except BaseException as e:
            return Prepared(digest, error=e)
        stage("read", time.perf_counter() - t)
        table = f"{SCRATCH}.ev_{slot}"
        try:
            t = time.perf_counter()
            cur.execute("SET enable_progress_bar = false")
            cur.execute(f"DROP TABLE IF EXISTS {table}")
            read_events(cur, km, path, table)
            stage("parse", time.perf_counter() - t)
        except BaseException as e:
            km.cleanup()
            return Prepared(digest, error=e)
        return Prepared(digest, km, table)
    finally:
        cur.close()


def load_kineto(con, path: Path, job: str, rank: int | None = None, replace: bool = False,
                salvage: bool = False, prepared: Prepared | None = None) -> LoadResult:
    path = Path(path)
    km = None
    if prepared is not None:
        digest = prepared.digest
    else:
        # the file is hashed on another thread (hashlib releases the GIL) while its event array is located and
        # copied out; a file already stored is still answered "unchanged" before any error of its own
        t = time.perf_counter()
        hashing = _Hasher(path)
        try:
            km = sniff_kineto(path, salvage=salvage)
        except BaseException as e:
            try:
                digest = hashing.digest()
            except BaseException:
                digest = None
            same = _stored_rank(con, job, digest) if digest is not None else None
            if same is not None:
                return LoadResult(str(path), job, same, "unchanged", "already stored (same sha256)")
            raise e
        try:
            digest = hashing.digest()
        except BaseException:
            km.cleanup()
            raise
        stage("read", time.perf_counter() - t)
    if digest is not None:
        same = _stored_rank(con, job, digest)
        if same is not None:
            if prepared is not None:
                _discard(con, prepared)
            if km is not None:
                km.cleanup()
            return LoadResult(str(path), job, same, "unchanged", "already stored (same sha256)")
    if prepared is not None and prepared.error is not None:
        raise prepared.error
    km = prepared.km if prepared is not None else km
    table = prepared.table if prepared is not None else "_evr"
    try:
        meta = km.meta
        if rank is None:
            rank = rank_from_meta_or_name(meta, path)
        if rank is None:
            raise TraceFormatError(path, None, "no rank: distributedInfo has none and the file name has no "
                                   "rank-N/rankN/workerN; pass --rank")
        check_rank(path, rank, meta)
        existing = con.execute("SELECT path FROM traces WHERE job = ? AND rank = ?", [job, rank]).fetchone()
        if existing is not None and not replace:
            raise IngestConflict(path, f"job {job!r} already has rank {rank} from {existing[0]}; "
                                 "pass --replace to overwrite it")
        # Bound DuckDB's memory by the event data's size (spilling to disk past it), so peak RSS stays
        # near the file size however large the trace is. 0.9x leaves room for the host-depth columns held
        # outside DuckDB (ingest.depths); on the 545 MB bench file 0.9x and 1.1x take the same time (peak RSS
        # 719 vs 821 MB).
        if prepared is None:
            ev_bytes = sum(Path(c[0]).stat().st_size for c in km.chunks)
            con.execute(f"SET memory_limit = '{max(384 << 20, int(ev_bytes * MEMORY_PER_EVENT_BYTE)) >> 20}MB'")
            t = time.perf_counter()
            read_events(con, km, path)
            stage("parse", time.perf_counter() - t)
        else:
            bind_events(con, table)
        con.execute("BEGIN TRANSACTION")
        try:
            t = time.perf_counter()
            counts = _insert(con, path, job, rank, meta, km, digest)
            t1 = time.perf_counter()
            con.execute("COMMIT")
            stage("build", t1 - t)
            stage("write", time.perf_counter() - t1)
        except BaseException:
            con.execute("ROLLBACK")
            raise
        msg = "salvaged (file was truncated)" if km.salvaged else ""
        return LoadResult(str(path), job, rank, "stored", msg, counts)
    finally:
        con.execute("DROP VIEW IF EXISTS _xv")
        drop_events(con, table)
        con.execute("DROP TABLE IF EXISTS _x")
        if prepared is None:
            con.execute("RESET memory_limit")
        km.cleanup()


INT32_MAX = 2**31 - 1


def check_rank(path, rank, meta: dict) -> None:
    """One-line errors for a rank or world size that no job can have (negative, beyond INT32, rank ≥ world)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= INT32_MAX:
        raise TraceFormatError(path, None, f"rank {rank!r} is out of range (0..{INT32_MAX})")
    di = meta.get("distributedInfo")
    world = di.get("world_size") if isinstance(di, dict) else None
    if world is None:
        return
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= INT32_MAX:
        raise TraceFormatError(path, None, f"distributedInfo.world_size {world!r} is out of range (1..{INT32_MAX})")
    if rank >= world:
        raise TraceFormatError(path, None, f"rank {rank} is not below distributedInfo.world_size {world}")


def _discard(con, prepared: Prepared) -> None:
    if prepared.table:
        con.execute(f"DROP TABLE IF EXISTS {prepared.table}")
    if prepared.km is not None:
        prepared.km.cleanup()


def _insert(con, path, job, rank, meta, km, digest) -> dict:
    for t in PER_TRACE:
        con.execute(f"DELETE FROM {t} WHERE job = ? AND rank = ?", [job, rank])
    con.execute("DELETE FROM traces WHERE job = ? AND rank = ?", [job, rank])
    diags: list[tuple[str, str, int, str]] = []

    base = meta.get("baseTimeNanoseconds")
    max_ts = con.execute("SELECT max(ts) FROM _ev WHERE ph = 'X'").fetchone()[0]
    if isinstance(base, int):
        time_mode = "relative_base"
    elif max_ts is not None and max_ts > 10**14:
        # before 2024-03 Kineto wrote absolute Unix-epoch integer microseconds
        base, time_mode = 0, "absolute_us"
    else:
        base, time_mode = 0, "relative_unknown"
        diags.append(("kineto", "no_base_time", 1, "relative ts with no baseTimeNanoseconds: ranks cannot be "
                      "aligned by wall clock; alignment falls back to collectives"))

    # _xv: every complete event with its category, ns times and raw args (a view: read where it is used);
    # _x: the ones whose args columns come from many keys (GPU activity, record_param_comms), args parsed once
    gpu_list = ", ".join(f"'{c}'" for c in GPU_CATS)
    con.execute("DROP TABLE IF EXISTS _x")
    con.execute(f"""CREATE OR REPLACE TEMP VIEW _xv AS
        SELECT ord, xcat AS cat, name, pid, tid, start_ns, end_ns, dur, args
        FROM _ev WHERE ph = 'X' AND ts IS NOT NULL""")
    con.execute(f"""CREATE TEMP TABLE _x AS SELECT *, json_transform(args, '{ARG_SPEC}') AS a FROM _xv
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

    # host side: every other complete event, with its depth on its thread (ingest.depths: intervals open at its
    # start). Threads are numbered per distinct (pid, tid) pair, NULLs alike, so the sort runs over integers.
    host = f"cat NOT IN ({gpu_list}, 'cuda_sync')"
    hs = con.sql(f"""
        WITH h AS (SELECT ord, pid, tid, start_ns, end_ns FROM _xv WHERE {host}),
        th AS (SELECT pid, tid, row_number() OVER ()::INTEGER AS th FROM (SELECT DISTINCT pid, tid FROM h))
        SELECT h.ord, th.th, h.start_ns, h.end_ns FROM h
        JOIN th ON h.pid IS NOT DISTINCT FROM th.pid AND h.tid IS NOT DISTINCT FROM th.tid
        ORDER BY th.th, h.start_ns, h.end_ns DESC, h.ord""").to_arrow_table()
    import pyarrow as pa
    depth = sorted_depths(*(hs.column(k).to_numpy() for k in ("th", "start_ns", "end_ns")))
    con.register("_hdepth", pa.table({"ord": hs.column("ord"), "depth": pa.array(depth.astype("int32"), pa.int32())}))
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
    return counts


def _host_name(meta: dict) -> str | None:
    h = meta.get("host_name", meta.get("hostname"))
    return str(h)[:255] if isinstance(h, (str, int)) and str(h) else None


def _resource_error(con, path, e) -> str:
    first = " ".join(str(e).split("\n")[0].split())[:200]
    if isinstance(e, duckdb.OutOfMemoryException):
        try:
            limit = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
        except duckdb.Error:
            limit = "?"
        return f"{path}: out of memory while ingesting ({first}); DuckDB's memory_limit is {limit}"
    return f"{path}: I/O error while ingesting ({first})"


def default_jobs() -> int:
    """Files parsed side by side by default: the core count, at most 4 (each parse already uses every core
    DuckDB has; more in flight only holds more parsed files in memory)."""
    return max(1, min(4, os.cpu_count() or 1))


def ingest_paths(con, paths, job=None, rank=None, replace=False, salvage=False, on_result=None,
                 jobs: int | None = None) -> list[LoadResult]:
    """Ingest every file; a failing file is reported and does not stop the others.

    jobs: small Kineto files parsed ahead side by side while the previous one is written (default
    default_jobs(); 1 parses each file in turn). Each file is still its own transaction, in order."""
    jobs = default_jobs() if jobs is None else int(jobs)
    if jobs < 1:
        raise NinefoldError(f"--jobs must be at least 1, not {jobs}")
    results = []
    side: list = []
    files = discover(paths, skipped=side)
    for f, j, why in side:
        results.append(LoadResult(str(f), job or j, rank, "skipped", f"{f}: {why}"))
        if on_result:
            on_result(results[-1])
    loaders = [loader_for(f) for f, _ in files]
    # Small Kineto files are hashed and parsed JOBS at a time on cursors of their own (all cores) while
    # this thread writes the previous one; each file is still its own transaction, in order.
    small = [ld is None and f.exists() and f.stat().st_size <= PREFETCH_MAX_BYTES for (f, _), ld in zip(files, loaders)]
    futures: dict = {}
    pool = None
    # Several files: DuckDB checkpoints after every commit whose WAL passes checkpoint_threshold (16 MiB), which
    # for a rank file each time rewrites what the last one wrote; let the WAL grow to RUN_CHECKPOINT_THRESHOLD
    # over the run (every commit is still durable in it) and checkpoint at the end.
    threshold = None
    if len(files) > 1:
        threshold = con.execute("SELECT current_setting('checkpoint_threshold')").fetchone()[0]
        con.execute(f"SET checkpoint_threshold = '{RUN_CHECKPOINT_THRESHOLD}'")
    if sum(small) > 1 and jobs > 1:
        from concurrent.futures import ThreadPoolExecutor

        con.execute(f"ATTACH IF NOT EXISTS ':memory:' AS {SCRATCH}")
        pool = ThreadPoolExecutor(max_workers=jobs)

    def ahead(i):
        for k in range(i, min(i + jobs + 1, len(files))):
            if small[k] and k not in futures:
                futures[k] = pool.submit(prepare_kineto, con, files[k][0], salvage, k)

    try:
        for i, ((f, default_job), ld) in enumerate(zip(files, loaders)):
            j = job or default_job
            if pool is not None:
                ahead(i)
            try:
                if ld is not None:
                    r = ld.load(con, f, j, rank=rank, replace=replace, salvage=salvage)
                else:
                    prep = futures.pop(i).result() if i in futures else None
                    r = load_kineto(con, f, j, rank=rank, replace=replace, salvage=salvage, prepared=prep)
            except NinefoldError as e:
                r = LoadResult(str(f), j, rank, "failed", str(e))
            except (duckdb.OutOfMemoryException, duckdb.IOException) as e:
                # the machine, not the file: this file fails in one line (its transaction rolled back), the
                # others still load
                r = LoadResult(str(f), j, rank, "failed", _resource_error(con, f, e))
            for one in (r if isinstance(r, list) else [r]):
                results.append(one)
                if on_result:
                    on_result(one)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
            for fut in futures.values():
                _discard(con, fut.result())
            con.execute(f"DETACH DATABASE IF EXISTS {SCRATCH}")
        if threshold is not None:
            con.execute(f"SET checkpoint_threshold = '{threshold}'")
            t = time.perf_counter()
            try:
                con.execute("CHECKPOINT")
            except duckdb.Error:
                pass    # another transaction is open: the WAL holds every commit, a later checkpoint folds it in
            stage("write", time.perf_counter() - t)
    return results
