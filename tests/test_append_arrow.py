"""ninefold.store.connection.append_arrow: rows appended in the table's column order, the job filled in on every row, and
nothing kept alive inside the transaction (a registered Arrow table is held by DuckDB until the commit, which held
every group's intervals of a large attribution in memory at once)."""
import gc
import weakref

import numpy as np
import pyarrow as pa

from ninefold.store.connection import append_arrow, connect


def test_rows_and_job_land_in_order(tmp_path):
    con = connect(tmp_path / "a.duckdb")
    con.execute("CREATE TABLE t (job VARCHAR, a BIGINT, b INTEGER)")
    append_arrow(con, "t", pa.table({"a": np.arange(3), "b": np.arange(3, dtype=np.int32) * 10}), "it's a job")
    append_arrow(con, "t", pa.table({"job": ["x"], "a": [7], "b": [8]}))
    assert con.execute("SELECT * FROM t ORDER BY a").fetchall() == [
        ("it's a job", 0, 0), ("it's a job", 1, 10), ("it's a job", 2, 20), ("x", 7, 8)]


def _held_after_append(con, via_register: bool) -> bool:
    a = np.arange(100_000)
    ref = weakref.ref(a)
    tbl = pa.table({"a": a})  # zero-copy: the table keeps the numpy array alive
    if via_register:
        con.register("_r", tbl)
        con.execute("INSERT INTO t SELECT * FROM _r")
        con.unregister("_r")
    else:
        append_arrow(con, "t", tbl)
    del a, tbl
    gc.collect()
    return ref() is not None


def test_appended_rows_are_not_held_until_the_commit(tmp_path):
    con = connect(tmp_path / "b.duckdb")
    con.execute("CREATE TABLE t (a BIGINT)")
    con.execute("BEGIN TRANSACTION")
    assert _held_after_append(con, via_register=True)  # what the append avoids
    assert not _held_after_append(con, via_register=False)
    con.execute("COMMIT")
    assert con.execute("SELECT count(*) FROM t").fetchall() == [(200_000,)]
