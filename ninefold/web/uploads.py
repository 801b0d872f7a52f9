"""Uploaded trace files: stored content-addressed, recorded in a manifest, ingested by one background writer.

Layout beside the store::

    <db dir>/uploads/<sha256>/<name>      the file, written once (a second upload of the same bytes is a no-op)
    <db dir>/uploads/manifest.jsonl       one line per event {sha256, name, job, status, message, ...}
    <db dir>/uploads/.partial/            chunks of uploads still arriving

The manifest is appended (and fsynced) the moment a file is complete, before any ingest starts, so a page reload
or a server restart never loses a finished upload; on start the writer re-queues every upload whose last status
is not final. Status: queued → ingesting → attributing → attributed | unchanged | failed. The writer mirrors each
status into the store's ``uploads`` table, which the jobs query reads (failed uploads show as failed jobs).

A failed upload's bytes are removed (its manifest lines stay: name, size, sha256 and why it failed), and its
message says what the person at the browser can do, not which CLI flag to pass. Everything under ``uploads/``
together (stored files and uploads still arriving) is capped by ``max_total_bytes``; an upload that would pass
it is refused with a message saying so.

The writer is the only code in the server process that opens the store read-write; see ``data_store`` for the
locking design.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import queue
import re
import threading
import time
import traceback
from pathlib import Path

from ninefold.web.data_store import GATE, bump_generation
from ninefold.store.errors import NinefoldError

UPLOAD_SUFFIXES = (".json", ".json.gz", ".sqlite", ".log", ".txt", ".nsys-rep.sqlite")
FINAL = ("attributed", "unchanged", "failed")
UPLOADS_DDL = """job VARCHAR, sha256 VARCHAR, name VARCHAR, path VARCHAR, bytes BIGINT, status VARCHAR,
                 message VARCHAR, updated_at TIMESTAMP"""
_NAME_OK = re.compile(r"[^A-Za-z0-9._+-]+")
PARTIAL_FACTOR = 4  # .partial/ holds at most this many maximum-size uploads at once


NAME_MAX = 200
DEFAULT_MAX_TOTAL = 50 << 30   # everything under uploads/ together


def safe_name(name: str) -> str:
    """The base name of an uploaded file with anything odd replaced (no paths, no leading dots); a name over
    NAME_MAX characters keeps its suffix (what says which reader takes it) and loses the end of its stem."""
    base = Path(str(name).replace("\\", "/")).name
    base = _NAME_OK.sub("_", base).lstrip(".") or "upload"
    if len(base) <= NAME_MAX:
        return base
    low = base.lower()
    suffix = next((x for x in sorted(UPLOAD_SUFFIXES, key=len, reverse=True) if low.endswith(x)),
                  Path(base).suffix[:16])
    return base[:NAME_MAX - len(suffix)] + base[len(base) - len(suffix):]


# what a CLI flag in an ingest error asks for, said for the person uploading in the browser
_CLI_ADVICE = [
    (re.compile(r"\s*\(?\b(?:use|pass) --salvage\b[^);]*\)?"),
     " (upload the complete file again; a file cut short can be kept up to its last complete event only from a "
     "shell, with ninefold ingest --salvage)"),
    (re.compile(r"\s*;?\s*\b(?:use|pass) --replace\b[^);]*"),
     "; upload it under another job name, or ask the server's operator to replace it (ninefold ingest "
     "--replace)"),
]


def web_advice(message: str) -> str:
    """An ingest error with its CLI advice (--salvage, --replace) turned into what a web user can do."""
    for pat, said in _CLI_ADVICE:
        message = pat.sub(said, message, count=1)
    return message


def safe_job(job: str) -> str:
    j = _NAME_OK.sub("_", (job or "").strip()).strip("._")
    if not j:
        raise NinefoldError("a job name is needed for an upload (letters, digits, . _ + -)")
    return j[:100]


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None).isoformat(timespec="milliseconds")


class UploadStore:
    def __init__(self, db_path, max_bytes: int = 2 << 30, max_total_bytes: int = DEFAULT_MAX_TOTAL):
        self.db_path = Path(db_path)
        self.root = self.db_path.resolve().parent / "uploads"
        self.partial = self.root / ".partial"
        self.manifest = self.root / "manifest.jsonl"
        self.max_bytes = int(max_bytes)
        # all uploads still arriving together: abandoned ones cannot fill the disk
        self.max_partial_bytes = PARTIAL_FACTOR * self.max_bytes
        self.max_total_bytes = int(max_total_bytes)
        self.partial_bytes = 0
        self._lock = threading.Lock()
        self.partial.mkdir(parents=True, exist_ok=True)
        self.sweep_partials()
        self.stored_bytes = self._stored_on_disk()

    def _stored_on_disk(self) -> int:
        """Bytes of the stored uploads (uploads/<sha256>/<name>), as found on disk."""
        return sum(f.stat().st_size for d in self.root.iterdir() if d.is_dir() and d != self.partial
                   for f in d.iterdir() if f.is_file())

    def sweep_partials(self) -> int:
        """Remove partial uploads of processes that no longer run (a killed or restarted server)."""
        n = 0
        for f in self.partial.iterdir():
            pid = f.name.split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid():
                try:
                    os.kill(int(pid), 0)
                    continue
                except ProcessLookupError:
                    pass
                except PermissionError:
                    continue
            elif pid.isdigit():
                continue  # this process's own, still arriving
            f.unlink(missing_ok=True)
            n += 1
        return n

    def _account(self, delta: int) -> None:
        with self._lock:
            if delta > 0 and self.partial_bytes + delta > self.max_partial_bytes:
                raise NinefoldError(f"uploads in progress already hold {self.partial_bytes} bytes (limit "
                                    f"{self.max_partial_bytes}); try again when they finish")
            if delta > 0 and self.stored_bytes + self.partial_bytes + delta > self.max_total_bytes:
                raise NinefoldError(f"the uploads folder is full: it holds {self.stored_bytes} bytes of stored "
                                    f"uploads and {self.partial_bytes} arriving, and this server keeps at most "
                                    f"{self.max_total_bytes} (serve --max-uploads-total-bytes); ask its operator "
                                    f"to remove old uploads from {self.root}")
            self.partial_bytes = max(self.partial_bytes + delta, 0)

    def _stored(self, delta: int) -> None:
        with self._lock:
            self.stored_bytes = max(self.stored_bytes + delta, 0)

    def discard(self, entry: dict) -> bool:
        """Remove a failed upload's stored bytes unless another job's upload of the same bytes still uses
        them; its manifest lines stay. True when the file was removed."""
        sha = entry.get("sha256")
        if any(e.get("sha256") == sha and e.get("job") != entry.get("job") and e.get("status") != "failed"
               for e in self.entries()):
            return False
        f = self.path_for(sha, entry["name"])
        try:
            size = f.stat().st_size
            f.unlink()
        except FileNotFoundError:
            return False
        self._stored(-size)
        try:
            f.parent.rmdir()
        except OSError:  # another name of the same bytes is still there
            pass
        return True

    # -------------------------------------------------------------- manifest
    def record(self, **entry) -> dict:
        entry.setdefault("ts", _now())
        line = json.dumps(entry, sort_keys=True)
        with self._lock, open(self.manifest, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        return entry

    def entries(self) -> list[dict]:
        """Latest state of every upload (by sha256 and job), oldest first."""
        if not self.manifest.exists():
            return []
        latest: dict = {}
        with self._lock, open(self.manifest, encoding="utf-8") as fh:
            for line in fh:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue  # a torn last line after a crash
                key = (e.get("sha256"), e.get("job"))
                if key in latest:
                    merged = dict(latest[key])
                    merged.update(e)
                    merged["first_ts"] = latest[key].get("first_ts", latest[key].get("ts"))
                    latest[key] = merged
                else:
                    e["first_ts"] = e.get("ts")
                    latest[key] = e
        return sorted(latest.values(), key=lambda e: e.get("first_ts") or "")

    # -------------------------------------------------------------- files
    def path_for(self, sha: str, name: str) -> Path:
        return self.root / sha / safe_name(name)

    def store_bytes(self, name: str, data: bytes, job: str) -> dict:
        """Store a complete file given as bytes; returns its manifest entry."""
        w = ChunkWriter(self, name, job)
        w.write(data)
        return w.finish()

    def check_name(self, name: str) -> None:
        if not safe_name(name).lower().endswith(UPLOAD_SUFFIXES):
            raise NinefoldError(f"{name}: not a trace file this server takes ("
                                + ", ".join(UPLOAD_SUFFIXES[:4]) + ")")


class ChunkWriter:
    """One upload arriving in chunks: streamed to .partial/ with a running sha256, then moved into place."""

    def __init__(self, store: UploadStore, name: str, job: str):
        store.check_name(name)
        self.store = store
        self.name = safe_name(name)
        self.job = safe_job(job)
        self.h = hashlib.sha256()
        self.size = 0
        self.tmp = store.partial / f"{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}-{self.name}"
        self.fh = open(self.tmp, "wb")

    def write(self, data: bytes) -> None:
        if self.size + len(data) > self.store.max_bytes:
            self.abort()
            raise NinefoldError(f"{self.name}: larger than this server's upload limit of "
                                f"{self.store.max_bytes} bytes")
        try:
            self.store._account(len(data))
        except NinefoldError:
            self.abort()
            raise
        self.size += len(data)
        self.h.update(data)
        self.fh.write(data)

    def _release(self) -> None:
        if not getattr(self, "_released", False):
            self._released = True
            self.store._account(-self.size)

    def abort(self) -> None:
        try:
            self.fh.close()
        finally:
            self.tmp.unlink(missing_ok=True)
            self._release()

    def finish(self) -> dict:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        self._release()
        sha = self.h.hexdigest()
        dest = self.store.path_for(sha, self.name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            self.tmp.unlink(missing_ok=True)  # same bytes already stored
        else:
            os.replace(self.tmp, dest)
            self.store._stored(self.size)
        return self.store.record(sha256=sha, name=self.name, job=self.job, path=str(dest), bytes=self.size,
                                 status="queued", message="")


RETRY_BASE_S = 1.0
RETRY_MAX_S = 60.0


def _transient(exc: BaseException) -> bool:
    """Errors that are not the file's fault: another process's lock on the store, a full disk."""
    import errno

    import duckdb

    from ninefold.store.connection import StoreBusy

    if isinstance(exc, StoreBusy):
        return True
    if isinstance(exc, duckdb.IOException) and "lock" in str(exc).lower():
        return True
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return "No space left on device" in str(exc)


class Writer:
    """The single background writer of the server process: ingest + attribute one upload at a time."""

    def __init__(self, store: UploadStore, on_change=None):
        self.store = store
        self.q: queue.Queue = queue.Queue()
        self.on_change = on_change
        self.current: dict | None = None
        self._thread = threading.Thread(target=self._run, name="ninefold-writer", daemon=True)
        self._stop = threading.Event()
        self._retries: dict = {}
        self._pending = 0  # uploads waiting out a back-off

    def start(self, requeue: bool = True) -> "Writer":
        if requeue:
            for e in self.store.entries():
                if e.get("status") not in FINAL and e.get("path") and Path(e["path"]).exists():
                    self.q.put(e)
        self._thread.start()
        return self

    def submit(self, entry: dict) -> None:
        self.q.put(entry)

    def stop(self) -> None:
        self._stop.set()
        self.q.put(None)

    def idle(self) -> bool:
        return self.q.empty() and self.current is None and self._pending == 0

    def _done_waiting(self) -> None:
        self._pending -= 1

    def _status(self, con, e: dict, status: str, message: str = "") -> None:
        if status == "failed":
            message = web_advice(message)
        e = dict(e, status=status, message=message)
        self.store.record(sha256=e["sha256"], name=e["name"], job=e["job"], path=e["path"],
                          bytes=e.get("bytes"), status=status, message=message)
        if con is not None:
            con.execute("DELETE FROM uploads WHERE sha256 = ? AND job = ?", [e["sha256"], e["job"]])
            con.execute("INSERT INTO uploads VALUES (?, ?, ?, ?, ?, ?, ?, now()::TIMESTAMP)",
                        [e["job"], e["sha256"], e["name"], e["path"], e.get("bytes"), status, message])
        if status == "failed":
            self.store.discard(e)
        if self.on_change:
            self.on_change(e)

    def _run(self) -> None:
        while not self._stop.is_set():
            e = self.q.get()
            if e is None:
                break
            self.current = e
            try:
                self._process(e)
            except Exception as exc:  # never let the writer die; the upload shows the error
                try:
                    if _transient(exc):
                        # the store locked by another process, or the disk full: not the file's fault. Retry with
                        # back-off; the status is not final, so a restart resumes it too
                        key = (e["sha256"], e["job"])
                        n = self._retries[key] = self._retries.get(key, 0) + 1
                        delay = min(RETRY_BASE_S * 2 ** (n - 1), RETRY_MAX_S)
                        self._status(None, e, "waiting", f"retry {n} in {delay:g} s: {str(exc).splitlines()[0]}")
                        self._pending += 1

                        def again(e=e):
                            self.q.put(e)
                            self._done_waiting()
                        t = threading.Timer(delay, again)
                        t.daemon = True
                        t.start()
                    else:
                        self._status(None, e, "failed", f"{type(exc).__name__}: {exc}")
                except Exception:
                    traceback.print_exc()
            finally:
                self.current = None
                bump_generation()

    def _process(self, e: dict) -> None:
        from ninefold.analysis.attribution.attribute import attribute_job
        from ninefold.ingest.load import ingest_paths
        from ninefold.store.connection import connect

        with GATE.write():
            con = connect(self.store.db_path)
            try:
                con.execute(f"CREATE TABLE IF NOT EXISTS uploads ({UPLOADS_DDL})")
                self._status(con, e, "ingesting")
                try:
                    results = ingest_paths(con, [e["path"]], job=e["job"])
                except NinefoldError as err:
                    self._status(con, e, "failed", str(err))
                    return
                failed = [r for r in results if r.status == "failed"]
                if failed:
                    self._status(con, e, "failed", "; ".join(r.message for r in failed))
                    return
                if all(r.status == "unchanged" for r in results):
                    self._status(con, e, "unchanged", "already stored (same sha256)")
                    return
                self._status(con, e, "attributing")
                r = attribute_job(con, e["job"])
                ranks = sorted({x.rank for x in results if x.rank is not None})
                verdict = ""
                if len(ranks) == 1 and con.execute("SELECT 1 FROM traces WHERE job = ? AND rank = ?",
                                                   [e["job"], ranks[0]]).fetchone():
                    from ninefold.analysis.inspect import verdict_line

                    verdict = " | this trace supports: " + verdict_line(con, e["job"], ranks[0])
                self._status(con, e, "attributed", f"rank {', '.join(map(str, ranks))}: "
                                                   f"{r['intervals']} ledger intervals{verdict}")
            finally:
                con.close()
