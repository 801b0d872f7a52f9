"""ninefold.analysis.attribution.core.collective_keys gives what the SQL aggregate it replaced gives: one key per (rank, start, kernel)
with the group of the lowest (seq, group) row (missing seq last, rows without a group skipped), the lowest seq and
p2p unless a row of another type says otherwise; drawn with NULLs, ties and rows in any order, and on every
shared trace whose collectives carry process groups."""
import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from ninefold.analysis.attribution.alignment import P2P_COLLS
from ninefold.analysis.attribution.core import collective_keys
from conftest import SHARED_TRACES, needs_shared
from ninefold.ingest.load import ingest_paths, load_kineto

# the aggregate read_group ran before the keys were reduced in one compiled pass
SQL = f"""
    SELECT rank, start_ns, kid, coalesce(arg_min(pgid, [seq, pgid]), -1)::BIGINT AS pgid,
           coalesce(min(seq), -1)::BIGINT AS seq, coalesce(bool_and(lower(coll) IN {P2P_COLLS})::TINYINT, -1) AS p2p
    FROM c GROUP BY ALL ORDER BY rank, start_ns, kid"""


def keys(con):
    """collective_keys over table c of CON, as rows."""
    t = con.sql(f"SELECT rank, start_ns, kid, coalesce(pgid, -1)::BIGINT AS pgid, seq, "
                f"coalesce((lower(coll) IN {P2P_COLLS})::TINYINT, -1)::TINYINT AS p2p FROM c").to_arrow_table()
    seq = t.column("seq")
    out = collective_keys(*(np.asarray(t.column(k).to_numpy(), np.int64) for k in ("rank", "start_ns", "kid", "pgid")),
                          np.asarray(seq.fill_null(0).to_numpy(), np.int64), ~seq.is_null().to_numpy(),
                          t.column("p2p").to_numpy())
    return [tuple(int(v) for v in row) for row in zip(*out)]


row = st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 2), st.none() | st.integers(0, 2),
                st.none() | st.integers(-2, 3), st.sampled_from([None, "send", "RECV", "allreduce", "all_to_all"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(row, max_size=40))
def test_keys_match_the_sql_aggregate(rows):
    con = duckdb.connect()
    con.execute("CREATE TABLE c (rank BIGINT, start_ns BIGINT, kid BIGINT, pgid INTEGER, seq BIGINT, coll VARCHAR)")
    if rows:
        con.executemany("INSERT INTO c VALUES (?, ?, ?, ?, ?, ?)", rows)
    assert keys(con) == [tuple(r) for r in con.execute(SQL).fetchall()]


@pytest.mark.parametrize("rank_step", [1, 10 ** 9])  # rank numbers dense (counting sort) and sparse (a plain sort)
def test_rows_already_in_order_take_the_same_path_as_shuffled_ones(rank_step):
    rng = np.random.default_rng(3)
    n = 5000
    con = duckdb.connect()
    con.register("t", pa.table({"rank": rng.integers(0, 4, n) * rank_step, "start_ns": rng.integers(0, 300, n),
                                "kid": rng.integers(0, 3, n), "pgid": pa.array(rng.integers(0, 3, n)).cast(pa.int32()),
                                "seq": rng.integers(0, 50, n),
                                "coll": rng.choice(["send", "allreduce", "recv"], n)}))
    con.execute("CREATE TABLE c AS SELECT * FROM t ORDER BY rank, start_ns, kid")
    ordered = keys(con)
    con.execute("CREATE OR REPLACE TABLE c AS SELECT * FROM t")
    assert keys(con) == ordered == [tuple(r) for r in con.execute(SQL).fetchall()]
    assert len(ordered) < n  # runs of several rows were reduced


# the shared traces with comm kernels carrying collective rows (one with process groups), and a generated MoE job
# (all-to-alls and all-reduces with groups and sequence numbers on 4 ranks)
SHARED = ["hta/nccl_parser_config/nccl_data.json.gz", "hta/trace_diff/control/control.json.gz",
          "hta/df_index_resolver/df_index_resolver.json.gz"]


def _check(db):
    db.execute("""CREATE TEMP TABLE c AS
        SELECT k.rank, k.start_ns, dense_rank() OVER (ORDER BY k.kernel_name)::BIGINT AS kid,
               CASE WHEN k.pg_name IS NOT NULL THEN dense_rank() OVER (ORDER BY k.pg_name) - 1 END::INTEGER AS pgid,
               k.seq, k.coll
        FROM collectives k WHERE k.source = 'kernel' AND k.kernel_name IS NOT NULL""")
    n = db.execute("SELECT count(*) FROM c").fetchall()[0][0]
    assert n > 0
    got = keys(db)
    assert got == [tuple(r) for r in db.execute(SQL).fetchall()]
    return got


@needs_shared
@pytest.mark.parametrize("rel", SHARED)
def test_shared_trace_keys_match_the_sql_aggregate(db, rel):
    load_kineto(db, SHARED_TRACES / rel, "j", rank=0)
    _check(db)


def test_generated_moe_job_keys_match_the_sql_aggregate(db, tmp_path):
    from sample_traces.moe import generate_moe

    generate_moe(tmp_path / "moe", ranks=4, steps=2)
    ingest_paths(db, [tmp_path / "moe"], job="m")
    got = _check(db)
    assert {r[0] for r in got} == {0, 1, 2, 3} and any(r[3] >= 0 and r[4] >= 0 for r in got)
