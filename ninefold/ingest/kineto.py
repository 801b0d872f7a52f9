"""PyTorch profiler (Kineto Chrome-trace JSON) → canonical tables.

The event array is parsed by DuckDB's JSON reader (C++, multi-threaded, streaming), never by a
Python loop per event. Python only reads the small metadata before and after ``traceEvents``.

Times: ``ts``/``dur`` are microseconds with three decimals (nanosecond precision). A file with an integer
``baseTimeNanoseconds`` holds times relative to it: they are read as DOUBLE and ns = round(ts * 1000), which is
exact while |ts| < 2^40 µs (12.7 days: the double's error, parse and product, stays under 0.1 ns there); a
file with a larger value is read again the exact way. Every other file (absolute Unix-epoch µs, before
2024-03) is read as DECIMAL(24,3), so values such as 1712345678901234.567 µs, which a double cannot hold,
convert to integer ns exactly: ns = CAST(ts * 1000 AS BIGINT). ``ns_sql`` is the one place the unit rule
lives (DOUBLE is read and converted about 6x faster than the 128-bit DECIMAL).
"""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from ninefold.ingest.common import load_json, nested_too_deep, repair_strings
from ninefold.store.errors import TraceFormatError, disk_full

try:  # ISA-L's inflate: the same gzip streams, about 3x faster than zlib's
    from isal import igzip as _gzip
    from isal.isal_zlib import error as _inflate_error
except ImportError:  # pragma: no cover - isal is a dependency; zlib still reads every stream
    _gzip, _inflate_error = gzip, zlib.error

GZIP_MAGIC = b"\x1f\x8b"
HEAD_BYTES = 8 << 20
TAIL_BYTES = 8 << 20

# 2021-era Kineto wrote capitalised categories (PyTorch 1.8/1.9); map them to today's names.
LEGACY_CATS = {
    "kernel": "kernel",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "runtime": "cuda_runtime",
    "driver": "cuda_driver",
    "operator": "cpu_op",
    "user annotation": "user_annotation",
    "python": "python_function",
}
GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "mtia_ccp_events": "kernel"}
FLOW_CATS = ("ac2g", "async_cpu_to_gpu", "fwdbwd", "async")

# element sizes of c10 ScalarType names as written in "dtype"
DTYPE_BYTES = {
    "Float": 4, "float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2,
    "Char": 1, "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "ComplexFloat": 8,
    "ComplexDouble": 16, "UInt32": 4, "UInt64": 8,
}

RANK_FROM_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)


@dataclass
class KinetoMeta:
    meta: dict = field(default_factory=dict)
    slice_path: str = ""          # a file holding exactly the JSON array of events (the first chunk)
    chunks: list = field(default_factory=list)   # [(chunk file, document offset of its byte 1)]
    array_offset: int = 0         # byte offset of '[' in the (decompressed) document
    salvaged: bool = False
    cut_at: int | None = None     # byte offset of the truncation when salvaged
    tmpdir: str | None = None
    repaired: int = 0             # lone surrogate escapes replaced by U+FFFD
    exact_ts: bool = False        # ts/dur read as DECIMAL(24,3) (else DOUBLE): set by read_events

    def cleanup(self):
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


# A .json.gz is decompressed into the work folder before parsing; a gzip bomb must not fill the disk. Kineto
# JSON compresses 5-25x; the cap is a multiple of the compressed size (at least MIN), set by --max-decompressed-bytes.
MAX_DECOMPRESSED_RATIO = 100
MIN_DECOMPRESSED_CAP = 256 << 20
MAX_DECOMPRESSED_BYTES: int | None = None  # an absolute cap instead of the ratio (the CLI option)


def decompressed_cap(compressed: int) -> int:
    if MAX_DECOMPRESSED_BYTES is not None:
        return MAX_DECOMPRESSED_BYTES
    return max(MIN_DECOMPRESSED_CAP, MAX_DECOMPRESSED_RATIO * compressed)


def _decompress(path: Path, dst: Path) -> None:
    cap = decompressed_cap(path.stat().st_size)
    try:
        with _gzip.open(path, "rb") as src, open(dst, "wb") as out:
            head = src.read(1 << 16)
            if head and head.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] not in (b"{", b"[", b""):
                raise TraceFormatError(path, None, "not JSON inside the gzip stream (does not start with '{')")
            out.write(head)
            n = len(head)
            # into one reused 1 MiB buffer: a fresh 16 MiB bytes object per read is mapped and faulted in anew
            # each time (on the 545 MB bench file that took the decompression from 0.3 to 0.7-1.2 s)
            buf = bytearray(1 << 20)
            view = memoryview(buf)
            while True:
                k = src.readinto(buf)
                if not k:
                    break
                n += k
                if n > cap:
                    raise TraceFormatError(path, None, f"decompresses to more than {cap} bytes (a gzip bomb?); "
                                           "raise --max-decompressed-bytes if the trace is real")
                out.write(view[:k])
    except (OSError, EOFError, zlib.error, _inflate_error) as e:
        full = disk_full(e, dst, "the decompressed trace")
        if full is not None:     # the work folder's disk, not the file
            raise full from None
        raise TraceFormatError(path, None, f"corrupt gzip stream ({e})") from None


_WS = " \t\r\n"
_ONLY_WS = re.compile(r"[ \t\r\n]*\Z")


def _rest_is_object_tail(t: str, i: int, dec=json.JSONDecoder()) -> bool:
    """Whether t[i:] reads as the remainder of an object after one member: ``(, "k": v)* }`` then only
    whitespace. Parses in place (no copy of the tail), so a wrong candidate costs only up to its error."""
    n = len(t)
    while i < n and t[i] in _WS:
        i += 1
    while i < n and t[i] == ",":
        i += 1
        while i < n and t[i] in _WS:
            i += 1
        if i >= n or t[i] != '"':
            return False
        try:
            _, i = dec.raw_decode(t, i)
            while i < n and t[i] in _WS:
                i += 1
            if i >= n or t[i] != ":":
                return False
            i += 1
            while i < n and t[i] in _WS:
                i += 1
            _, i = dec.raw_decode(t, i)
        except ValueError:
            return False
        while i < n and t[i] in _WS:
            i += 1
    if i >= n or t[i] != "}":
        return False
    return _ONLY_WS.match(t, i + 1) is not None


def _find_array_end(tail: bytes, tail_off: int) -> tuple[int, dict] | None:
    """Offset of the ']' that closes traceEvents, and the metadata after it.

    The real end is the earliest ']' in the tail that follows an event ('}' or '[') and after which
    the rest of the document parses as the remainder of an object (``, "k": v ... }``).
    """
    # latin-1 keeps one character per byte, so string offsets are byte offsets
    t = tail.decode("latin-1")
    deep = False
    for m in re.finditer(r"[}\[]\s*\]", t):
        pos = m.end() - 1
        try:
            if not _rest_is_object_tail(t, pos + 1):
                continue
            rest = tail[pos + 1:].strip()
            body = rest[1:] if rest.startswith(b",") else rest
            extra = json.loads(b"{" + body if body != b"}" else b"{}")
        except ValueError:
            continue
        except RecursionError:      # nested deeper than the parser goes: maybe the end, unreadable
            deep = True
            continue
        if isinstance(extra, dict):
            return tail_off + pos, extra
    if deep:
        raise RecursionError("the metadata after traceEvents is nested too deep")
    return None


def work_root() -> Path:
    """One known folder for ingest's work files ($NINEFOLD_TMP, else <tmp>/ninefold-work)."""
    import os

    return Path(os.environ.get("NINEFOLD_TMP") or Path(tempfile.gettempdir()) / "ninefold-work")


def sweep_work_root(root: Path) -> None:
    """Remove the work folders of processes that no longer run (a killed ingest or batch driver)."""
    import os

    for d in root.iterdir():
        pid = d.name.split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            pass  # another user's live process


def work_dir() -> str:
    """A fresh work folder named by this process's PID; each call first removes the folders of processes that no
    longer run, so a long-lived process (the app, a batch driver's rerun) also clears what a killed one left."""
    import os

    root = work_root()
    root.mkdir(parents=True, exist_ok=True)
    sweep_work_root(root)
    return tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root)


def sniff_kineto(path: Path, salvage: bool = False, n_chunks: int | None = None) -> KinetoMeta:
    """Locate the event array and read the metadata; raise TraceFormatError on anything else."""
    path = Path(path)
    if not path.exists():
        raise TraceFormatError(path, None, "no such file")
    if path.stat().st_size == 0:
        raise TraceFormatError(path, None, "empty file")
    km = KinetoMeta(tmpdir=work_dir())
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
        doc = path
        if magic == GZIP_MAGIC:
            doc = Path(km.tmpdir) / "doc.json"
            _decompress(path, doc)
            if doc.stat().st_size == 0:
                raise TraceFormatError(path, None, "empty file (gzip holds no data)")
        size = doc.stat().st_size
        with open(doc, "rb") as f:
            head = f.read(HEAD_BYTES)
            stripped = head.lstrip()
            if not stripped.startswith(b"{"):
                first = stripped[:1]
                if first == b"[":
                    raise TraceFormatError(path, "byte 0", "a bare JSON array, not a Kineto trace object "
                                           "(no traceEvents/metadata)")
                raise TraceFormatError(path, "byte 0", "not JSON (does not start with '{')")
            m = re.search(rb'"traceEvents"\s*:\s*\[', head)
            if not m:
                raise TraceFormatError(path, None, "not a Kineto trace: no \"traceEvents\" array "
                                       f"in the first {HEAD_BYTES >> 20} MiB")
            km.array_offset = m.end() - 1
            pre = head[: m.start()].rstrip()
            pre = pre[:-1] if pre.endswith(b",") else pre
            try:
                km.meta = load_json(pre + b"}", path, "metadata", repair=True) if pre.strip() != b"{" else {}
            except ValueError as e:
                raise TraceFormatError(path, "metadata", f"malformed metadata before traceEvents ({e})") from None
            toff = max(km.array_offset, size - TAIL_BYTES)
            f.seek(toff)
            tail = f.read()
            try:
                found = _find_array_end(tail, toff)
            except RecursionError:
                raise TraceFormatError(path, "metadata after traceEvents", nested_too_deep()) from None
            if found is None:
                # A cut file: find the last complete event (a '}' followed by ',' and the next '{').
                last = None
                for mm in re.finditer(rb"\}\s*,\s*(?=\{)", tail):
                    last = mm
                end_event = toff + last.start() if last else None
                where = f"byte {size}"
                if not salvage:
                    detail = (f"; last complete event ends at byte {end_event + 1}" if end_event is not None else "")
                    raise TraceFormatError(path, where, "truncated JSON: the traceEvents array is never closed"
                                           f"{detail} (use --salvage to keep the complete events)")
                if end_event is None:
                    raise TraceFormatError(path, where, "truncated JSON with no complete event to salvage")
                km.salvaged = True
                km.cut_at = size
                end = end_event + 1
                closing = b"]"
            else:
                end, extra = found
                for k, v in repair_strings(extra).items():
                    km.meta.setdefault(k, v)
                end += 1
                closing = b""
            _write_chunks(f, km, end, closing, size, n_chunks)
        if doc != path:
            os.unlink(doc)
        return km
    except BaseException:
        km.cleanup()
        raise


# An event boundary that cannot lie inside a string: a raw newline never occurs in a JSON string,
# so '}' ',' <whitespace with a newline> '{' is between tokens. If the '}' closes a nested object
# instead of an event, the chunk's brackets do not balance and the parse fails; read_events then
# retries on one unsplit slice, so a wrong split can never change what is stored.
_BOUNDARY = re.compile(rb"\}[ \t\r]*,[ \t\r]*\n\s*(?=\{)")
MIN_CHUNK = 16 << 20
# the largest single event the reader accepts; each reader thread buffers a few of these
MAX_EVENT_BYTES = 64 << 20


def _default_chunks() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def _write_chunks(f, km: KinetoMeta, end: int, closing: bytes, size: int, n_chunks: int | None) -> None:
    """Copy the event array [array_offset, end) into chunk files that are each a JSON array.

    Several chunks let DuckDB parse one trace on several cores (its JSON reader is one thread per file).
    """
    n = n_chunks or _default_chunks()
    span = end - km.array_offset
    n = max(1, min(n, span // max(1, MIN_CHUNK)))
    cuts = [(km.array_offset, km.array_offset)]
    for k in range(1, n):
        target = km.array_offset + span * k // n
        f.seek(target)
        window = f.read(1 << 20)
        m = _BOUNDARY.search(window)
        if m is None:
            continue
        brace = target + m.start()           # the '}' that ends the previous event
        nxt = target + m.end()               # the '{' that starts the next
        if brace + 1 <= cuts[-1][1] or nxt >= end:
            continue
        cuts.append((brace + 1, nxt))
    km.chunks = []
    bounds = []
    prev_start = km.array_offset
    for c in cuts[1:]:
        bounds.append((prev_start, c[0]))
        prev_start = c[1]
    bounds.append((prev_start, end))
    for i, (a, b) in enumerate(bounds):
        out_path = str(Path(km.tmpdir) / f"events-{i}.json")
        try:
            with open(out_path, "wb") as out:
                if i > 0:
                    out.write(b"[")
                _copy_range(f, out, a, b - a)
                out.write(closing if i == len(bounds) - 1 else b"]")
        except OSError as e:
            full = disk_full(e, out_path, "the trace's events (a work file)")
            if full is not None:     # the work folder's disk, not the file
                raise full from None
            raise
        # byte p of this file is document byte a + p (chunk 0 starts at the '[' itself) or a + p - 1
        km.chunks.append((out_path, a if i == 0 else a - 1))
    km.slice_path = km.chunks[0][0]


def _copy_range(f, out, start: int, length: int) -> None:
    """Append bytes [START, START+LENGTH) of the open file F to the open file OUT: in the kernel
    (copy_file_range, no pass through this process's memory) where the system allows, else read and write."""
    out.flush()
    done = 0
    if hasattr(os, "copy_file_range"):
        try:
            while done < length:
                k = os.copy_file_range(f.fileno(), out.fileno(), length - done, start + done)
                if k == 0:
                    break
                done += k
        except OSError:
            pass            # another file system, an old kernel: copy what is left by hand
        out.seek(0, os.SEEK_END)
    f.seek(start + done)
    remaining = length - done
    while remaining > 0:
        chunk = f.read(min(remaining, 1 << 20))
        if not chunk:
            break
        out.write(chunk)
        remaining -= len(chunk)


def _merge_chunks(km: KinetoMeta) -> None:
    """Concatenate the chunks back into one JSON array (the exact original slice)."""
    if len(km.chunks) <= 1:
        return
    merged = str(Path(km.tmpdir) / "events.json")
    with open(merged, "wb") as out:
        for i, (p, _) in enumerate(km.chunks):
            with open(p, "rb") as src:
                data = src.read()
            if i > 0:
                data = data[1:]
            if i < len(km.chunks) - 1:
                data = data[:-1] + b","
            out.write(data)
            os.unlink(p)
    km.chunks = [(merged, km.array_offset)]
    km.slice_path = merged


def rank_from_meta_or_name(meta: dict, path: Path) -> int | None:
    di = meta.get("distributedInfo")
    if isinstance(di, dict) and isinstance(di.get("rank"), int):
        return di["rank"]
    m = RANK_FROM_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


EVENT_COLUMNS = (
    "{'ph':'VARCHAR','cat':'VARCHAR','name':'VARCHAR','pid':'VARCHAR','tid':'VARCHAR',"
    "'ts':'DECIMAL(24,3)','dur':'DECIMAL(24,3)','id':'VARCHAR','bp':'VARCHAR','s':'VARCHAR','args':'JSON'}"
)
FAST_EVENT_COLUMNS = EVENT_COLUMNS.replace("DECIMAL(24,3)", "DOUBLE")
FAST_TS_LIMIT = 2 ** 40   # µs: below it round(ts * 1000) of the double is the exact ns


def cat_sql() -> str:
    """SQL for an event's category in today's lower-case names (legacy capitalised ones mapped)."""
    cases = " ".join(f"WHEN '{k}' THEN '{v}'" for k, v in LEGACY_CATS.items())
    return f"CASE lower(coalesce(cat, '')) {cases} ELSE lower(coalesce(cat, '')) END"


def ns_sql(exact: bool, base: int) -> tuple[str, str]:
    """SQL for an event's start and end in integer ns from ts/dur in µs read as DECIMAL(24,3) (EXACT) or
    DOUBLE, plus BASE ns. NULL, never an error, where they would not fit a BIGINT (or, for DOUBLE, where
    |ts| or |dur| reaches FAST_TS_LIMIT: read_events then reads the file again the exact way)."""
    if exact:   # ts has three decimals: ts * 1000 is a whole number, exactly; the sum is exact in DECIMAL
        return (f"TRY_CAST(ts * 1000 + {base} AS BIGINT)",
                f"TRY_CAST((ts + greatest(coalesce(dur, 0), 0)) * 1000 + {base} AS BIGINT)")
    start = f"CASE WHEN abs(ts) < {FAST_TS_LIMIT} THEN CAST(round(ts * 1000) AS BIGINT) + {base} END"
    return start, (f"{start} + CASE WHEN abs(coalesce(dur, 0)) < {FAST_TS_LIMIT} "
                   f"THEN greatest(CAST(round(coalesce(dur, 0) * 1000) AS BIGINT), 0) END")


def base_ns(meta: dict) -> int | None:
    """The trace's baseTimeNanoseconds when it has one (its ts are then relative to it), else None."""
    b = meta.get("baseTimeNanoseconds")
    return b if isinstance(b, int) else None


BASE_LIMIT = 2 ** 62    # ns: a baseTimeNanoseconds beyond it is no time (2116 CE); below it no sum can overflow


def drop_events(con, table: str = "_evr") -> None:
    con.execute("DROP VIEW IF EXISTS _ev")
    con.execute(f"DROP TABLE IF EXISTS {table}")


def bind_events(con, table: str = "_evr") -> None:
    """The view ``_ev`` (one row per event, ``ord`` = position in the document) over a parsed table."""
    con.execute(f"CREATE OR REPLACE TEMP VIEW _ev AS SELECT rowid + 1 AS ord, * FROM {table}")


_SURROGATE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _repair_surrogates(km: KinetoMeta) -> int:
    """Replace lone surrogate escapes in the chunk files by \\ufffd (pairs are kept); returns how many."""
    n = 0

    def fix(m):
        nonlocal n
        if len(m.group(0)) == 12:  # a high + low pair: a valid character
            return m.group(0)
        n += 1
        return b"\\ufffd"
    for f in [c[0] for c in km.chunks] or [km.slice_path]:
        p = Path(f)
        data = p.read_bytes()
        if b"\\u" in data:
            fixed = _SURROGATE.sub(fix, data)
            if fixed != data:
                p.write_bytes(fixed)
    return n


def read_events(con, km: KinetoMeta, path: Path, table: str = "_evr") -> None:
    """Parse the event array into TABLE (default a temp table) and bind ``_ev`` to it when it is ours."""
    temp = table == "_evr"
    if temp:
        drop_events(con)
    try:
        files = [c[0] for c in km.chunks] or [km.slice_path]
        base = base_ns(km.meta)
        km.exact_ts = km.exact_ts or base is None
        base = base or 0
        if not -BASE_LIMIT < base < BASE_LIMIT:
            raise TraceFormatError(path, None, f"baseTimeNanoseconds {base} is out of range (|base| < 2^62 ns)")
        start, end = ns_sql(km.exact_ts, base)
        # Several chunk files parse in parallel; insertion order (file order, then row order) is kept, so the
        # table's rowid is the event's position in the document. Each event's category (today's names), start
        # and end in integer ns are computed here, in the parallel parse, once: every stored table reads them.
        con.execute(
            f"CREATE OR REPLACE {'TEMP ' if temp else ''}TABLE {table} AS SELECT *, {cat_sql()} AS xcat, "
            f"{start} AS start_ns, {end} AS end_ns "
            f"FROM read_json(?, format='array', maximum_object_size={MAX_EVENT_BYTES}, "
            f"columns={EVENT_COLUMNS if km.exact_ts else FAST_EVENT_COLUMNS})",
            [files],
        )
        if not km.exact_ts:
            big = con.execute(f"SELECT max(greatest(abs(ts), abs(dur))) >= {FAST_TS_LIMIT} FROM {table}").fetchone()[0]
            if big:         # a time a double cannot carry to the ns: the exact way
                km.exact_ts = True
                return read_events(con, km, path, table)
        bad = con.execute(f"SELECT any_value(ts), any_value(dur) FROM {table} WHERE ts IS NOT NULL "
                          "AND (start_ns IS NULL OR end_ns IS NULL)").fetchone()
        if bad[0] is not None:
            raise TraceFormatError(path, None, f"an event's time is out of range: ts {bad[0]} us, dur {bad[1]} us "
                                   "do not fit 64-bit integer nanoseconds")
        if temp:
            bind_events(con)
    except duckdb.InvalidInputException as e:  # a parse error; memory and I/O errors pass through
        if "surrogate" in str(e) and not km.repaired:
            # a lone UTF-16 surrogate escape (\\udcff) in some string: repair it to U+FFFD and keep the file
            km.repaired = _repair_surrogates(km)
            if km.repaired:
                return read_events(con, km, path, table)
        if len(km.chunks) > 1:
            _merge_chunks(km)       # report the error exactly as for one unsplit array
            return read_events(con, km, path, table)
        msg = str(e)
        m = re.search(r"at byte (\d+)", msg)
        where = f"byte {km.chunks[0][1] + int(m.group(1))}" if m and km.chunks else (
            f"byte {km.array_offset + int(m.group(1))}" if m else None)
        reason = msg.split("Error: ", 1)[-1].split("\n")[0]
        reason = re.sub(r' in file "[^"]*"', "", reason)
        raise TraceFormatError(path, where, f"malformed JSON in traceEvents: {reason}") from None
