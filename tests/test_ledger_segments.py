"""The intervals are stored coded (ledger_segments + ledger_names) and read named through the ledger_intervals
view; a store that holds ledger_intervals as a table (an earlier version's layout) moves to the coded one with
the same rows."""
import pytest

from ninefold.analysis.attribution.attribute import _ensure_tables, attribute_job, insert_named_intervals
from ninefold.analysis.ledgers import LEDGERS
from ninefold.ingest.load import ingest_paths
from sample_traces.generate import generate
from ninefold.store.connection import connect

ROWS = "SELECT job, rank, step, ledger, start_ns, end_ns, op_name, pg_name, seq FROM ledger_intervals ORDER BY ALL"


@pytest.fixture
def store(tmp_path):
    generate(tmp_path / "dp", ranks=2, steps=3, seed=5)
    con = connect(tmp_path / "s.duckdb")
    res = ingest_paths(con, sorted((tmp_path / "dp").glob("rank-*.json")), job="dp")
    assert [r.status for r in res] == ["stored", "stored"]
    attribute_job(con, "dp")
    yield con
    con.close()


def _as_old_table(con, drop=()):
    """Turn the store back into the earlier layout: ledger_intervals a table with these rows."""
    con.execute("CREATE TABLE _keep AS " + ROWS.replace(" ORDER BY ALL", ""))
    con.execute("DROP VIEW ledger_drilldown")
    con.execute("DROP VIEW ledger_intervals")
    con.execute("DROP TABLE ledger_segments")
    con.execute("DROP TABLE ledger_names")
    con.execute("ALTER TABLE _keep RENAME TO ledger_intervals")
    for c in drop:
        con.execute(f"ALTER TABLE ledger_intervals DROP COLUMN {c}")


def test_codes_name_the_same_intervals(store):
    rows = store.execute(ROWS).fetchall()
    assert rows and {r[3] for r in rows} <= set(LEDGERS)
    assert any(r[6] for r in rows) and any(r[7] for r in rows)   # ops and process groups named
    seg = store.execute("SELECT count(*), count_if(op_code >= 0), count_if(pg_code >= 0), max(ledger_code) "
                        "FROM ledger_segments WHERE job = 'dp'").fetchone()
    assert seg[0] == len(rows) and seg[1] == sum(r[6] is not None for r in rows)
    assert seg[2] == sum(r[7] is not None for r in rows) and seg[3] < len(LEDGERS)
    # one name per (job, kind, code)
    assert store.execute("SELECT count(*) FROM (SELECT job, kind, code FROM ledger_names GROUP BY ALL "
                         "HAVING count(*) > 1)").fetchone()[0] == 0
    # re-attribution replaces the job's segments and names, not adds to them
    names = store.execute("SELECT count(*) FROM ledger_names").fetchone()[0]
    attribute_job(store, "dp")
    assert store.execute(ROWS).fetchall() == rows
    assert store.execute("SELECT count(*) FROM ledger_names").fetchone()[0] == names


def test_an_earlier_store_moves_to_the_coded_layout(store):
    rows = store.execute(ROWS).fetchall()
    drill = store.execute("SELECT count(*), count(kclass), count(coll) FROM ledger_drilldown").fetchone()
    _as_old_table(store)
    assert store.execute("SELECT table_type FROM information_schema.tables WHERE table_name = 'ledger_intervals'"
                         ).fetchone()[0] == "BASE TABLE"
    _ensure_tables(store)
    assert store.execute("SELECT table_type FROM information_schema.tables WHERE table_name = 'ledger_intervals'"
                         ).fetchone()[0] == "VIEW"
    assert store.execute(ROWS).fetchall() == rows
    assert store.execute("SELECT count(*), count(kclass), count(coll) FROM ledger_drilldown").fetchone() == drill


def test_an_older_store_without_drilldown_keys_moves_too(store):
    rows = store.execute(ROWS).fetchall()
    _as_old_table(store, drop=("op_name", "pg_name", "seq"))
    _ensure_tables(store)
    assert store.execute(ROWS).fetchall() == [r[:6] + (None, None, None) for r in rows]


def test_named_rows_take_the_next_codes_of_a_job(store):
    """insert_named_intervals (used by the move of an earlier store) gives a job's new names the codes after
    its existing ones."""
    top = store.execute("SELECT max(code) FROM ledger_names WHERE job = 'dp' AND kind = 'op'").fetchone()[0]
    store.execute("""CREATE TEMP TABLE _new AS SELECT 'dp' AS job, 0 AS rank, 99 AS step, 'idle' AS ledger,
                     1::BIGINT AS start_ns, 2::BIGINT AS end_ns, 'a_new_kernel' AS op_name, NULL AS pg_name,
                     NULL::BIGINT AS seq""")
    insert_named_intervals(store, "_new")
    assert store.execute("SELECT code FROM ledger_names WHERE job = 'dp' AND name = 'a_new_kernel'").fetchone() == (
        top + 1,)
    assert store.execute("SELECT ledger, op_name FROM ledger_intervals WHERE step = 99").fetchall() == [
        ("idle", "a_new_kernel")]
