"""Nsight Systems SQLite export (``nsys export --type sqlite``) → canonical tables.

Read path. Tables are read column-wise into Arrow through the ADBC SQLite driver (``adbc-driver-sqlite``,
a pyproject dependency), side by side in threads (a large table in rowid ranges, each query on a
connection of its own), and joined, decoded and written by DuckDB SQL; no Python code touches a row.
SQLite itself reads every page, so a damaged file is reported as SQLite reports it. DuckDB's own ``sqlite``
extension is not used: it is downloaded at run time, and a fresh machine without access to the extension
repository cannot load it. The ADBC driver infers a
column's Arrow type from its first batch, so every integer column is read as ``CAST(x AS INTEGER)`` and
every text column as ``ifnull(CAST(x AS TEXT), '')`` (then ``nullif`` in DuckDB): an all-NULL first batch
can then never fix the wrong type. Small tables (ranks, enums) are built in DuckDB from Python lists, never
as Arrow from Python objects: pyarrow imports pandas for that, half a second per process.

Schema. Tables are created lazily by nsys and columns move between export versions (2.9.1 has no
ENUM_* tables and calls the metadata table EXPORT_META_DATA; 3.x has META_DATA_EXPORT, greenContextId,
binaryData, ...). Every table and column is looked up in ``sqlite_master``/``PRAGMA table_info``
before it is read; a missing one reads as NULL.

What goes where (one rank per process, see below):

* CUPTI_ACTIVITY_KIND_KERNEL → gpu_ops kind 'kernel'. Name = demangledName, else shortName, else
  mangledName (each through StringIds; whichever columns the version has). args: short name, grid,
  block, registers, shared memory, context, graph node.
* CUPTI_ACTIVITY_KIND_MEMCPY / MEMSET → 'memcpy' / 'memset'. copy_kind is decoded from the file's
  ENUM_CUDA_MEMCPY_OPER (``CUDA_MEMCPY_KIND_HTOD`` → ``HtoD``, as Kineto writes it), memory kinds from
  ENUM_CUDA_MEM_KIND (nsys numbering, not CUPTI's). Only when the file has no ENUM table (schema 2.9.1)
  is the CUPTI numbering used, with an ``enum_table_missing:*`` diagnostic.
* CUPTI_ACTIVITY_KIND_SYNCHRONIZATION → 'sync', named by ENUM_CUPTI_SYNC_TYPE's label.
* CUPTI_ACTIVITY_KIND_RUNTIME / DRIVER → host_ops cat 'cuda_runtime' / 'cuda_driver' with the
  correlation id; the ``_v7000``-style version suffix is dropped from the name (kept in args).
* NVTX_EVENTS push/pop and start/end ranges → host_ops cat 'user_annotation', name
  ``COALESCE(text, StringIds[textId])``, domain in args. Marks are step markers only (below).
* Kernels named ``nccl(Dev)Kernel_*`` → collectives (source 'kernel'); the collective comes from the
  kernel name, else from the NCCL-domain NVTX range enclosing its launch. nsys has no process-group
  name or sequence number, so pg_name/seq stay NULL (attribution then reports them unmatched).

Ranks. A process (the full ``globalPid``: the bits above the PID tell hosts apart in merged reports)
becomes a rank when it owns GPU work. Its rank, in order of preference: the ``rank`` argument (added to
the process index when the file holds several); an NVTX thread name / ThreadNames entry / NVTX text
of the form ``MPI Rank N`` / ``rank N``; the launch environment in META_DATA_CAPTURE (RANK,
OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID, ...; used only when one process owns GPU work);
otherwise processes are enumerated in PID order. The choice is recorded as a ``rank_from_*``
diagnostic naming the process. PID/TID are decoded as ``(g >> 24) & 0xFFFFFF`` / ``g & 0xFFFFFF``.

Time. nsys times are ns since the session start; absolute ns = ``TARGET_INFO_SESSION_START_TIME.
utcEpochNs + t`` (traces.time_mode 'session_start', base_ns = utcEpochNs). Without that table the times
stay relative (time_mode 'relative_unknown', diagnostic 'no_session_start').

Steps, first rule that yields any, per rank:
  1. NVTX ranges named ``ProfilerStep#N`` (PyTorch);
  2. NVTX ranges whose name matches the step pattern (``step_pattern`` argument, else
     ``STEP_PATTERN``: "step 12", "train_step_3", "iteration#7", ...); the first capture group is
     the step number (no group: numbered in time order);
  3. NVTX marks matching rule 1 or 2: step N runs from its mark to the next mark (the last one to the
     end of the rank's activity);
  4. the repeated outermost NVTX range: on one thread, the depth-0 range name that occurs at least
     twice with every occurrence enclosing a CUDA call that launched GPU work; the most frequent such
     name wins and its occurrences are steps 0, 1, ... (diagnostic 'steps_from_repeated_range');
  5. none: the trace is one window (diagnostic 'no_steps').
"""
from __future__ import annotations

import os
import re
import sqlite3
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pyarrow as pa

from ingest.registry import Loader
from store.errors import IngestConflict, NinefoldError, TraceFormatError
from store.schema import PER_TRACE

SQLITE_MAGIC = b"SQLite format 3\x00"
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
BATCH_ROWS = 1 << 16          # rows per Arrow batch the SQLite driver hands over
READ_THREADS = max(1, min(4, os.cpu_count() or 1))
PARALLEL_MIN_ROWS = 1 << 18   # rows per connection below which a table is read in one go
PID_SPAN = 1 << 24            # globalPid/globalTid: ... | PID << 24 | TID

STEP_PATTERN = r"(?i)^(?:train(?:ing)?[ _.:-]*)?(?:step|iter|iteration)[ _#:=-]*(\d+)$"
PROFILER_STEP = r"^ProfilerStep#(\d+)(?:\D|$)"
RANK_TEXT = r"(?i)^(?:mpi |global |torch )?rank[ _:=#-]*(\d+)$"
ENV_RANK_KEYS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK",
                 "SLURM_PROCID", "PALS_RANKID")
ENV_WORLD_KEYS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS")

# Used only when a file lacks the ENUM table (schema 2.9.1): the CUPTI numbering those exports use.
FALLBACK_ENUMS = {
    "ENUM_CUDA_MEMCPY_OPER": {0: ("CUDA_MEMCPY_KIND_UNKNOWN", "Unknown"), 1: ("CUDA_MEMCPY_KIND_HTOD", "Host-to-Device"),
                              2: ("CUDA_MEMCPY_KIND_DTOH", "Device-to-Host"), 3: ("CUDA_MEMCPY_KIND_HTOA", "Host-to-Array"),
                              4: ("CUDA_MEMCPY_KIND_ATOH", "Array-to-Host"), 5: ("CUDA_MEMCPY_KIND_ATOA", "Array-to-Array"),
                              6: ("CUDA_MEMCPY_KIND_ATOD", "Array-to-Device"), 7: ("CUDA_MEMCPY_KIND_DTOA", "Device-to-Array"),
                              8: ("CUDA_MEMCPY_KIND_DTOD", "Device-to-Device"), 9: ("CUDA_MEMCPY_KIND_HTOH", "Host-to-Host"),
                              10: ("CUDA_MEMCPY_KIND_PTOP", "Peer-to-Peer")},
    "ENUM_CUDA_MEM_KIND": {0: ("PAGEABLE", "Pageable"), 1: ("PINNED", "Pinned"), 2: ("DEVICE", "Device"),
                           3: ("ARRAY", "Array"), 4: ("MANAGED", "Managed"), 5: ("DEVICE_STATIC", "Device Static"),
                           6: ("MANAGED_STATIC", "Managed Static"), 7: ("UNKNOWN", "Unknown")},
    "ENUM_CUPTI_SYNC_TYPE": {0: ("UNKNOWN", "Unknown"), 1: ("EVENT_SYNCHRONIZE", "Event sync"),
                             2: ("STREAM_WAIT_EVENT", "Stream wait sync"), 3: ("STREAM_SYNCHRONIZE", "Stream sync"),
                             4: ("CONTEXT_SYNCHRONIZE", "Context sync")},
    "ENUM_NSYS_EVENT_CLASS": {0: ("TRACE_PROCESS_EVENT_CUDA_RUNTIME", "CUDA runtime"),
                              1: ("TRACE_PROCESS_EVENT_CUDA_DRIVER", "CUDA driver"),
                              67: ("TRACE_PROCESS_EVENT_CUDABACKTRACE", "CUDA backtrace"),
                              68: ("TRACE_PROCESS_EVENT_CUDABACKTRACE_START", "CUDA backtrace start")},
    "ENUM_NSYS_EVENT_TYPE": {34: ("NvtxMark", "NvtxMark"), 39: ("NvtxThread", "NvtxThread"),
                             59: ("NvtxPushPopRange", "NvtxPushPopRange"),
                             60: ("NvtxStartEndRange", "NvtxStartEndRange"),
                             75: ("NvtxDomainCreate", "NvtxDomainCreate")},
}
NVTX_RANGE_TYPES = ("NvtxPushPopRange", "NvtxStartEndRange", "NvtxtPushPopRange", "NvtxtStartEndRange")
NVTX_MARK_TYPES = ("NvtxMark", "NvtxtMark")

# the launch configuration kept in a kernel's args (grid, block, registers, shared memory)
KERNEL_ARG_COLS = ["gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread",
                   "staticSharedMemory", "dynamicSharedMemory"]
GPU_TABLES = {"kernel": "CUPTI_ACTIVITY_KIND_KERNEL", "memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY",
              "memset": "CUPTI_ACTIVITY_KIND_MEMSET", "sync": "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"}
API_TABLES = {"cuda_runtime": "CUPTI_ACTIVITY_KIND_RUNTIME", "cuda_driver": "CUPTI_ACTIVITY_KIND_DRIVER"}
# Arrow tables registered in DuckDB while one file loads
VIEWS = ("_nk", "_nm", "_ns", "_nsy", "_napi_cuda_runtime", "_napi_cuda_driver", "_nv", "_nstr")
TEMPS = ("_nrank", "_nenum", "_nnvtx", "_nnvtx0", "_nopen", "_nck", "_nmk", "_napiname", "_nclass", "_nkname",
         "_nstep")


# ---------------------------------------------------------------------------------------------- checks

def claims(path: Path, head: bytes) -> bool:
    name = Path(path).name.lower()
    return name.endswith((".sqlite", ".sqlite3") + REPORT_SUFFIXES) or head.startswith(SQLITE_MAGIC)


def export_command(path: Path) -> str:
    path = Path(path)
    return f"nsys export --type sqlite --output {path.with_suffix('.sqlite')} {path}"


def _check_file(path: Path) -> None:
    """Reject what is not a complete SQLite file before SQLite itself sees it."""
    if path.name.lower().endswith(REPORT_SUFFIXES):
        raise TraceFormatError(path, None, "an Nsight Systems report is binary; export it first with: "
                               + export_command(path))
    if not path.is_file():
        raise TraceFormatError(path, None, "no such file")
    size = path.stat().st_size
    if size == 0:
        raise TraceFormatError(path, None, "empty file")
    with open(path, "rb") as f:
        head = f.read(100)
    if not head.startswith(SQLITE_MAGIC):
        raise TraceFormatError(path, None, "not a SQLite database (no 'SQLite format 3' header); "
                               "expected an `nsys export --type sqlite` file")
    if len(head) < 100:
        raise TraceFormatError(path, None, f"truncated: {size} bytes, shorter than the 100-byte SQLite header")
    page = struct.unpack(">H", head[16:18])[0]
    page = 65536 if page == 1 else page
    change, pages, valid_for = (struct.unpack(">I", head[o:o + 4])[0] for o in (24, 28, 92))
    if page < 512 or page & (page - 1):
        raise TraceFormatError(path, "header", f"corrupt SQLite header (page size {page})")
    if pages and change == valid_for and size < page * pages:
        raise TraceFormatError(path, None, f"truncated: the SQLite header says {page * pages} bytes "
                               f"({pages} pages), the file has {size}")
    if size % page:
        raise TraceFormatError(path, None, f"truncated: {size} bytes is not a whole number of {page}-byte pages")


def _uri(path: Path) -> str:
    # immutable: the corpus is read-only, and nothing may write a journal beside it
    return "file:" + quote(str(path.resolve())) + "?mode=ro&immutable=1"


class _Src:
    """The export's schema (tables, columns) and Arrow reads from it through the ADBC SQLite driver."""

    def __init__(self, path: Path):
        # the driver's low-level API: its DB-API module would import pandas for nothing
        import adbc_driver_manager
        import adbc_driver_sqlite

        self.path = path
        self.adbc_db = None
        try:
            # tables are read in threads; Python's sqlite3 is built serialized, so one connection serves all
            self.db = sqlite3.connect(_uri(path), uri=True, check_same_thread=False)
            rows = self.db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
            self.cols = {}
            for (t,) in rows:
                info = self.db.execute(f'PRAGMA table_xinfo("{t}")').fetchall()
                self.cols[t] = [r[1] for r in info if not r[6]]
            self.adbc_db = adbc_driver_sqlite.connect(_uri(path))
        except (sqlite3.Error, OSError, ValueError, adbc_driver_manager.Error) as e:
            raise TraceFormatError(path, None, f"unreadable SQLite file: {_one_line(e)}") from None

    def close(self):
        for c in ("adbc_db", "db"):
            try:
                getattr(self, c).close()
            except Exception:
                pass

    def has(self, table: str, col: str | None = None) -> bool:
        return table in self.cols and (col is None or col in self.cols[table])

    def arrow(self, sql: str, where: str) -> pa.Table:
        """SQL's result through the ADBC driver, on a connection of its own (reads run in threads)."""
        import adbc_driver_manager

        conn = stmt = None
        try:
            conn = adbc_driver_manager.AdbcConnection(self.adbc_db)
            stmt = adbc_driver_manager.AdbcStatement(conn)
            stmt.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
            stmt.set_sql_query(sql)
            stream, _ = stmt.execute_query()
            return pa.RecordBatchReader._import_from_c(stream.address).read_all()
        except (adbc_driver_manager.Error, pa.ArrowException, OSError) as e:
            raise TraceFormatError(self.path, where, f"unreadable: {_one_line(e)}") from None
        finally:
            for h in (stmt, conn):
                if h is not None:
                    h.close()

    def read(self, table: str, ints=(), texts=()) -> pa.Table:
        """Columns of TABLE as a typed Arrow table: ints int64, texts string ('' for NULL). A column (or the
        table) the file lacks comes back all NULL without being asked of SQLite. A large table is read in
        rowid ranges on several connections at once."""
        schema = pa.schema([(c, pa.int64()) for c in ints] + [(c, pa.string()) for c in texts])
        have = [c for c in list(ints) + list(texts) if self.has(table, c)]
        if table not in self.cols or not have:
            n = self.count(table) if table in self.cols else 0
            return pa.table([pa.nulls(n, f.type) for f in schema], schema=schema)
        got = self._queried(table, have, set(ints))
        n = len(next(iter(got.values())))
        return pa.table([got[f.name].cast(f.type) if f.name in got else pa.nulls(n, f.type) for f in schema],
                        schema=schema)

    def _queried(self, table: str, have: list, ints: set) -> dict:
        """HAVE read by SQLite, as CAST(c AS INTEGER) / ifnull(CAST(c AS TEXT), '')."""
        sel = ", ".join(f'CAST("{c}" AS INTEGER) AS "{c}"' if c in ints else f"ifnull(CAST(\"{c}\" AS TEXT), '') AS \"{c}\""
                        for c in have)
        lo, hi = self.rowids(table)
        parts = max(1, min(READ_THREADS, (hi - lo + 1) // PARALLEL_MIN_ROWS)) if hi is not None else 1
        if parts == 1:
            chunks = [self.arrow(f'SELECT {sel} FROM "{table}"', table)]
        else:
            step = (hi - lo) // parts + 1
            qs = [f'SELECT {sel} FROM "{table}" WHERE rowid >= {lo + i * step} AND rowid < {lo + (i + 1) * step}'
                  for i in range(parts)]
            with ThreadPoolExecutor(parts) as ex:
                chunks = list(ex.map(lambda q: self.arrow(q, table), qs))
        return {c: pa.chunked_array([a for t in chunks for a in t.column(c).chunks], chunks[0].schema.field(c).type)
                for c in have}

    def count(self, table: str) -> int:
        return self.rows(f'SELECT count(*) FROM "{table}"', table)[0][0]

    def rowids(self, table: str):
        try:   # two queries: each is a b-tree edge lookup, one query with both would scan
            return (self.db.execute(f'SELECT min(rowid) FROM "{table}"').fetchall()[0][0],
                    self.db.execute(f'SELECT max(rowid) FROM "{table}"').fetchall()[0][0])
        except sqlite3.Error:   # a WITHOUT ROWID table: one sequential read
            return None, None

    def rows(self, sql: str, where: str, args=()) -> list:
        try:
            return self.db.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise TraceFormatError(self.path, where, f"unreadable: {_one_line(e)}") from None


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]


# ---------------------------------------------------------------------------------------------- reading

def _meta(src: _Src) -> dict:
    out = {}
    for t in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if src.has(t, "name") and src.has(t, "value"):
            out.update({n: v for n, v in src.rows(f'SELECT name, value FROM "{t}"', t)})
    return out


def _enum(src: _Src, table: str, diags: list) -> list[tuple]:
    """(enum, id, name, label) rows of one ENUM table, from the file; the fallback only when the file has none."""
    if src.has(table, "id") and src.has(table, "name"):
        lab = "label" if src.has(table, "label") else "name"
        return src.rows(f"SELECT '{table}', CAST(id AS INTEGER), ifnull(CAST(name AS TEXT), ''), "
                        f'ifnull(CAST("{lab}" AS TEXT), \'\') FROM "{table}"', table)
    diags.append(("nsys", f"enum_table_missing:{table}", 1, "the file has no such table (schema 2.x): decoded "
                  "with the values those exports use"))
    return [(table, i, name, label) for i, (name, label) in FALLBACK_ENUMS[table].items()]


def _small_table(con, name: str, cols: str, rows: list) -> None:
    """TEMP TABLE NAME (COLS: "a BIGINT, b VARCHAR") holding ROWS. The values travel as one list per column:
    DuckDB's executemany costs about 1 ms a row, and Arrow built from Python objects imports pandas (0.5 s)."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name} ({cols})")
    if rows:
        types = [c.split()[1] for c in cols.split(", ")]
        con.execute(f"INSERT INTO {name} SELECT {', '.join(f'unnest(?::{t}[])' for t in types)}",
                    [list(c) for c in zip(*rows)])


def _read_all(con, src: _Src, diags: list, launch_config: bool = False) -> dict[str, pa.Table]:
    """Register every needed table as Arrow in DuckDB and return them by view name. The tables are read
    side by side in threads, the largest first (the page decoder and the SQLite driver release the GIL)."""
    gpu_cols = ["start", "end", "globalPid", "deviceId", "streamId", "correlationId"]
    api_cols = ["start", "end", "globalTid", "correlationId", "nameId", "returnValue", "eventClass"]
    kt = GPU_TABLES["kernel"]
    # names: demangledName/shortName as the version has them (mangledName only when both are missing);
    # very old exports have a `name` column instead, holding the text or an id into StringIds
    names = ["demangledName", "shortName"]
    if not any(src.has(kt, c) for c in names):
        names.append("mangledName")
    with ThreadPoolExecutor(READ_THREADS) as ex:
        def read(table, ints, texts=()):
            return ex.submit(src.read, table, ints, texts)

        # the launch configuration is 9 more columns per kernel: opt-in
        k = read(kt, gpu_cols + names + (KERNEL_ARG_COLS if launch_config else []), ["name"])
        apis = {cat: read(t, api_cols, [] if src.has(t, "nameId") else ["name"]) for cat, t in API_TABLES.items()}
        reads = {"_nm": read(GPU_TABLES["memcpy"], gpu_cols + ["bytes", "copyKind", "srcKind", "dstKind",
                                                                "contextId", "graphNodeId"]),
                 "_ns": read(GPU_TABLES["memset"], gpu_cols + ["bytes", "memKind", "value", "contextId",
                                                                "graphNodeId"]),
                 "_nsy": read(GPU_TABLES["sync"], gpu_cols + ["syncType", "eventId", "contextId"]),
                 "_nv": read("NVTX_EVENTS", ["start", "end", "eventType", "globalTid", "textId", "domainId",
                                             "category"], ["text"]),
                 "_nstr": read("StringIds", ["id"], ["value"])}
        _small_table(con, "_nenum", "enum VARCHAR, id BIGINT, name VARCHAR, label VARCHAR",
                     [r for t in ("ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND", "ENUM_CUPTI_SYNC_TYPE",
                                  "ENUM_NSYS_EVENT_TYPE", "ENUM_NSYS_EVENT_CLASS") for r in _enum(src, t, diags)])
        tables = {}
        k = k.result()
        for c in ["mangledName"] + KERNEL_ARG_COLS:
            if c not in k.column_names:
                k = k.append_column(c, pa.nulls(k.num_rows, pa.int64()))
        tables["_nk"] = k
        for cat, f in apis.items():       # a missing table reads as no rows
            a = f.result()
            if "name" not in a.column_names:
                a = a.append_column("name", pa.nulls(a.num_rows, pa.string()))
            tables[f"_napi_{cat}"] = a
        tables.update({v: f.result() for v, f in reads.items()})
    for v, t in tables.items():
        con.register(v, t)
    con.execute("CREATE OR REPLACE TEMP VIEW _napi AS "
                + " UNION ALL ".join(f"SELECT *, '{cat}' AS cat FROM _napi_{cat}" for cat in API_TABLES))
    return tables


# ---------------------------------------------------------------------------------------------- ranks

def _gpid(col: str) -> str:
    return f"(({col}) // {PID_SPAN}) * {PID_SPAN}"


def _pid(col: str) -> str:
    return f"(({col}) // {PID_SPAN}) % {PID_SPAN}"


def _processes(con) -> list[tuple[int, int]]:
    """(globalPid, pid) of every process that owns GPU work, in PID order."""
    parts = " UNION ".join(f"SELECT DISTINCT {_gpid('coalesce(globalPid, 0)')} AS g FROM {v}"
                           for v in ("_nk", "_nm", "_ns", "_nsy"))
    return [(g, p) for g, p in con.execute(f"SELECT g, {_pid('g')} AS p FROM ({parts}) ORDER BY p, g").fetchall()]


def _nvtx_ranks(con, src: _Src) -> dict[int, set]:
    """Rank numbers that NVTX thread names, ThreadNames or NVTX texts state, per globalPid."""
    found: dict[int, set] = {}
    rx = RANK_TEXT.replace("'", "''")
    q = f"""SELECT DISTINCT {_gpid('n.globalTid')} AS g,
                   TRY_CAST(regexp_extract(coalesce(nullif(n.text, ''), s.value), '{rx}', 1) AS BIGINT) AS r
            FROM _nv n LEFT JOIN _nstr s ON s.id = n.textId
            WHERE n.globalTid IS NOT NULL AND regexp_matches(coalesce(nullif(n.text, ''), s.value, ''), '{rx}')"""
    for g, r in con.execute(q).fetchall():
        found.setdefault(g, set()).add(r)
    if src.has("ThreadNames", "nameId") and src.has("ThreadNames", "globalTid"):
        tn = src.arrow("SELECT CAST(nameId AS INTEGER) AS nameId, CAST(globalTid AS INTEGER) AS globalTid "
                       "FROM ThreadNames", "ThreadNames")
        con.register("_ntn", tn)
        try:
            for g, r in con.execute(f"""SELECT DISTINCT {_gpid('t.globalTid')},
                        TRY_CAST(regexp_extract(s.value, '{rx}', 1) AS BIGINT)
                        FROM _ntn t JOIN _nstr s ON s.id = t.nameId
                        WHERE t.globalTid IS NOT NULL AND regexp_matches(s.value, '{rx}')""").fetchall():
                found.setdefault(g, set()).add(r)
        finally:
            con.unregister("_ntn")
    return found


def _env(src: _Src) -> dict[str, str]:
    """The launch environment nsys recorded (META_DATA_CAPTURE PROCESS_n:ENVIRONMENT_VARIABLE)."""
    if not (src.has("META_DATA_CAPTURE", "name") and src.has("META_DATA_CAPTURE", "value")):
        return {}
    env = {}
    for (v,) in src.rows("SELECT value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_%:ENVIRONMENT_VARIABLE'",
                         "META_DATA_CAPTURE"):
        k, sep, val = str(v).partition("=")
        if sep and (k in ENV_RANK_KEYS or k in ENV_WORLD_KEYS):
            env.setdefault(k, val.strip().strip('"'))
    return env


def _assign_ranks(con, src: _Src, procs, rank, env, pnames) -> tuple[dict[int, int], dict[int, tuple], int | None]:
    """globalPid → rank, and per globalPid the (code, detail) of how it was chosen; plus world size."""
    def desc(g, p):
        nm = pnames.get(g)
        return f"globalPid {g} (pid {p}{', ' + nm if nm else ''})"

    world = None
    for k in ENV_WORLD_KEYS:
        if env.get(k, "").isdigit():
            world = int(env[k])
            break
    if rank is not None:
        ranks = {g: rank + i for i, (g, p) in enumerate(procs)}
        how = {g: ("rank_given", f"{desc(g, p)} -> rank {ranks[g]} (--rank {rank}"
                   + (f" + process index, {len(procs)} processes)" if len(procs) > 1 else ")")) for g, p in procs}
        return ranks, how, world
    nv = _nvtx_ranks(con, src)
    stated = {g: next(iter(nv[g])) for g, p in procs if len(nv.get(g, ())) == 1}
    if len(stated) == len(procs) and len(set(stated.values())) == len(procs):
        return stated, {g: ("rank_from_nvtx", f"{desc(g, p)} -> rank {stated[g]} (NVTX rank name)")
                        for g, p in procs}, world
    if len(procs) == 1:
        for k in ENV_RANK_KEYS:
            if env.get(k, "").isdigit():
                g, p = procs[0]
                return {g: int(env[k])}, {g: ("rank_from_env", f"{desc(g, p)} -> rank {env[k]} ({k})")}, world
    ranks = {g: i for i, (g, p) in enumerate(procs)}
    return ranks, {g: ("rank_enumerated", f"{desc(g, p)} -> rank {ranks[g]} (no rank in NVTX or environment; "
                       f"{len(procs)} GPU process(es) numbered in PID order)") for g, p in procs}, world


# ---------------------------------------------------------------------------------------------- loading

def load(con, path, job: str, rank: int | None = None, replace: bool = False, salvage: bool = False,
         step_pattern: str | None = None, launch_config: bool = False):
    """Ingest one nsys SQLite export; one LoadResult per rank (process with GPU work).

    salvage: accepted for the loader contract; a damaged SQLite file is always rejected whole.
    step_pattern: a regex for step NVTX names (first group = step number), tried after ProfilerStep#N.
    launch_config: also keep each kernel's grid/block/registers/shared memory in its args (reads 9 more
    columns per kernel: about twice the read time)."""
    from ingest.load import LoadResult, sha256_of

    path = Path(path)
    _check_file(path)
    digest = sha256_of(path)
    same = con.execute("SELECT rank FROM traces WHERE job = ? AND sha256 = ? ORDER BY rank", [job, digest]).fetchall()
    if same:
        return [LoadResult(str(path), job, r, "unchanged", "already stored (same sha256)") for (r,) in same]
    if step_pattern is not None:
        try:
            n_groups = re.compile(step_pattern).groups
        except re.error as e:
            raise NinefoldError(f"bad step pattern {step_pattern!r}: {e}") from None
    src = _Src(path)
    try:
        if "StringIds" not in src.cols or not any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in src.cols):
            raise TraceFormatError(path, None, "not an Nsight Systems export: no StringIds and "
                                   "CUPTI_ACTIVITY_KIND_* tables (make one with `nsys export --type sqlite`)")
        diags: list = []
        meta = _meta(src)
        tables = _read_all(con, src, diags, launch_config)
        counts_in = {v: t.num_rows for v, t in tables.items()}
        procs = _processes(con)
        if not procs:
            raise TraceFormatError(path, None, "no GPU activity: the CUPTI kernel/memcpy/memset/sync tables are "
                                   "empty or missing (was the report captured with --trace=cuda?)")
        pnames = {}
        if src.has("PROCESSES", "globalPid") and src.has("PROCESSES", "name"):
            gl = ", ".join(str(g) for g, _ in procs)
            pnames = {g: n for g, n in src.rows(f"SELECT globalPid, name FROM PROCESSES WHERE globalPid IN ({gl})",
                                                "PROCESSES")}
        env = _env(src)
        ranks, how, world = _assign_ranks(con, src, procs, rank, env, pnames)
        for g, r in ranks.items():
            existing = con.execute("SELECT path FROM traces WHERE job = ? AND rank = ?", [job, r]).fetchall()
            if existing and not replace:
                raise IngestConflict(path, f"job {job!r} already has rank {r} from {existing[0][0]}; "
                                     "pass --replace to overwrite it")
        _small_table(con, "_nrank", "g BIGINT, rank INTEGER, pid BIGINT", [(g, ranks[g], p) for g, p in procs])
        base, time_mode = _session_start(src, path, diags)
        _stage(con, base)
        con.execute("BEGIN TRANSACTION")
        try:
            results = []
            for g, p in procs:
                r = ranks[g]
                for t in PER_TRACE:
                    con.execute(f"DELETE FROM {t} WHERE job = ? AND rank = ?", [job, r])
                con.execute("DELETE FROM traces WHERE job = ? AND rank = ?", [job, r])
            _insert_gpu(con, job, base)
            _insert_host(con, job, base, {cat: tables[f"_napi_{cat}"] for cat in API_TABLES})
            lit = "'" + job.replace("'", "''") + "'"
            con.execute(f"""CREATE OR REPLACE TEMP VIEW _ngpu AS SELECT rank, kind, name, device, start_ns, end_ns,
                            correlation FROM gpu_ops WHERE job = {lit} AND rank IN (SELECT rank FROM _nrank)""")
            con.execute(f"""CREATE OR REPLACE TEMP VIEW _nhost AS SELECT rank, tid, name, start_ns, end_ns, correlation
                            FROM host_ops WHERE job = {lit} AND rank IN (SELECT rank FROM _nrank)
                            AND cat IN ('cuda_runtime', 'cuda_driver')""")
            device_names = _device_names(con, src)
            step_src = _insert_steps(con, job, step_pattern, n_groups if step_pattern is not None else None)
            _insert_collectives(con, job)
            file_diags = list(diags) + _file_diags(con, counts_in, meta)
            first = min(ranks.values())
            no_corr = _no_corr(con)
            for g, p in procs:
                r = ranks[g]
                counts = _counts(con, job, r)
                rd = [("nsys", how[g][0], 1, how[g][1])]
                rd += [("nsys", c, n, ex) for c, n, ex in step_src.get(r, [("no_steps", 1, "no ProfilerStep#N, step "
                                                                            "pattern or repeated NVTX range: the trace "
                                                                            "is one window")])]
                rd += _rank_diags(con, job, r, counts, no_corr)
                if r == first:
                    rd += file_diags
                con.executemany("INSERT INTO diagnostics VALUES (?, ?, ?, ?, ?, ?)",
                                [[job, r, s, c, n, str(ex)[:500]] for s, c, n, ex in rd])
                n_events = counts["kernel"] + counts["memcpy"] + counts["memset"] + counts["sync"] + counts["host_ops"]
                con.execute("""INSERT INTO traces (job, rank, path, sha256, format, schema_version, world_size,
                               device_name, base_ns, time_mode, backend, nccl_version, pg_config, n_events, salvaged)
                               VALUES (?, ?, ?, ?, 'nsys', ?, ?, ?, ?, ?, ?, NULL, NULL, ?, false)""",
                            [job, r, str(path.resolve()), digest, meta.get("EXPORT_SCHEMA_VERSION"), world,
                             device_names.get(g), base, time_mode, "nccl" if counts["collectives"] else None,
                             n_events])
                msg = f"process {p}" + (f" ({pnames[g]})" if pnames.get(g) else "")
                results.append(LoadResult(str(path), job, r, "stored", msg, counts))
            con.execute("INSERT INTO jobs (job, world_size) VALUES (?, ?) ON CONFLICT (job) DO UPDATE SET "
                        "world_size = coalesce(excluded.world_size, jobs.world_size)", [job, world])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return results
    except TraceFormatError:
        raise
    except (sqlite3.Error, OSError) as e:
        raise TraceFormatError(path, None, f"unreadable: {_one_line(e)}") from None
    finally:
        for v in VIEWS:
            try:
                con.unregister(v)
            except Exception:
                pass
        for t in TEMPS:
            con.execute(f"DROP TABLE IF EXISTS {t}")
        for v in ("_ngpu", "_nhost", "_napi"):
            con.execute(f"DROP VIEW IF EXISTS {v}")
        src.close()


def _session_start(src: _Src, path: Path, diags: list) -> tuple[int, str]:
    t = "TARGET_INFO_SESSION_START_TIME"
    if src.has(t, "utcEpochNs"):
        row = src.rows(f"SELECT CAST(utcEpochNs AS INTEGER) FROM {t} WHERE utcEpochNs IS NOT NULL LIMIT 1", t)
        if row and row[0][0] is not None and row[0][0] > 0:
            return int(row[0][0]), "session_start"
    diags.append(("nsys", "no_session_start", 1, "no TARGET_INFO_SESSION_START_TIME.utcEpochNs: times stay ns since "
                  "the session start; ranks cannot be aligned by wall clock"))
    return 0, "relative_unknown"


def _lookup(enum: str, col: str, what: str = "label") -> str:
    return f"(SELECT e.{what} FROM _nenum e WHERE e.enum = '{enum}' AND e.id = {col})"


def _etype(names) -> str:
    lst = ", ".join(f"'{n}'" for n in names)
    return f"(SELECT id FROM _nenum WHERE enum = 'ENUM_NSYS_EVENT_TYPE' AND name IN ({lst}))"


def _stage(con, base: int) -> None:
    """Small decoded helper tables (before the transaction): enum decodings, API names, NVTX with depth."""
    b = int(base)
    # CUDA_MEMCPY_KIND_HTOD -> HtoD (Kineto's spelling), UVM_HTOD -> UVM_HtoD, UNKNOWN -> its label
    rx = "^(?:CUDA_MEMCPY_KIND_)?((?:UVM_)?)([A-Z])TO([A-Z])$"
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nck AS
        SELECT id, CASE WHEN regexp_matches(name, '{rx}') THEN regexp_replace(name, '{rx}', '\\1\\2to\\3')
                        ELSE coalesce(nullif(label, ''), regexp_replace(name, '^CUDA_MEMCPY_KIND_', '')) END AS kind,
               label
        FROM _nenum WHERE enum = 'ENUM_CUDA_MEMCPY_OPER'""")
    con.execute("""CREATE OR REPLACE TEMP TABLE _nmk AS
        SELECT id, coalesce(nullif(label, ''), name) AS label FROM _nenum WHERE enum = 'ENUM_CUDA_MEM_KIND'""")
    # API names, once per distinct string: the _v7000-style version suffix goes (Kineto's names have none)
    con.execute("""CREATE OR REPLACE TEMP TABLE _napiname AS
        SELECT s.id, regexp_replace(s.value, '_v\\d+$', '') AS name, s.value AS raw
        FROM _nstr s WHERE s.id IN (SELECT DISTINCT nameId FROM _napi)""")
    # event class: runtime / driver; 'CUDA backtrace' rows repeat a call already recorded
    con.execute("""CREATE OR REPLACE TEMP TABLE _nclass AS
        SELECT id, CASE WHEN name LIKE '%CUDABACKTRACE%' THEN 'skip' WHEN name LIKE '%CUDA_RUNTIME' THEN 'cuda_runtime'
                        WHEN name LIKE '%CUDA_DRIVER' THEN 'cuda_driver' END AS cat
        FROM _nenum WHERE enum = 'ENUM_NSYS_EVENT_CLASS'""")
    # NVTX ranges and marks, with their domain's name (the DomainCreate event of the same domainId)
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nnvtx0 AS
        WITH dom AS (
            SELECT n.domainId, any_value(coalesce(nullif(n.text, ''), s.value)) AS domain
            FROM _nv n LEFT JOIN _nstr s ON s.id = n.textId
            WHERE n.eventType IN {_etype(['NvtxDomainCreate'])} GROUP BY n.domainId
        )
        SELECT row_number() OVER () AS ord, r.rank, n.globalTid AS gtid,
               coalesce(nullif(n.text, ''), s.value, '') AS name, n.start + {b} AS start_ns,
               CASE WHEN n.eventType IN {_etype(NVTX_MARK_TYPES)} THEN n.start
                    ELSE greatest(n."end", n.start) END + {b} AS end_ns,
               n.eventType IN {_etype(NVTX_MARK_TYPES)} AS is_mark, dom.domain, n.category
        FROM _nv n JOIN _nrank r ON r.g = {_gpid('n.globalTid')}
        LEFT JOIN _nstr s ON s.id = n.textId
        LEFT JOIN dom ON dom.domainId = n.domainId AND n.domainId <> 0
        WHERE n.start IS NOT NULL AND (
              (n.eventType IN {_etype(NVTX_RANGE_TYPES)} AND n."end" IS NOT NULL)
              OR n.eventType IN {_etype(NVTX_MARK_TYPES)})""")
    # depth of a range on its thread: ranges open at its start (ties: the longer range is the outer one)
    con.execute("""CREATE OR REPLACE TEMP TABLE _nnvtx AS
        WITH rng AS (SELECT * FROM _nnvtx0 WHERE NOT is_mark),
        pts AS (
            SELECT ord, gtid, start_ns AS t, 1 AS d, end_ns AS e FROM rng
            UNION ALL SELECT NULL, gtid, end_ns, -1, end_ns FROM rng
        ), run AS (
            SELECT ord, sum(d) OVER (PARTITION BY gtid ORDER BY t, d, e DESC ROWS UNBOUNDED PRECEDING) - 1 AS depth
            FROM pts
        )
        SELECT x.*, CAST(coalesce(run.depth, 0) AS INTEGER) AS depth,
               CAST(x.gtid % 16777216 AS VARCHAR) AS tid
        FROM _nnvtx0 x LEFT JOIN (SELECT * FROM run WHERE ord IS NOT NULL) run ON run.ord = x.ord""")
    con.execute("DROP TABLE _nnvtx0")
    # open-range count per thread after each NVTX boundary: the depth of a CUDA call starting at t
    con.execute("""CREATE OR REPLACE TEMP TABLE _nopen AS
        SELECT DISTINCT gtid, t, sum(d) OVER (PARTITION BY gtid ORDER BY t RANGE UNBOUNDED PRECEDING) AS open
        FROM (SELECT gtid, start_ns AS t, 1 AS d FROM _nnvtx WHERE NOT is_mark
              UNION ALL SELECT gtid, end_ns, -1 FROM _nnvtx WHERE NOT is_mark)""")


def _insert_gpu(con, job: str, base: int) -> None:
    b = int(base)
    g = _gpid("coalesce(x.globalPid, 0)")
    # kernels: name and args are built once per distinct (name ids, launch configuration), then joined
    key = ["demangledName", "shortName", "mangledName", "name"]
    if con.execute("SELECT count(gridX) > 0 FROM _nk").fetchall()[0][0]:
        key += KERNEL_ARG_COLS
    args = "json_object('short name', ss.value)"
    if len(key) > 4:
        args = ("json_object('short name', ss.value, 'grid', [c.gridX, c.gridY, c.gridZ], "
                "'block', [c.blockX, c.blockY, c.blockZ], 'registers per thread', c.registersPerThread, "
                "'shared memory', c.staticSharedMemory + c.dynamicSharedMemory)")
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nkname AS
        SELECT c.*, coalesce(nullif(sd.value, ''), nullif(ss.value, ''), nullif(sm.value, ''), nullif(sn.value, ''),
                             CASE WHEN sn.id IS NULL THEN nullif(c.name, '') END, '<unnamed kernel>') AS kname,
               {args} AS args
        FROM (SELECT DISTINCT {", ".join(key)} FROM _nk) c
        LEFT JOIN _nstr sd ON sd.id = c.demangledName
        LEFT JOIN _nstr ss ON ss.id = c.shortName
        LEFT JOIN _nstr sm ON sm.id = c.mangledName
        LEFT JOIN _nstr sn ON sn.id = TRY_CAST(c.name AS BIGINT)""")
    on = " AND ".join(f"c.{k} IS NOT DISTINCT FROM x.{k}" for k in key)
    con.execute(f"""INSERT INTO gpu_ops
        SELECT ?, r.rank, CAST(x.deviceId AS INTEGER), x.streamId, 'kernel', c.kname,
               x.start + {b}, greatest(coalesce(x."end", x.start), x.start) + {b}, x.correlationId, NULL, NULL, NULL,
               c.args
        FROM _nk x JOIN _nrank r ON r.g = {g}
        JOIN _nkname c ON {on}
        WHERE x.start IS NOT NULL""", [job])
    con.execute(f"""INSERT INTO gpu_ops
        SELECT ?, r.rank, CAST(x.deviceId AS INTEGER), x.streamId, 'memcpy',
               'Memcpy ' || coalesce(ck.kind, 'Unknown') || ' (' || coalesce(sk.label, '?') || ' -> '
                   || coalesce(dk.label, '?') || ')',
               x.start + {b}, greatest(coalesce(x."end", x.start), x.start) + {b}, x.correlationId, NULL,
               ck.kind, x.bytes,
               json_object('copy kind', ck.label, 'src kind', sk.label, 'dst kind', dk.label,
                           'context', x.contextId, 'graph node', x.graphNodeId)
        FROM _nm x JOIN _nrank r ON r.g = {g}
        LEFT JOIN _nck ck ON ck.id = x.copyKind
        LEFT JOIN _nmk sk ON sk.id = x.srcKind
        LEFT JOIN _nmk dk ON dk.id = x.dstKind
        WHERE x.start IS NOT NULL""", [job])
    con.execute(f"""INSERT INTO gpu_ops
        SELECT ?, r.rank, CAST(x.deviceId AS INTEGER), x.streamId, 'memset', 'Memset (' || coalesce(mk.label, '?') || ')',
               x.start + {b}, greatest(coalesce(x."end", x.start), x.start) + {b}, x.correlationId, NULL, NULL, x.bytes,
               json_object('mem kind', mk.label, 'value', x.value, 'context', x.contextId, 'graph node', x.graphNodeId)
        FROM _ns x JOIN _nrank r ON r.g = {g}
        LEFT JOIN _nmk mk ON mk.id = x.memKind
        WHERE x.start IS NOT NULL""", [job])
    # 0xFFFFFFFF is CUPTI's "none" for a sync record's stream and event
    con.execute(f"""INSERT INTO gpu_ops
        SELECT ?, r.rank, CAST(x.deviceId AS INTEGER), nullif(x.streamId, 4294967295), 'sync',
               coalesce(nullif({_lookup('ENUM_CUPTI_SYNC_TYPE', 'x.syncType')}, ''), 'Synchronization'),
               x.start + {b}, greatest(coalesce(x."end", x.start), x.start) + {b}, x.correlationId, NULL, NULL, NULL,
               json_object('sync type', {_lookup('ENUM_CUPTI_SYNC_TYPE', 'x.syncType', 'name')},
                           'event', nullif(x.eventId, 4294967295), 'context', x.contextId)
        FROM _nsy x JOIN _nrank r ON r.g = {g}
        WHERE x.start IS NOT NULL""", [job])


def _int64s(col: pa.ChunkedArray) -> np.ndarray:
    """An int64 column's values in numpy, NULL slots holding whatever bytes they have (pyarrow's own
    conversions turn NULLs into floats, or import pandas)."""
    parts = [np.frombuffer(c.buffers()[1], np.int64, len(c), c.offset * 8) for c in col.chunks if len(c)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _call_depths(con, api: pa.Table, base: int) -> pa.Array:
    """Per CUDA call, the NVTX ranges open on its thread when it starts: the count after _nopen's last
    boundary at or before the start, 0 before the first. One searchsorted per thread with NVTX ranges
    (an ASOF join did the same, but sorted every call with all its columns: several times slower). Calls
    with a NULL thread or start get some number too; the insert drops them."""
    depth = np.zeros(api.num_rows, np.int64)
    bounds = con.sql("SELECT CAST(gtid AS BIGINT) AS gtid, CAST(t AS BIGINT) AS t, CAST(open AS BIGINT) AS open "
                     "FROM _nopen ORDER BY gtid, t").to_arrow_table()
    if bounds.num_rows and api.num_rows:
        bg, bt, bo = (_int64s(bounds.column(c)) for c in ("gtid", "t", "open"))
        g, start = _int64s(api.column("globalTid")), _int64s(api.column("start")) + base
        threads, first = np.unique(bg, return_index=True)
        last = np.append(first[1:], len(bg))
        ti = np.minimum(np.searchsorted(threads, g), len(threads) - 1)
        mine = np.flatnonzero(threads[ti] == g)           # calls on a thread with NVTX ranges
        order = mine[np.argsort(ti[mine], kind="stable")]   # those calls grouped by thread
        groups = np.split(order, np.cumsum(np.bincount(ti[mine], minlength=len(threads)))[:-1])
        for i, rows in enumerate(groups):
            k = np.searchsorted(bt[first[i]:last[i]], start[rows], side="right")   # boundaries at or before
            depth[rows] = np.where(k > 0, bo[first[i] + np.maximum(k, 1) - 1], 0)
    return pa.Array.from_buffers(pa.int64(), len(depth), [None, pa.py_buffer(depth)])


def _insert_host(con, job: str, base: int, apis: dict[str, pa.Table]) -> None:
    b = int(base)
    con.execute("""INSERT INTO host_ops
        SELECT ?, rank, CAST((gtid // 16777216) % 16777216 AS VARCHAR), tid, 'user_annotation', name, start_ns, end_ns,
               NULL, NULL, depth,
               CASE WHEN domain IS NOT NULL OR category IS NOT NULL
                    THEN json_object('domain', domain, 'category', category) END
        FROM _nnvtx WHERE NOT is_mark""", [job])
    # CUDA runtime/driver calls (APIS by category, registered as _napi_<cat>), each with its depth
    for cat, a in apis.items():
        con.register(f"_napi_{cat}", a.append_column("depth", _call_depths(con, a, b)))
    con.execute(f"""INSERT INTO host_ops
        SELECT ?, r.rank, CAST((x.globalTid // 16777216) % 16777216 AS VARCHAR),
               CAST(x.globalTid % 16777216 AS VARCHAR), coalesce(c.cat, x.cat),
               coalesce(n.name, nullif(x.name, ''), '<unnamed API>'),
               x.start + {b}, greatest(coalesce(x."end", x.start), x.start) + {b}, NULL, x.correlationId,
               CAST(x.depth AS INTEGER),
               CASE WHEN x.returnValue <> 0 THEN json_object('api', n.raw, 'return', x.returnValue) END
        FROM _napi x JOIN _nrank r ON r.g = {_gpid('x.globalTid')}
        LEFT JOIN _nclass c ON c.id = x.eventClass
        LEFT JOIN _napiname n ON n.id = x.nameId
        WHERE x.start IS NOT NULL AND c.cat IS DISTINCT FROM 'skip'""", [job])


def _insert_steps(con, job: str, pattern: str | None, n_groups: int | None) -> dict:
    """Steps per rank by the rules in the module doc; returns rank → [(diagnostic code, count, example)]."""
    done: dict = {}
    ranks = [r for (r,) in con.execute("SELECT rank FROM _nrank ORDER BY rank").fetchall()]

    def add(sql, code, what, params=()):
        todo = [r for r in ranks if r not in done]
        if not todo:
            return
        lst = ", ".join(str(r) for r in todo)
        con.execute(f"CREATE OR REPLACE TEMP TABLE _nstep AS {sql.format(ranks=lst)}", list(params))
        for r, n, ex in con.execute("SELECT rank, count(*), min(ex) FROM _nstep GROUP BY rank").fetchall():
            done[r] = [(code, n, f"{what}: {ex}")]
        con.execute("INSERT INTO steps SELECT ?, rank, step, start_ns, end_ns FROM _nstep", [job])
        con.execute("DROP TABLE _nstep")

    def by_name(rx, numbered):
        if numbered:
            return f"""SELECT rank, TRY_CAST(regexp_extract(name, ?, 1) AS INTEGER) AS step, min(start_ns) AS start_ns,
                           max(end_ns) AS end_ns, min(name) AS ex
                       FROM _nnvtx WHERE NOT is_mark AND rank IN ({{ranks}}) AND regexp_matches(name, ?)
                       GROUP BY rank, step HAVING step IS NOT NULL""", [rx, rx]
        return f"""SELECT rank, CAST(row_number() OVER (PARTITION BY rank ORDER BY start_ns) - 1 AS INTEGER) AS step,
                       start_ns, end_ns, name AS ex
                   FROM _nnvtx WHERE NOT is_mark AND rank IN ({{ranks}}) AND regexp_matches(name, ?)""", [rx]

    def by_mark(rx, numbered):
        num = "TRY_CAST(regexp_extract(name, ?, 1) AS INTEGER)" if numbered else \
            "CAST(row_number() OVER (PARTITION BY rank ORDER BY start_ns) - 1 AS INTEGER)"
        return f"""WITH m AS (
                       SELECT rank, {num} AS step, min(start_ns) AS start_ns, min(name) AS ex FROM _nnvtx
                       WHERE is_mark AND rank IN ({{ranks}}) AND regexp_matches(name, ?) GROUP BY rank, step
                   ), last AS (
                       SELECT rank, max(end_ns) AS e FROM (SELECT rank, end_ns FROM _ngpu UNION ALL
                                                           SELECT rank, end_ns FROM _nhost) GROUP BY rank
                   )
                   SELECT m.rank, m.step, m.start_ns,
                          greatest(coalesce(lead(m.start_ns) OVER (PARTITION BY m.rank ORDER BY m.start_ns), last.e),
                                   m.start_ns) AS end_ns, m.ex
                   FROM m JOIN last USING (rank) WHERE m.step IS NOT NULL""", ([rx, rx] if numbered else [rx])

    sql, p = by_name(PROFILER_STEP, True)
    add(sql, "steps_from_profiler_step", "NVTX ProfilerStep#N ranges", p)
    pat = pattern if pattern is not None else STEP_PATTERN
    numbered = (n_groups if pattern is not None else 1) >= 1
    sql, p = by_name(pat, numbered)
    add(sql, "steps_from_step_pattern", f"NVTX ranges matching {pat!r}", p)
    for rx, nb in ((PROFILER_STEP, True), (pat, numbered)):
        sql, p = by_mark(rx, nb)
        add(sql, "steps_from_marks", f"NVTX marks matching {rx!r}", p)
    # the repeated outermost range enclosing GPU launches
    add("""WITH d AS (
               SELECT rank, gtid, tid, name, start_ns, end_ns FROM _nnvtx
               WHERE depth = 0 AND NOT is_mark AND rank IN ({ranks})
           ), launches AS (
               SELECT a.rank, a.tid, a.start_ns FROM _nhost a
               WHERE EXISTS (SELECT 1 FROM _ngpu g WHERE g.rank = a.rank AND g.correlation = a.correlation)
           ), occ AS (
               SELECT d.rank, d.gtid, d.name, d.start_ns, d.end_ns,
                      (SELECT count(*) FROM launches l WHERE l.rank = d.rank AND l.tid = d.tid
                       AND l.start_ns >= d.start_ns AND l.start_ns <= d.end_ns) AS n_launch
               FROM (SELECT DISTINCT * FROM d) d
           ), cand AS (
               SELECT rank, gtid, name, count(*) AS n, sum(n_launch) AS nl, min(start_ns) AS first FROM occ
               GROUP BY rank, gtid, name HAVING count(*) >= 2 AND min(n_launch) >= 1
           ), best AS (
               SELECT * FROM cand QUALIFY row_number() OVER (PARTITION BY rank ORDER BY n DESC, nl DESC, first) = 1
           )
           SELECT o.rank, CAST(row_number() OVER (PARTITION BY o.rank ORDER BY o.start_ns) - 1 AS INTEGER) AS step,
                  o.start_ns, o.end_ns, o.name AS ex
           FROM occ o JOIN best b ON b.rank = o.rank AND b.gtid = o.gtid AND b.name = o.name""",
        "steps_from_repeated_range", "repeated outermost NVTX range enclosing GPU launches")
    return done


def _insert_collectives(con, job: str) -> None:
    # the collective: from the kernel name (ncclDevKernel_AllReduce_Sum_f32_RING_LL, ncclKernel_AllReduce_RING_LL_Sum_float),
    # else from the NCCL-domain NVTX range (ncclAllReduce, ...) enclosing the launch on the same thread
    con.execute(r"""INSERT INTO collectives
        WITH k AS (
            SELECT rank, name, start_ns, end_ns, correlation,
                   nullif(lower(regexp_extract(name, '^nccl(?:Dev)?Kernel_([A-Za-z]+)', 1)), 'generic') AS coll
            FROM _ngpu WHERE kind = 'kernel' AND regexp_matches(name, '^nccl(Dev)?Kernel')
        ), nv AS (
            SELECT k.rank, k.correlation, k.start_ns,
                   min(lower(regexp_replace(n.name, '^nccl', ''))) AS coll
            FROM k JOIN _nhost a ON a.rank = k.rank AND a.correlation = k.correlation
            JOIN _nnvtx n ON n.rank = a.rank AND n.tid = a.tid AND NOT n.is_mark AND n.domain = 'NCCL'
                          AND a.start_ns BETWEEN n.start_ns AND n.end_ns
                          AND n.name NOT IN ('ncclGroupStart', 'ncclGroupEnd')
            WHERE k.coll IS NULL GROUP BY ALL
        )
        SELECT ?, k.rank, NULL, NULL, NULL, NULL, coalesce(k.coll, nv.coll, 'nccl_other'), NULL, NULL, NULL, NULL,
               NULL, k.start_ns, k.end_ns, k.name, NULL, 'kernel'
        FROM k LEFT JOIN nv ON nv.rank = k.rank AND nv.correlation = k.correlation AND nv.start_ns = k.start_ns
        ORDER BY k.rank, k.start_ns""", [job])


def _device_names(con, src: _Src) -> dict[int, str]:
    """globalPid → the name of the GPU its first kernel ran on (TARGET_INFO_GPU)."""
    t = "TARGET_INFO_GPU"
    if not src.has(t, "name"):
        return {}
    key = "cuDevice" if src.has(t, "cuDevice") else ("id" if src.has(t, "id") else None)
    gpus = src.rows(f'SELECT {key or "NULL"}, name FROM {t}', t)
    by_id = {i: n for i, n in gpus}
    out = {}
    for g, d in con.execute("""SELECT r.g, min(x.device) FROM _nrank r JOIN _ngpu x ON x.rank = r.rank
                               GROUP BY r.g""").fetchall():
        out[g] = by_id.get(d) or (gpus[0][1] if gpus else None)
    return out


def _counts(con, job: str, rank: int) -> dict:
    k, m, s, y = con.execute("""SELECT count(*) FILTER (kind = 'kernel'), count(*) FILTER (kind = 'memcpy'),
                                count(*) FILTER (kind = 'memset'), count(*) FILTER (kind = 'sync')
                                FROM gpu_ops WHERE job = ? AND rank = ?""", [job, rank]).fetchall()[0]
    out = {"kernel": k, "memcpy": m, "memset": s, "sync": y}
    for t in ("host_ops", "steps", "collectives"):
        out[t] = con.execute(f"SELECT count(*) FROM {t} WHERE job = ? AND rank = ?", [job, rank]).fetchall()[0][0]
    return out


def _no_corr(con) -> dict:
    """rank → GPU activities (not syncs) with no CUDA call of the same correlation id; computed once."""
    rows = con.execute("""SELECT g.rank, count(*) FROM _ngpu g ANTI JOIN _nhost a
                          ON a.rank = g.rank AND a.correlation = g.correlation
                          WHERE g.kind <> 'sync' GROUP BY g.rank""").fetchall()
    return dict(rows)


def _rank_diags(con, job: str, rank: int, counts: dict, no_corr_by_rank: dict) -> list:
    out = []
    neg = con.execute(" UNION ALL ".join(
        f"SELECT '{k}' FROM {v} x JOIN _nrank r ON r.g = {_gpid('coalesce(x.globalPid, 0)')} "
        f'WHERE r.rank = {int(rank)} AND x."end" < x.start' for k, v in
        (("kernel", "_nk"), ("memcpy", "_nm"), ("memset", "_ns"), ("sync", "_nsy")))).fetchall()
    if neg:
        out.append(("nsys", "negative_duration", len(neg), f"{neg[0][0]} rows ending before they start "
                    "(end clamped to start)"))
    no_corr = no_corr_by_rank.get(rank, 0)
    if no_corr:
        out.append(("nsys", "gpu_op_without_correlation", no_corr, "GPU activity with no CUDA API call of the same "
                    "correlation id in its process"))
    marks = con.execute("SELECT count(*) FROM _nnvtx WHERE rank = ? AND is_mark", [rank]).fetchall()[0][0]
    if marks:
        out.append(("nsys", "nvtx_marks", marks, "NVTX marks are used as step markers only, not stored as host_ops"))
    if counts["collectives"]:
        out.append(("nsys", "collectives_without_group", counts["collectives"], "nsys records no process group or "
                    "sequence number: collectives cannot be matched across ranks"))
    return out


def _file_diags(con, counts_in: dict, meta: dict) -> list:
    out = []
    for v, what in (("_napi", "CUDA API calls"), ("_nv", "NVTX events")):
        gcol = "globalTid"
        n = con.execute(f"SELECT count(*) FROM {v} WHERE {gcol} IS NULL OR {_gpid(gcol)} NOT IN "
                        f"(SELECT g FROM _nrank)").fetchall()[0][0]
        if n:
            out.append(("nsys", "rows_outside_gpu_processes", n, f"{what} of processes without GPU work were not stored"))
    bt = con.execute("""SELECT count(*) FROM _napi a JOIN _nenum ec ON ec.enum = 'ENUM_NSYS_EVENT_CLASS'
                        AND ec.id = a.eventClass WHERE ec.name LIKE '%CUDABACKTRACE%'""").fetchall()[0][0]
    if bt:
        out.append(("nsys", "cuda_backtrace_rows", bt, "CUDA API rows of event class 'CUDA backtrace' repeat a call "
                    "already recorded; not stored"))
    shift = str(meta.get("EXPORT_PARAM_TIME_SHIFT") or meta.get("EXPORT_CONFIG_TIME_SHIFT") or "0")
    if shift not in ("0", ""):
        out.append(("nsys", "export_time_shift", 1, f"exported with a time shift of {shift} ns"))
    return out


LOADER = Loader(
    name="nsys",
    suffixes=(".sqlite", ".nsys-rep"),
    claims=claims,
    load=load,
    description="Nsight Systems SQLite export (nsys export --type sqlite)",
)
