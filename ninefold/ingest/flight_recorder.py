"""PyTorch Flight Recorder dumps (pickle or JSON, formats.md §4) → fr_dumps, fr_pgs, fr_entries.

Pickles are untrusted input: they are read only through :class:`SafeUnpickler`, whose ``find_class`` refuses
every class and function. A Flight Recorder dump is built from dicts, lists, tuples, strings, numbers,
booleans and None, which need no class lookup; anything else (``os.system`` via ``__reduce__``, any object)
stops the load with one line and nothing runs.

The entries go to DuckDB through Arrow (``pa.Table.from_pylist`` with a fixed schema, C++), and the
columns (pg name/desc, bytes, top frame) are computed in SQL, not per entry in Python.
"""
from __future__ import annotations

import io
import json
import pickle
import re
from pathlib import Path

import pyarrow as pa

from ninefold.ingest.kineto import DTYPE_BYTES
from ninefold.ingest.nccl_log import first
from ninefold.ingest.registry import Loader
from ninefold.ingest.common import load_json, nested_too_deep, read_nonempty, repair_strings
from ninefold.store.connection import abort
from ninefold.store.errors import IngestConflict, TraceFormatError

PICKLE_PROTO = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
TRAILING_NUM = re.compile(r"(\d+)(?:\.[A-Za-z]+)*$")

ENTRY_SCHEMA = pa.schema([
    ("record_id", pa.int64()), ("pg_id", pa.int64()), ("process_group", pa.list_(pa.string())),
    ("collective_seq_id", pa.int64()), ("p2p_seq_id", pa.int64()), ("op_id", pa.int64()),
    ("profiling_name", pa.string()), ("time_created_ns", pa.int64()),
    ("input_sizes", pa.list_(pa.list_(pa.int64()))), ("input_dtypes", pa.list_(pa.string())),
    ("output_sizes", pa.list_(pa.list_(pa.int64()))), ("output_dtypes", pa.list_(pa.string())),
    ("state", pa.string()), ("time_discovered_started_ns", pa.int64()),
    ("time_discovered_completed_ns", pa.int64()), ("duration_ms", pa.float64()), ("retired", pa.bool_()),
    ("timeout_ms", pa.int64()), ("is_p2p", pa.bool_()),
    ("frames", pa.list_(pa.struct([("name", pa.string()), ("filename", pa.string()), ("line", pa.int64())]))),
    ("thread_id", pa.string()), ("thread_name", pa.string()),
])


class RefusedClass(Exception):
    pass


class SafeUnpickler(pickle.Unpickler):
    """Unpickler for untrusted dumps: no class or function may be looked up."""

    def find_class(self, module, name):
        raise RefusedClass(f"{module}.{name}")

    def persistent_load(self, pid):
        raise RefusedClass(f"persistent id {pid!r}")


def safe_loads(data: bytes, path) -> object:
    try:
        return SafeUnpickler(io.BytesIO(data)).load()
    except RefusedClass as e:
        raise TraceFormatError(path, None, f"pickle refers to class {e}; refusing untrusted dump") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            MemoryError, OverflowError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TraceFormatError(path, None, f"truncated or corrupt pickle ({reason})") from None


def sniff(path: Path, head: bytes) -> bool:
    if head.startswith(PICKLE_PROTO):
        return b"entries" in head or b"pg_config" in head or b"pg_status" in head
    h = head.lstrip()
    if h[:1] == b"{" and b'"traceEvents"' not in head:
        return b'"entries"' in head and (b'"pg_config"' in head or b'"pg_status"' in head
                                         or b'"profiling_name"' in head)
    return False


def read_dump(path: Path) -> tuple[dict, str]:
    data = read_nonempty(path)
    if data.startswith(PICKLE_PROTO) or data[:1] == b"\x80":
        obj, fmt = safe_loads(data, path), "pickle"
    else:
        try:
            obj = load_json(data, path)
        except UnicodeDecodeError:
            raise TraceFormatError(path, None, "neither a pickle nor UTF-8 JSON (binary data)") from None
        except json.JSONDecodeError as e:
            text = data.decode("utf-8", errors="replace")
            hint = ""
            if re.search(r"\(\s*\"[^\"]*\"\s*,", text) or re.search(r"^\s*\.\.\.\s*$", text, re.M):
                hint = "; it looks like a printed dump (Python tuples, '...' elisions), not a dump file"
            raise TraceFormatError(path, f"line {e.lineno} column {e.colno}", f"not valid JSON ({e.msg}){hint}") from None
        fmt = "json"
    if not isinstance(obj, dict) or not isinstance(obj.get("entries"), list):
        keys = sorted(obj)[:8] if isinstance(obj, dict) else type(obj).__name__
        raise TraceFormatError(path, None, f"not a Flight Recorder dump: no 'entries' list (top level: {keys})")
    if not all(isinstance(e, dict) for e in obj["entries"]):
        raise TraceFormatError(path, "entries", "an entry is not a dict")
    try:
        return repair_strings(obj), fmt
    except RecursionError:      # a pickle nests without recursing; walking it does
        raise TraceFormatError(path, None, nested_too_deep(fmt)) from None


def rank_of(path: Path, rank: int | None) -> int:
    if rank is not None:
        return int(rank)
    name = Path(path).name
    m = RANK_IN_NAME.search(name) or TRAILING_NUM.search(name)
    if m is None:
        raise TraceFormatError(path, None, "no rank: a Flight Recorder dump does not hold one and the file name "
                               "has none (e.g. nccl_trace_rank_3); pass --rank")
    return int(m.group(1))


def _int(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _pg_rows(obj: dict, entries: pa.Table) -> list[tuple]:
    """fr_pgs rows: pg_config (keyed by pg name) and pg_status (keyed by pg uid), joined through the entries."""
    cfg = obj.get("pg_config") or {}
    if isinstance(cfg, list):  # Kineto-style list of {pg_name, pg_desc, ranks}
        cfg = {str(c.get("pg_name", c.get("name", i))): c for i, c in enumerate(cfg) if isinstance(c, dict)}
    status = obj.get("pg_status") or {}
    id_name = {}
    if entries.num_rows:
        ids = entries.column("pg_id").to_pylist()
        pgs = entries.column("process_group").to_pylist()
        for i, pg in zip(ids, pgs):
            if i is not None and pg:
                id_name.setdefault(i, (pg[0], pg[1] if len(pg) > 1 else None))
    rows = {}
    for key, c in cfg.items():
        if not isinstance(c, dict):
            continue
        name = str(c.get("name", key))
        if name == "" and (c.get("ranks") in ("[]", "", None, [])):
            continue  # gloo writes one empty placeholder
        ranks = c.get("ranks")
        members = None
        try:
            lst = json.loads(ranks) if isinstance(ranks, str) else ranks
            if isinstance(lst, list) and lst and all(isinstance(x, int) for x in lst):
                members = lst
        except (ValueError, TypeError, RecursionError):
            members = None
        rows[name] = [None, name, c.get("desc"), None if ranks is None else str(ranks), members, None, None, None]
    for key, s in status.items():
        if not isinstance(s, dict):
            continue
        pid = _int(key)
        name, desc = id_name.get(pid, (str(key) if str(key) in rows else None, None))
        r = rows.setdefault(name if name is not None else f"#{key}", [None, name, desc, None, None, None, None, None])
        r[0] = pid
        if r[2] is None:
            r[2] = desc
        r[5], r[6], r[7] = (_int(s.get("last_enqueued_collective")), _int(s.get("last_started_collective")),
                            _int(s.get("last_completed_collective")))
    for pid, (name, desc) in id_name.items():  # groups only the entries name
        if name not in rows:
            rows[name] = [pid, name, desc, None, None, None, None, None]
        elif rows[name][0] is None:
            rows[name][0] = pid
    return [tuple(r) for r in rows.values()]


def _check_fields(path, obj: dict) -> None:
    """One-line errors for top-level fields of the wrong type, and group members no rank can be."""
    cfg, status = obj.get("pg_config"), obj.get("pg_status")
    if cfg is not None and not isinstance(cfg, (dict, list)):
        raise TraceFormatError(path, "pg_config", f"expected an object, got {type(cfg).__name__}")
    if status is not None and not isinstance(status, dict):
        raise TraceFormatError(path, "pg_status", f"expected an object, got {type(status).__name__}")
    groups = cfg.values() if isinstance(cfg, dict) else (cfg or [])
    for c in groups:
        ranks = c.get("ranks") if isinstance(c, dict) else None
        try:
            lst = json.loads(ranks) if isinstance(ranks, str) else ranks
        except (ValueError, TypeError, RecursionError):
            continue
        if isinstance(lst, list):
            bad = [x for x in lst if isinstance(x, int) and not 0 <= x <= 2**31 - 1]
            if bad:
                raise TraceFormatError(path, "pg_config", f"group member rank {bad[0]} is out of range "
                                       f"(0..{2**31 - 1})")


def load(con, path, job, rank=None, replace=False, salvage=False):
    from ninefold.ingest.load import LoadResult, sha256_of

    path = Path(path)
    if not path.exists():
        raise TraceFormatError(path, None, "no such file")
    digest = sha256_of(path)
    same = first(con, "SELECT rank FROM fr_dumps WHERE job = ? AND sha256 = ?", [job, digest])
    if same is not None:
        return LoadResult(str(path), job, same[0], "unchanged", "already stored (same sha256)")
    obj, fmt = read_dump(path)
    _check_fields(path, obj)
    r = rank_of(path, rank)
    existing = first(con, "SELECT path FROM fr_dumps WHERE job = ? AND rank = ?", [job, r])
    if existing is not None and not replace:
        raise IngestConflict(path, f"job {job!r} already has a Flight Recorder dump for rank {r} from "
                             f"{existing[0]}; pass --replace to overwrite it")
    try:
        tbl = pa.Table.from_pylist(obj["entries"], schema=ENTRY_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
        raise TraceFormatError(path, "entries", f"unexpected field type ({str(e).splitlines()[0][:160]})") from None
    pgs = _pg_rows(obj, tbl)
    version = str(obj.get("version")) if obj.get("version") is not None else None
    lib = obj.get("comm_lib_version", obj.get("nccl_version"))
    size_case = " ".join(f"WHEN '{k}' THEN {v}" for k, v in DTYPE_BYTES.items())

    def nbytes(sizes, dtypes):
        return (f"list_sum(list_transform(list_zip({sizes}, {dtypes}), "
                f"lambda x: coalesce(list_aggregate(x[1], 'product'), 1) * (CASE x[2] {size_case} END)))")
    con.register("_fr_arrow", tbl)
    try:
        con.execute("BEGIN TRANSACTION")
        try:
            for t in ("fr_entries", "fr_pgs", "fr_dumps"):
                con.execute(f"DELETE FROM {t} WHERE job = ? AND rank = ?", [job, r])
            con.execute(f"""INSERT INTO fr_entries
                SELECT ?, ?, record_id, pg_id, process_group[1], process_group[2], collective_seq_id, p2p_seq_id,
                       op_id, profiling_name, is_p2p, state, time_created_ns,
                       nullif(time_discovered_started_ns, 0), nullif(time_discovered_completed_ns, 0), duration_ms,
                       retired, timeout_ms,
                       CAST({nbytes('input_sizes', 'input_dtypes')} AS BIGINT),
                       CAST({nbytes('output_sizes', 'output_dtypes')} AS BIGINT),
                       to_json(struct_pack(input_sizes := input_sizes, input_dtypes := input_dtypes,
                                           output_sizes := output_sizes, output_dtypes := output_dtypes)),
                       thread_name,
                       CASE WHEN len(frames) > 0 THEN frames[1].name || ' at ' || frames[1].filename || ':'
                            || frames[1].line END
                FROM _fr_arrow""", [job, r])
            for row in pgs:
                con.execute("INSERT INTO fr_pgs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [job, r, *row])
            con.execute("""INSERT INTO fr_dumps (job, rank, path, sha256, format, version, comm_lib_version, n_entries)
                           VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
                        [job, r, str(path.resolve()), digest, fmt, version, str(lib) if lib else None, tbl.num_rows])
            con.execute("INSERT INTO jobs (job) VALUES (?) ON CONFLICT (job) DO NOTHING", [job])
            con.execute("COMMIT")
        except BaseException as e:
            abort(con, e, "this file's rows")
            raise
    finally:
        con.unregister("_fr_arrow")
    return LoadResult(str(path), job, r, "stored", f"{fmt} v{version}",
                      {"fr_entries": tbl.num_rows, "fr_pgs": len(pgs)})


LOADER = Loader(name="flight_recorder", suffixes=(".pkl", ".pickle", ".json"), claims=sniff, load=load,
                description="PyTorch Flight Recorder dumps (pickle via a class-refusing unpickler, or JSON)")
