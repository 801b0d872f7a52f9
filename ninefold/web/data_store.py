"""How the web app and the report reach the DuckDB store.

DuckDB locking shapes this module. A process that holds a read-write connection excludes every other process,
and within one process a read-only and a read-write connection to the same file cannot coexist (the database
instance is shared and its configuration must match). So:

* reads use short-lived ``read_only=True`` connections, opened per request and closed at once, never held
  between requests — an external ``ninefold ingest`` can take the file between two page loads;
* the server process has a single background writer thread (``ninefold.web.uploads.Writer``) that opens a
  read-write connection only for the duration of one upload's ingest + attribute, under ``GATE`` held
  exclusively;
* a read that meets the lock (this process's writer or another process) either retries for ``wait_s`` seconds
  (``ninefold report``) or, with ``wait_s=0`` (the web app, whose callbacks run on the server's event loop),
  raises ``StoreBusy`` at once, naming the holder; the app shows that the store is busy and tries again on its
  next tick, so a locked store never holds up another request.

Results of the named queries are cached per (query, arguments) and dropped whenever the generation changes:
when this server's writer commits (``bump_generation``) and when another process has written the store, seen
by ``notice_external_writes`` as a change of the store file's or its WAL's (mtime, size), checked at most once
a second. A page load after a ``ninefold ingest`` from a shell sees the new rows.
"""
from __future__ import annotations

import os
import re
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import duckdb

from ninefold.store.errors import NinefoldError


class StoreBusy(NinefoldError):
    """The store is locked (by another process, or by this server's writer) for longer than a read waits.

    ``holder`` says who holds it, e.g. "ingest by PID 4242"."""

    def __init__(self, message: str, holder: str = "another process"):
        super().__init__(message)
        self.holder = holder


class StoreMissing(NinefoldError):
    pass


class RWGate:
    """Many readers or one writer (writer preferred, so a queued upload is not starved by page loads)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0

    @contextmanager
    def read(self, timeout: float | None = None):
        """Shared access; with TIMEOUT (seconds), StoreBusy when a writer holds or awaits the gate that long."""
        with self._cond:
            if not self._cond.wait_for(lambda: not (self._writer or self._waiting_writers), timeout):
                raise StoreBusy("the store is being written by this server (an upload being ingested)",
                                "an upload being ingested here")
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def write(self):
        with self._cond:
            self._waiting_writers += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting_writers -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


GATE = RWGate()
_generation = 0
_gen_lock = threading.Lock()


def generation() -> int:
    return _generation


def bump_generation() -> None:
    global _generation
    with _gen_lock:
        _generation += 1
    _CACHE.clear()


def _is_lock_error(e: Exception) -> bool:
    s = str(e).lower()
    return "lock" in s or "conflicting" in s or "different configuration" in s


_GLOBAL_WITH_VALUE = ("--wait", "--max-decompressed-bytes")   # ninefold's options before the command


def _command_of(args: list[str]) -> str | None:
    """The ninefold command a process's ARGS run ('ingest'), None when they are not ninefold's."""
    for i, a in enumerate(args):
        if a == "ninefold.cli.main" or Path(a).name == "ninefold":
            rest = iter(args[i + 1:])
            for x in rest:
                if x in _GLOBAL_WITH_VALUE:
                    next(rest, None)
                elif x and not x.startswith("-"):
                    return x
            return "ninefold"
    return None


def describe_holder(message: str) -> str:
    """Who holds the lock DuckDB's MESSAGE names: 'ingest by PID 4242' for a ninefold command, else the program's
    name by its PID; 'another process' when the message names none."""
    m = re.search(r"held in (.*?) \(PID (\d+)\)", message)
    if not m:
        return "another process"
    pid = m.group(2)
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
    except OSError:
        args = []
    return f"{_command_of(args) or Path(m.group(1)).name} by PID {pid}"


@contextmanager
def read_connection(db_path, wait_s: float = 20.0):
    """A read-only connection for one request; waits up to WAIT_S for this process's writer and another
    process's lock, then raises StoreBusy (WAIT_S = 0: one try, no sleeping — for the server's event loop)."""
    p = Path(db_path)
    if not p.exists():
        raise StoreMissing(f"{p}: no such DuckDB store (run ninefold ingest first)")
    with GATE.read(timeout=wait_s):
        deadline = time.monotonic() + wait_s
        delay = 0.05
        while True:
            try:
                con = duckdb.connect(str(p), read_only=True)
                break
            except duckdb.Error as e:
                if not _is_lock_error(e) or time.monotonic() >= deadline:
                    if _is_lock_error(e):
                        who = describe_holder(str(e))
                        raise StoreBusy(f"{p}: locked by another process ({who})"
                                        + (f" for over {wait_s:g} s" if wait_s else ""), who) from e
                    raise NinefoldError(f"{p}: cannot open the store read-only: {e}") from e
                time.sleep(min(delay, max(deadline - time.monotonic(), 0.01)))
                delay = min(delay * 2, 1.0)
        try:
            con.execute("SET enable_progress_bar = false")
            yield con
        finally:
            con.close()


CHECK_EVERY_S = 1.0
_seen: dict = {}   # resolved store path -> (monotonic time of the last check, its signature then)


def _signature(p: Path) -> tuple:
    out = []
    for f in (p, p.with_name(p.name + ".wal")):
        try:
            st = os.stat(f)
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def notice_external_writes(db_path, every_s: float = CHECK_EVERY_S) -> bool:
    """Bump the generation when the store file or its WAL changed since the last look (another process
    committed); looks at most once every EVERY_S seconds per store. True when it bumped."""
    p = Path(db_path).resolve()
    now = time.monotonic()
    with _gen_lock:
        last = _seen.get(p)
        if last is not None and now - last[0] < every_s:
            return False
        sig = _signature(p)
        _seen[p] = (now, sig)
    if last is not None and sig != last[1]:
        bump_generation()
        return True
    return False


_CACHE: dict = {}
_CACHE_MAX = 256


def cached(db_path, fn, *args, wait_s: float = 20.0, **kwargs):
    """fn(con, *args, **kwargs) through a short read connection (see read_connection for WAIT_S), memoised until
    the generation changes (this server's writer committed, or another process wrote the store)."""
    notice_external_writes(db_path)
    key = (str(Path(db_path).resolve()), getattr(fn, "__module__", ""), fn.__qualname__, args,
           tuple(sorted(kwargs.items())), _generation)
    if key in _CACHE:
        return _CACHE[key]
    with read_connection(db_path, wait_s=wait_s) as con:
        v = fn(con, *args, **kwargs)
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = v
    return v
