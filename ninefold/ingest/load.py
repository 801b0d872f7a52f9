"""Ingest's writer: one trace file → one transaction over the canonical tables."""
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

from ninefold.ingest.kineto import bind_events, drop_events, read_events, rank_from_meta_or_name, sniff_kineto
from ninefold.ingest.kineto_tables import insert_tables
from ninefold.ingest.common import nested_too_deep
from ninefold.ingest.registry import loader_for
from ninefold.store.connection import abort
from ninefold.store.errors import DiskFull, IngestConflict, NinefoldError, TraceFormatError, disk_full

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
    a JSON object with no traceEvents, whatever its size (a big one: the key's bytes appear nowhere in it), or
    one nested deeper than the parser goes (the reason then says so). None for anything else, broken files
    included: those are ingested and fail with their own clear error."""
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
    except RecursionError:      # an object with no traceEvents, nested deeper than the parser goes
        return nested_too_deep() if head.lstrip().startswith(b"{") else None
    return why if isinstance(doc, dict) else None


def discover(paths: list[str | Path], skipped: list | None = None) -> list[tuple[Path, str]]:
    """(file, default job name) for every trace file named or inside a named directory.

    Side JSON files of a scanned directory are left out; with SKIPPED, (file, job, reason) are added to it."""
    out: list[tuple[Path, str]] = []
    for p in map(Path, paths):
        if p.is_dir():
            from ninefold.ingest.registry import all_suffixes
            suffixes = all_suffixes()
            files = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(suffixes))
            side = {f: side_json_reason(f) for f in files}
            if skipped is not None:
                skipped.extend((f, p.resolve().name, why) for f, why in side.items() if why)
            files = [f for f in files if not side[f]]
            if not files:
                from ninefold.ingest.nsys_read import REPORT_SUFFIXES
                readable = [x for x in suffixes if x not in REPORT_SUFFIXES]   # claimed only to say: export it
                raise TraceFormatError(p, None, "directory holds no trace files ("
                                       + ", ".join("*" + x for x in readable) + "; an Nsight Systems .nsys-rep "
                                       "is read once exported: nsys export --type sqlite REPORT.nsys-rep)")
            out.extend((f, p.resolve().name) for f in files)
        elif p.exists():
            out.append((p, p.resolve().parent.name))
        else:
            raise TraceFormatError(p, None, "no such file or directory")
    return out


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
    cur = con.cursor()   # its default database is the in-memory one: it names every table it writes
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
        # outside DuckDB (ninefold.ingest.depths); on the 545 MB bench file 0.9x and 1.1x take the same time (peak RSS
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
            counts = insert_tables(con, path, job, rank, meta, km, digest)
            t1 = time.perf_counter()
            con.execute("COMMIT")
            stage("build", t1 - t)
            stage("write", time.perf_counter() - t1)
        except BaseException as e:
            abort(con, e, "this file's rows")
            raise
        msg = "salvaged (file was truncated)" if km.salvaged else ""
        return LoadResult(str(path), job, rank, "stored", msg, counts)
    finally:
        drop_events(con, table)
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


def _resource_error(con, path, e) -> str:
    first = " ".join(str(e).split("\n")[0].split())[:200]
    if isinstance(e, duckdb.OutOfMemoryException):
        try:
            limit = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
        except duckdb.Error:
            limit = "?"
        return f"{path}: out of memory while ingesting ({first}); DuckDB's memory_limit is {limit}"
    if isinstance(e, duckdb.IOException):
        return f"{path}: I/O error while ingesting ({first})"
    return f"{path}: DuckDB refused it ({type(e).__name__}: {first}); nothing of it was stored"


def default_jobs() -> int:
    """Files parsed side by side by default: the core count, at most 4 (each parse already uses every core
    DuckDB has; more in flight only holds more parsed files in memory)."""
    return max(1, min(4, os.cpu_count() or 1))


# DuckDB errors that a file's content or the machine causes: the file fails in one line, the others still load
FILE_DUCKDB_ERRORS = (duckdb.OutOfMemoryException, duckdb.IOException, duckdb.InvalidInputException, duckdb.DataError,
                      duckdb.ConstraintException, duckdb.TransactionException)


def _fatal_error(path, e) -> str:
    first = " ".join(str(e).split("\n")[0].split())[:200]
    return (f"{path}: DuckDB failed fatally on this file ({first}); nothing of it was stored and the store was "
            "reopened for the other files")


class _Ahead:
    """Small Kineto files hashed and parsed JOBS at a time on cursors of their own (all cores) while the caller
    writes the previous one; each file is still its own transaction, in order."""

    def __init__(self, con, files, small, jobs, salvage):
        from concurrent.futures import ThreadPoolExecutor

        self.con, self.files, self.small, self.jobs, self.salvage = con, files, small, jobs, salvage
        self.futures: dict = {}
        con.execute(f"ATTACH IF NOT EXISTS ':memory:' AS {SCRATCH}")
        self.pool = ThreadPoolExecutor(max_workers=jobs)

    def submit_from(self, i):
        for k in range(i, min(i + self.jobs + 1, len(self.files))):
            if self.small[k] and k not in self.futures:
                self.futures[k] = self.pool.submit(prepare_kineto, self.con, self.files[k][0], self.salvage, k)

    def take(self, i) -> Prepared | None:
        return self.futures.pop(i).result() if i in self.futures else None

    def close(self, alive: bool = True):
        """Wait for the parses in flight and drop what they left (ALIVE: the connection can still be used)."""
        self.pool.shutdown(wait=True)
        for fut in self.futures.values():
            prep = fut.result()
            if alive:
                _discard(self.con, prep)
            elif prep.km is not None:
                prep.km.cleanup()
        self.futures.clear()
        if alive:
            self.con.execute(f"DETACH DATABASE IF EXISTS {SCRATCH}")


def _load_one(con, f, ld, j, rank, replace, salvage, prep):
    """One file's LoadResult(s); a failure of the file or of the machine is a failed result, one line. A fatal
    DuckDB error (the database invalidated) is raised: the caller reopens the store."""
    from ninefold.store.connection import is_fatal

    try:
        if ld is not None:
            return ld.load(con, f, j, rank=rank, replace=replace, salvage=salvage)
        return load_kineto(con, f, j, rank=rank, replace=replace, salvage=salvage, prepared=prep)
    except DiskFull as e:
        return LoadResult(str(f), j, rank, "failed", f"{f}: {e}; nothing of it was stored")
    except NinefoldError as e:
        return LoadResult(str(f), j, rank, "failed", str(e))
    except RecursionError:
        return LoadResult(str(f), j, rank, "failed", f"{f}: {nested_too_deep()}")
    except (duckdb.Error, OSError) as e:
        if is_fatal(e):
            raise
        # the machine (a full disk, no memory) or content DuckDB refuses: this file fails in one line (its
        # transaction rolled back), the others still load
        full = disk_full(e, None, "this file's rows or work files")
        if full is not None:
            return LoadResult(str(f), j, rank, "failed", f"{f}: {full}; nothing of it was stored")
        if not isinstance(e, FILE_DUCKDB_ERRORS):
            raise           # not the file's doing (a query of ours that is wrong): a traceback, to be fixed
        return LoadResult(str(f), j, rank, "failed", _resource_error(con, f, e))


def ingest_paths(con, paths, job=None, rank=None, replace=False, salvage=False, on_result=None,
                 jobs: int | None = None) -> list[LoadResult]:
    """Ingest every file; a failing file is reported and does not stop the others.

    jobs: small Kineto files parsed ahead side by side while the previous one is written (default
    default_jobs(); 1 parses each file in turn). Each file is still its own transaction, in order.
    A file on which DuckDB fails fatally (its database invalidated) fails in one line; the store is reopened
    (CON is then dead: the reopened connection is closed on return) and the other files still load."""
    from ninefold.store.connection import db_path, is_fatal, reopen

    jobs = default_jobs() if jobs is None else int(jobs)
    if jobs < 1:
        raise NinefoldError(f"--jobs must be at least 1, not {jobs}")
    results = []

    def report(r):
        for one in (r if isinstance(r, list) else [r]):
            results.append(one)
            if on_result:
                on_result(one)

    side: list = []
    files = discover(paths, skipped=side)
    for f, j, why in side:
        report(LoadResult(str(f), job or j, rank, "skipped", f"{f}: {why}"))
    loaders = [loader_for(f) for f, _ in files]
    small = [ld is None and f.exists() and f.stat().st_size <= PREFETCH_MAX_BYTES for (f, _), ld in zip(files, loaders)]
    db = db_path(con)
    own = None          # the connection reopened after a fatal error, closed on return
    ahead = None
    # Several files: DuckDB checkpoints after every commit whose WAL passes checkpoint_threshold (16 MiB), which
    # for a rank file each time rewrites what the last one wrote; let the WAL grow to RUN_CHECKPOINT_THRESHOLD
    # over the run (every commit is still durable in it) and checkpoint at the end.
    threshold = None
    if len(files) > 1:
        threshold = con.execute("SELECT current_setting('checkpoint_threshold')").fetchone()[0]
        con.execute(f"SET checkpoint_threshold = '{RUN_CHECKPOINT_THRESHOLD}'")
    if sum(small) > 1 and jobs > 1:
        ahead = _Ahead(con, files, small, jobs, salvage)
    try:
        for i, ((f, default_job), ld) in enumerate(zip(files, loaders)):
            j = job or default_job
            if con is None:     # an in-memory database that a fatal error took with it
                report(LoadResult(str(f), j, rank, "failed", f"{f}: not attempted: the in-memory database was "
                                  "invalidated by a fatal DuckDB error on an earlier file"))
                continue
            try:
                if ahead is not None:
                    ahead.submit_from(i)
                r = _load_one(con, f, ld, j, rank, replace, salvage, ahead.take(i) if ahead else None)
            except duckdb.Error as e:
                if not is_fatal(e):
                    raise
                r = LoadResult(str(f), j, rank, "failed", _fatal_error(f, e))
                if ahead is not None:
                    ahead.close(alive=False)
                    ahead = None
                con = own = reopen(con, db) if db else None
                if con is not None and threshold is not None:
                    con.execute(f"SET checkpoint_threshold = '{RUN_CHECKPOINT_THRESHOLD}'")
            report(r)
    finally:
        if ahead is not None:
            ahead.close()
        if threshold is not None and con is not None:
            con.execute(f"SET checkpoint_threshold = '{threshold}'")
            t = time.perf_counter()
            try:
                con.execute("CHECKPOINT")
            except duckdb.Error:
                pass    # another transaction is open: the WAL holds every commit, a later checkpoint folds it in
            stage("write", time.perf_counter() - t)
        if own is not None:
            own.close()
    return results
