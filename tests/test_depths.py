"""ninefold.ingest.depths.sorted_depths against the SQL window it replaced, on drawn intervals full of ties."""
import duckdb
import numpy as np
from hypothesis import given, settings, strategies as st

from ninefold.ingest.depths import sorted_depths


def interval_depths(th, start, end, ord_):
    """sorted_depths of rows in any order: sorted as ingest sorts them, the depths put back in the given order."""
    th, start, end, ord_ = (np.asarray(a, dtype=np.int64) for a in (th, start, end, ord_))
    depth = np.empty(th.size, np.int64)
    by_start = np.lexsort((ord_, -end, start, th))
    depth[by_start] = sorted_depths(th[by_start], start[by_start], end[by_start])
    return depth

WINDOW = """
    WITH pts AS (SELECT ord, th, s AS t, 1 AS d, e FROM iv UNION ALL SELECT NULL, th, e, -1, e FROM iv)
    SELECT iv.th, iv.s, iv.e, run.depth FROM iv JOIN (
        SELECT ord, sum(d) OVER (PARTITION BY th ORDER BY t, d, e DESC ROWS UNBOUNDED PRECEDING) - 1 AS depth
        FROM pts) run ON run.ord = iv.ord
    ORDER BY ALL"""

interval = st.tuples(st.integers(0, 2), st.integers(0, 12), st.integers(0, 5))   # thread, start, length


@settings(max_examples=300, deadline=None)
@given(st.lists(interval, max_size=40))
def test_same_depths_as_the_window(rows):
    th = np.array([r[0] for r in rows], np.int64)
    s = np.array([r[1] for r in rows], np.int64)
    e = s + np.array([r[2] for r in rows], np.int64)
    ord_ = np.arange(len(rows), dtype=np.int64) + 1
    depth = interval_depths(th, s, e, ord_)
    con = duckdb.connect()
    con.execute("CREATE TABLE iv (ord BIGINT, th BIGINT, s BIGINT, e BIGINT)")
    if rows:
        con.executemany("INSERT INTO iv VALUES (?, ?, ?, ?)", 
                        [list(map(int, r)) for r in zip(ord_, th, s, e)])
    want = con.execute(WINDOW).fetchall()
    assert sorted(zip(th.tolist(), s.tolist(), e.tolist(), depth.tolist())) == want


def test_nesting_ties_and_zero_length():
    # outer [0,10) holds [0,5) (same start, shorter: inner) and [5,10); [10,12) starts as the outer ends;
    # a zero-length interval at 3 sits inside both and counts its own end first (depth 1, not 2)
    th = np.zeros(5, np.int64)
    s = np.array([0, 0, 5, 10, 3])
    e = np.array([10, 5, 10, 12, 3])
    assert interval_depths(th, s, e, np.arange(5)).tolist() == [0, 1, 1, 0, 1]
    # identical intervals nest in document order; another thread starts at 0 again
    assert interval_depths([0, 0, 1], [4, 4, 4], [6, 6, 6], [2, 1, 3]).tolist() == [1, 0, 0]
    assert interval_depths([], [], [], []).tolist() == []
