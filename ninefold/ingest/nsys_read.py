"""Reading an Nsight Systems SQLite export: the file's checks before SQLite sees it, its schema, and its tables
as typed Arrow through the ADBC SQLite driver, read side by side in threads (see ninefold.ingest.nsys for the whole
mapping)."""
from __future__ import annotations

import os
import sqlite3
import threading
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa

from ninefold.store.errors import TraceFormatError

SQLITE_MAGIC = b"SQLite format 3\x00"
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
BATCH_ROWS = 1 << 16          # rows per Arrow batch the SQLite driver hands over
READ_THREADS = max(1, min(4, os.cpu_count() or 1))
PARALLEL_MIN_ROWS = 1 << 18   # rows per connection below which a table is read in one go
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
# the launch configuration kept in a kernel's args (grid, block, registers, shared memory)
KERNEL_ARG_COLS = ["gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread",
                   "staticSharedMemory", "dynamicSharedMemory"]
GPU_TABLES = {"kernel": "CUPTI_ACTIVITY_KIND_KERNEL", "memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY",
              "memset": "CUPTI_ACTIVITY_KIND_MEMSET", "sync": "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"}
API_TABLES = {"cuda_runtime": "CUPTI_ACTIVITY_KIND_RUNTIME", "cuda_driver": "CUPTI_ACTIVITY_KIND_DRIVER"}


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
        self.repaired = 0       # text values that were not valid UTF-8, stored with U+FFFD in their place
        self._counting = threading.Lock()
        try:
            # tables are read in threads: the small queries share this connection one at a time (under
            # concurrent calls sqlite3_errcode, which reports a failed step, is the connection's, so another
            # thread's success can hide a damaged page's error); the bulk reads each open their own (arrow)
            self.db = sqlite3.connect(_uri(path), uri=True, check_same_thread=False)
            self.db.text_factory = self._text
            self.lock = threading.Lock()
            rows = self.db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
            self.cols = {}
            for (t,) in rows:
                info = self.db.execute(f'PRAGMA table_xinfo("{t}")').fetchall()
                self.cols[t] = [r[1] for r in info if not r[6]]
            self.adbc_db = adbc_driver_sqlite.connect(_uri(path))
        except (sqlite3.Error, OSError, ValueError, adbc_driver_manager.Error) as e:
            raise TraceFormatError(path, None, f"unreadable SQLite file: {_one_line(e)}") from None

    def _text(self, b: bytes) -> str:
        """SQLite text as str: bytes that are not UTF-8 (a lone surrogate written as CESU-8, a cut character)
        become U+FFFD, counted, as the Kineto reader does with lone surrogate escapes."""
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            with self._counting:
                self.repaired += 1
            return b.decode("utf-8", errors="replace")

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
        for c in texts:
            if c in got:
                got[c] = self._valid_utf8(got[c])
        n = len(next(iter(got.values())))
        return pa.table([got[f.name].cast(f.type) if f.name in got else pa.nulls(n, f.type) for f in schema],
                        schema=schema)

    def _valid_utf8(self, col: pa.ChunkedArray) -> pa.ChunkedArray:
        """COL with every value that is not valid UTF-8 repaired to U+FFFD (SQLite stores text bytes unchecked;
        DuckDB must never see them: its string functions fail fatally and invalidate the database)."""
        chunks = []
        for a in col.chunks:
            try:
                a.validate(full=True)
            except pa.ArrowInvalid:
                vals = a.cast(pa.binary()).to_pylist()
                a = pa.array([None if v is None else self._text(v) for v in vals], pa.string())
            chunks.append(a)
        return pa.chunked_array(chunks, pa.string())

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
            with self.lock:
                lo = self.db.execute(f'SELECT min(rowid) FROM "{table}"').fetchall()
                hi = self.db.execute(f'SELECT max(rowid) FROM "{table}"').fetchall()
        except sqlite3.OperationalError as e:   # a WITHOUT ROWID table: one sequential read
            if "rowid" not in str(e):
                raise TraceFormatError(self.path, table, f"unreadable: {_one_line(e)}") from None
            return None, None
        except sqlite3.Error as e:
            raise TraceFormatError(self.path, table, f"unreadable: {_one_line(e)}") from None
        if not lo or not hi:
            raise TraceFormatError(self.path, table, "unreadable: no row from min(rowid)/max(rowid)")
        return lo[0][0], hi[0][0]

    def rows(self, sql: str, where: str, args=()) -> list:
        try:
            with self.lock:
                return self.db.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise TraceFormatError(self.path, where, f"unreadable: {_one_line(e)}") from None


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]


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


def _session_start(src: _Src, path: Path, diags: list) -> tuple[int, str]:
    t = "TARGET_INFO_SESSION_START_TIME"
    if src.has(t, "utcEpochNs"):
        row = src.rows(f"SELECT CAST(utcEpochNs AS INTEGER) FROM {t} WHERE utcEpochNs IS NOT NULL LIMIT 1", t)
        if row and row[0][0] is not None and row[0][0] > 0:
            return int(row[0][0]), "session_start"
    diags.append(("nsys", "no_session_start", 1, "no TARGET_INFO_SESSION_START_TIME.utcEpochNs: times stay ns since "
                  "the session start; ranks cannot be aligned by wall clock"))
    return 0, "relative_unknown"
