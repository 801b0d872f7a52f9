"""How the web app and the report reach the DuckDB store.

DuckDB locking shapes this module. A process that holds a read-write connection excludes every other process,
and within one process a read-only and a read-write connection to the same file cannot coexist (the database
instance is shared and its configuration must match). So:

* reads use short-lived ``read_only=True`` connections, opened per request and closed at once, never held
  between requests — an external ``ninefold ingest`` can take the file between two page loads;
* the server process has a single background writer thread (``dashboards.uploads.Writer``) that opens a
  read-write connection only for the duration of one upload's ingest + attribute, under ``GATE`` held
  exclusively; a read in the same process waits on ``GATE`` (shared) instead of failing;
* a read that meets another process's write lock retries for a while and then raises ``StoreBusy``.

Results of the named queries are cached per (query, arguments) and dropped whenever the writer commits
(``generation`` changes), so a page reload after an upload sees the new rows.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path

import duckdb

from store.errors import NinefoldError


class StoreBusy(NinefoldError):
    """The store is locked by another process for longer than a read is willing to wait."""


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
    def read(self):
        with self._cond:
            while self._writer or self._waiting_writers:
                self._cond.wait()
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


@contextmanager
def read_connection(db_path, wait_s: float = 20.0):
    """A read-only connection for one request; waits for this process's writer and retries another's lock."""
    p = Path(db_path)
    if not p.exists():
        raise StoreMissing(f"{p}: no such DuckDB store (run ninefold ingest first)")
    with GATE.read():
        deadline = time.monotonic() + wait_s
        delay = 0.05
        while True:
            try:
                con = duckdb.connect(str(p), read_only=True)
                break
            except duckdb.Error as e:
                if not _is_lock_error(e) or time.monotonic() > deadline:
                    if _is_lock_error(e):
                        raise StoreBusy(f"{p}: locked by another process for over {wait_s:.0f}s ({e})") from e
                    raise NinefoldError(f"{p}: cannot open the store read-only: {e}") from e
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        try:
            con.execute("SET enable_progress_bar = false")
            yield con
        finally:
            con.close()


_CACHE: dict = {}
_CACHE_MAX = 256


def cached(db_path, fn, *args, **kwargs):
    """fn(con, *args, **kwargs) through a short read connection, memoised until the next write."""
    key = (str(Path(db_path).resolve()), getattr(fn, "__module__", ""), fn.__qualname__, args,
           tuple(sorted(kwargs.items())), _generation)
    if key in _CACHE:
        return _CACHE[key]
    with read_connection(db_path) as con:
        v = fn(con, *args, **kwargs)
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = v
    return v
