"""Opening the DuckDB store.

DuckDB lets one process write a file or several read it. A command that meets another process's lock waits
for it with bounded back-off (``WAIT_SECONDS``, the CLI's ``--wait``), saying once that it is waiting, then
fails in one line naming the holder. A write that finds the disk full fails in one line too (``abort``,
ninefold.store.errors.DiskFull), its transaction rolled back; a database that a fatal error invalidated is reopened
(``is_fatal``, ``reopen``).
"""
import re
import sys
import time
from pathlib import Path

import duckdb

from ninefold.store.errors import NinefoldError, disk_full
from ninefold.store.schema import create_all

WAIT_SECONDS = 30.0  # how long a command waits for another process's lock on the store
# Rows per row group of what a writing connection appends. DuckDB writes a transaction's rows straight into the
# file's blocks a whole row group at a time; the rest goes through the WAL at COMMIT and is written again at the
# next checkpoint. A rank file of a few tens of MB holds fewer rows per table than DuckDB's 122,880, so with the
# default nearly all of it took the WAL path twice (16 rank files of 40 MB: COMMIT + CHECKPOINT 3.0 of 9.0 s).
# The size is the connection's, not the file's: a store written with another size reads the same.
ROW_GROUP_ROWS = 16384
STORE = "store"      # the catalog name a writing connection attaches the store as (its default database)


class StoreBusy(NinefoldError):
    """The store is locked by another process beyond the wait."""


def _holder(msg: str) -> str:
    m = re.search(r"held in (.*?) \(PID (\d+)\)", msg)
    return f"{m.group(1)} (PID {m.group(2)})" if m else "another process"


def _open(db, read_only: bool, wait: float | None):
    wait = WAIT_SECONDS if wait is None else wait
    deadline = time.monotonic() + wait
    delay, told = 0.05, False
    while True:
        try:
            if read_only:
                return duckdb.connect(str(db), read_only=True)
            # spill files beside the store, where DuckDB puts them for a file it opens itself (else ./.tmp)
            con = duckdb.connect(config={"temp_directory": f"{db}.tmp"})
            try:
                path = str(db).replace("'", "''")
                con.execute(f"ATTACH '{path}' AS {STORE} (ROW_GROUP_SIZE {ROW_GROUP_ROWS})")
                con.execute(f"USE {STORE}")
            except BaseException:
                con.close()
                raise
            return con
        except duckdb.IOException as e:
            msg = str(e)
            if "lock" not in msg.lower():
                full = disk_full(e, db, "the store")
                if full is not None:
                    raise full from None
                raise
            if time.monotonic() >= deadline:
                raise StoreBusy(f"{db}: locked by {_holder(msg)}; gave up after {wait:g} s "
                                "(--wait SECONDS to wait longer)") from None
            if not told:
                print(f"waiting for {db}: locked by {_holder(msg)} (up to {wait:g} s)", file=sys.stderr)
                told = True
            time.sleep(min(delay, max(deadline - time.monotonic(), 0.01)))
            delay = min(delay * 2, 1.0)


def connect(db: str | Path, read_only: bool = False, wait: float | None = None) -> duckdb.DuckDBPyConnection:
    # no progress bar: it writes to stdout, which the CLI's output owns
    con = _open(db, read_only, wait)
    con.execute("SET enable_progress_bar = false")
    if not read_only:
        try:
            create_all(con)
        except duckdb.Error as e:
            con.close()
            full = disk_full(e, db, "the store's tables")
            if full is not None:
                raise full from None
            raise
    return con



def db_path(con) -> str | None:
    """The file behind CON's default database (None for an in-memory one)."""
    return con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()[0]


def is_fatal(e: BaseException) -> bool:
    """Whether E left its DuckDB database invalidated: every later statement on it fails until it is reopened
    (a FATAL or INTERNAL error)."""
    return (isinstance(e, (duckdb.FatalException, duckdb.InternalException))
            or "database has been invalidated" in str(e))


def reopen(con, db) -> duckdb.DuckDBPyConnection:
    """A fresh writing connection to DB in place of CON, whose database a fatal error invalidated. What was
    committed before is in the file (and its WAL); the failed transaction never was."""
    try:
        con.close()
    except duckdb.Error:
        pass
    return connect(db)


def rollback(con) -> None:
    """Roll back CON's transaction. A COMMIT that failed (a full disk) has already ended it, and a database a
    fatal error invalidated refuses every statement: neither hides the error that got here."""
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass


def abort(con, e: BaseException, what: str) -> None:
    """Roll back CON's transaction after E. A write that found the disk full raises one DiskFull instead, naming
    the disk and WHAT was being written; the store keeps what it held before the transaction."""
    rollback(con)
    full = disk_full(e, _path_or_none(con), what)
    if full is not None:
        raise full from None


def _path_or_none(con) -> str | None:
    try:
        return db_path(con)
    except duckdb.Error:
        return None


def append_arrow(con, table: str, rows, job: str | None = None) -> None:
    """Append the rows of ROWS (an Arrow table with TABLE's columns in its order, or all but a first `job` column
    when JOB is given: that column is then JOB on every row) to TABLE. Not through con.register: inside a
    transaction DuckDB keeps every registered object alive until the commit, so a transaction of many appends
    would hold all of them in memory."""
    import numpy as np
    import pyarrow as pa

    from ninefold.store.arrays import from_numpy, strings

    if job is not None:
        codes = from_numpy(np.zeros(rows.num_rows, np.int8))
        rows = rows.add_column(0, "job", pa.DictionaryArray.from_arrays(codes, strings([job])))
    con.from_arrow(rows).insert_into(table)


def has_table(con, name: str) -> bool:
    """The store (or the connection's temporary schema) has a table or view NAME: tables of later stages are
    missing until those stages have run."""
    return con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?",
                       [name]).fetchall()[0][0] > 0
