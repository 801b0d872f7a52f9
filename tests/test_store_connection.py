"""ninefold.store.connection: a writing connection appends row groups of ROW_GROUP_ROWS, so a transaction the size of a
rank file's rows is written into the file's blocks at once instead of through the WAL (and again at checkpoint);
the file stays an ordinary DuckDB store."""
import os

import duckdb

from ninefold.store.connection import ROW_GROUP_ROWS, connect


def _append_and_commit(con, n):
    con.execute("SET checkpoint_threshold = '1GB'")     # no checkpoint at COMMIT: what the WAL got stays there
    con.execute("CREATE TABLE t (a BIGINT, s VARCHAR)")
    con.execute("BEGIN")
    con.execute(f"INSERT INTO t SELECT range, 'kernel_' || (range % 97) FROM range({n})")
    con.execute("COMMIT")


def _wal(path):
    w = f"{path}.wal"
    return os.path.getsize(w) if os.path.exists(w) else 0


def test_a_rank_sized_transaction_skips_the_wal(tmp_path):
    n = 6 * ROW_GROUP_ROWS          # fewer rows than one of DuckDB's default row groups (122,880)
    ours, plain = tmp_path / "ours.duckdb", tmp_path / "plain.duckdb"
    con = connect(ours)
    _append_and_commit(con, n)
    ours_wal = _wal(ours)
    row_groups = con.execute("SELECT count(DISTINCT row_group_id), max(count) FROM pragma_storage_info('t')").fetchone()
    con.close()
    pcon = duckdb.connect(str(plain))
    _append_and_commit(pcon, n)
    plain_wal = _wal(plain)
    pcon.close()
    assert plain_wal > n * 8          # DuckDB's default: every row went through the WAL
    assert ours_wal < plain_wal / 10, (ours_wal, plain_wal)
    assert row_groups == (6, ROW_GROUP_ROWS)
    # an ordinary DuckDB file: a plain connection reads what was written, and a store written the default way
    # takes appends from ours
    for p in (ours, plain):
        with duckdb.connect(str(p), read_only=True) as r:
            assert r.execute("SELECT count(*), sum(a), count(DISTINCT s) FROM t").fetchone() == (n, n * (n - 1) // 2, 97)
    con = connect(plain)
    con.execute("INSERT INTO t VALUES (-1, 'x')")
    con.close()
    with duckdb.connect(str(plain), read_only=True) as r:
        assert r.execute("SELECT count(*) FROM t").fetchone()[0] == n + 1


def test_a_store_path_with_a_quote_and_its_spill_folder(tmp_path):
    p = tmp_path / "it's.duckdb"
    con = connect(p)
    assert con.execute("SELECT current_setting('temp_directory')").fetchone()[0] == f"{p}.tmp"   # as DuckDB's own
    con.execute("CREATE TABLE q AS SELECT 1 AS x")
    con.close()
    with duckdb.connect(str(p), read_only=True) as r:
        assert r.execute("SELECT x FROM q").fetchone()[0] == 1
