"""Flight Recorder dumps: restricted unpickling, generated hang dumps, the real gloo dumps, the hang report."""
import json
import os
import pickle

import pytest
from click.testing import CliRunner

from ninefold.analysis.hang import format_table, hang_report
from ninefold.ingest import flight_recorder as fr
from ninefold.ingest.load import ingest_paths
from ninefold.ingest.registry import head_bytes, loader_for
from sample_traces.flight_recorder import generate
from ninefold.store.connection import connect
from ninefold.store.errors import IngestConflict, TraceFormatError
from tests.conftest import SHARED_TRACES, needs_shared

GLOO = SHARED_TRACES / "flight_recorder_gloo_4rank"
FR_TABLES = ("fr_dumps", "fr_entries", "fr_pgs")


def _n(con, t):
    return con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    out = tmp_path_factory.mktemp("fr")
    return out, generate(out, world=8, steps=4, tp=4, hang_ranks=(5, 6), seed=0)


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_never_runs(db, tmp_path):
    marker = tmp_path / "pwned"
    p = tmp_path / "nccl_trace_rank_0.pkl"
    p.write_bytes(pickle.dumps({"version": "2.10", "pg_config": {}, "entries": [_Evil(marker)]}, protocol=4))
    assert fr.sniff(p, head_bytes(p))
    with pytest.raises(TraceFormatError) as ei:
        fr.load(db, p, "j")
    msg = str(ei.value)
    assert msg == f"{p}: pickle refers to class {os.system.__module__}.system; refusing untrusted dump"
    assert not marker.exists()
    for t in FR_TABLES:
        assert _n(db, t) == 0
    # any class at all is refused, even a harmless one
    import collections
    q = tmp_path / "rank1.pkl"
    q.write_bytes(pickle.dumps({"entries": [], "pg_config": collections.OrderedDict()}))
    with pytest.raises(TraceFormatError, match="pickle refers to class collections.OrderedDict; refusing untrusted dump"):
        fr.load(db, q, "j")


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_generated_hang_is_reported_exactly(gen, tmp_path, fmt):
    out, gt = gen
    db = connect(tmp_path / "h.duckdb")
    res = ingest_paths(db, [out / fmt], job="g")
    assert [r.status for r in res] == ["stored"] * 8 and sorted(r.rank for r in res) == list(range(8))
    n_entries = {r: len(json.loads((out / "json" / f"nccl_trace_rank_{r}.json").read_text())["entries"]) for r in range(8)}
    assert dict(db.execute("SELECT rank, count(*) FROM fr_entries GROUP BY rank").fetchall()) == n_entries
    rep = hang_report(db, "g")
    h = gt["hang"]
    assert rep["hung_groups"] == [h["pg_name"]]
    g0 = next(g for g in rep["process_groups"] if g["pg_name"] == h["pg_name"])
    assert (g0["max_seq"], g0["op_at_max"], g0["missing"], g0["reached"], g0["states_at_max"]) == (
        h["seq"], h["op"], h["missing_ranks"], h["reached_ranks"], [h["state_on_reached"]])
    assert {r["rank"]: r["last_completed_seq"] for r in g0["ranks"]} == {
        int(r): v[h["pg_name"]] for r, v in gt["last_completed"].items()}
    assert {r["rank"]: r["last_seq"] for r in g0["ranks"]} == {
        r: h["seq"] - (r in h["missing_ranks"]) for r in range(8)}
    tp = {g["pg_name"]: (g["members"], g["hung"]) for g in rep["process_groups"] if g["pg_desc"] == "tp"}
    assert tp == {name: (ranks, False) for name, ranks in gt["tp_groups"].items()}
    assert "never reached it: 5-6" in format_table(rep)
    db.close()


def test_pickle_and_json_dumps_store_the_same_entries(gen, tmp_path):
    out, _ = gen
    db = connect(tmp_path / "pj.duckdb")
    for r in range(8):
        fr.load(db, out / "pickle" / f"nccl_trace_rank_{r}.pkl", "p")
        fr.load(db, out / "json" / f"nccl_trace_rank_{r}.json", "j")
    cols = ("rank, record_id, pg_id, pg_name, pg_desc, seq, p2p_seq, op_id, op, is_p2p, state, time_created_ns, "
            "time_started_ns, time_completed_ns, duration_ms, retired, timeout_ms, in_bytes, out_bytes, sizes")
    a = db.execute(f"SELECT {cols} FROM fr_entries WHERE job = 'p' ORDER BY rank, record_id").fetchall()
    b = db.execute(f"SELECT {cols} FROM fr_entries WHERE job = 'j' ORDER BY rank, record_id").fetchall()
    assert a == b and len(a) > 100
    # frames exist only in the pickle; bytes = prod(shape) * 2 for bf16
    assert db.execute("SELECT count(*) FILTER (top_frame IS NULL) FROM fr_entries WHERE job = 'p'").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FILTER (top_frame IS NOT NULL) FROM fr_entries WHERE job = 'j'").fetchone()[0] == 0
    assert db.execute("""SELECT DISTINCT in_bytes, out_bytes FROM fr_entries WHERE job = 'p' AND op = 'nccl:all_gather'"""
                      ).fetchall() == [((1 << 20) * 2, (1 << 20) * 8 * 2)]
    pgs = db.execute("SELECT pg_id, pg_name, member_ranks, last_completed FROM fr_pgs WHERE job = 'j' AND rank = 5 "
                     "ORDER BY pg_id").fetchall()
    assert pgs == [(0, "0", list(range(8)), 6), (1, "2", [4, 5, 6, 7], 8)]
    db.close()


def test_ring_buffer_wrap_does_not_change_the_report(tmp_path):
    gt = generate(tmp_path / "w", world=8, steps=6, hang_ranks=(2,), seed=4, buffer_size=10)
    db = connect(tmp_path / "w.duckdb")
    ingest_paths(db, [tmp_path / "w" / "pickle"], job="w")
    assert db.execute("SELECT min(record_id) > 0, max(n_entries) FROM fr_dumps JOIN fr_entries USING (job, rank)"
                      ).fetchone() == (True, 10)
    g0 = next(g for g in hang_report(db, "w")["process_groups"] if g["pg_name"] == "0")
    assert (g0["max_seq"], g0["missing"]) == (gt["hang"]["seq"], [2])
    db.close()


@needs_shared
@pytest.mark.parametrize("ext", ["pkl", "json"])
def test_real_gloo_dumps_show_the_planted_hang(db, ext):
    files = sorted(GLOO.glob(f"rank-*.{ext}"))
    for f in files:
        assert loader_for(f).name == "flight_recorder"
        assert fr.load(db, f, "gloo").status == "stored"
    exp = {int(f.stem.split("-")[1]): len(json.loads(f.with_suffix(".json").read_text())["entries"]) for f in files}
    if ext == "json":
        assert dict(db.execute("SELECT rank, count(*) FROM fr_entries GROUP BY rank").fetchall()) == exp
    rep = hang_report(db, "gloo")
    g = {x["pg_name"]: x for x in rep["process_groups"]}
    # ranks 0-2 enqueue all_reduce #8 on the default group; rank 3 stops at #7 (the barrier)
    assert (g["0"]["max_seq"], g["0"]["op_at_max"], g["0"]["missing"], g["0"]["reached"]) == (
        8, "gloo:all_reduce", [3], [0, 1, 2])
    r3 = next(r for r in g["0"]["ranks"] if r["rank"] == 3)
    assert (r3["last_seq"], r3["last_op"], r3["last_completed_seq"]) == (7, "gloo:barrier", None)  # gloo: never 'completed'
    assert (g["1"]["members"], g["2"]["members"], g["1"]["hung"], g["2"]["hung"]) == ([0, 1], [2, 3], False, False)
    assert rep["hung_groups"] == ["0"]
    # the empty pg_config placeholder gloo writes is not a group
    assert db.execute("SELECT count(*) FROM fr_pgs WHERE pg_name = '' OR pg_name IS NULL").fetchone()[0] == 0


@needs_shared
def test_tutorial_schema_text_gives_a_clear_error(db):
    f = SHARED_TRACES / "flight_recorder" / "fr_tutorial_unpickled_dump_example_v2.3.txt"
    with pytest.raises(TraceFormatError) as ei:
        fr.load(db, f, "t", rank=0)
    msg = str(ei.value)
    assert msg.startswith(str(f)) and "not valid JSON" in msg and "printed dump" in msg and "\n" not in msg
    for t in FR_TABLES:
        assert _n(db, t) == 0


def test_broken_and_foreign_inputs_store_nothing(db, gen, tmp_path):
    out, _ = gen
    data = (out / "pickle" / "nccl_trace_rank_0.pkl").read_bytes()
    cut = tmp_path / "nccl_trace_rank_0.pkl"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match="truncated or corrupt pickle"):
        fr.load(db, cut, "b")
    kin = tmp_path / "rank-1.json"
    kin.write_text('{"schemaVersion": 1, "traceEvents": []}')
    assert not fr.sniff(kin, head_bytes(kin))
    with pytest.raises(TraceFormatError, match="not a Flight Recorder dump"):
        fr.load(db, kin, "b")
    odd = tmp_path / "rank-2.json"
    odd.write_text(json.dumps({"version": "2.10", "pg_config": {}, "entries": [{"record_id": "x", "state": 3}]}))
    with pytest.raises(TraceFormatError, match="unexpected field type"):
        fr.load(db, odd, "b")
    noname = tmp_path / "dump.json"
    noname.write_text((out / "json" / "nccl_trace_rank_0.json").read_text())
    with pytest.raises(TraceFormatError, match="no rank"):
        fr.load(db, noname, "b")
    for t in FR_TABLES:
        assert _n(db, t) == 0


def test_same_dump_twice_is_a_noop_and_another_file_for_a_rank_conflicts(db, gen):
    out, _ = gen
    p = out / "pickle" / "nccl_trace_rank_3.pkl"
    assert fr.load(db, p, "i").status == "stored"
    n = _n(db, "fr_entries")
    assert fr.load(db, p, "i").status == "unchanged" and _n(db, "fr_entries") == n
    with pytest.raises(IngestConflict, match="--replace"):
        fr.load(db, out / "json" / "nccl_trace_rank_3.json", "i")
    assert fr.load(db, out / "json" / "nccl_trace_rank_3.json", "i", replace=True).status == "stored"
    assert db.execute("SELECT format FROM fr_dumps").fetchall() == [("json",)] and _n(db, "fr_entries") == n


def test_hang_command(gen, tmp_path):
    from ninefold.cli.main import cli

    out, gt = gen
    dbp = tmp_path / "cli.duckdb"
    con = connect(dbp)
    ingest_paths(con, [out / "pickle"], job="g")
    expect = json.loads(json.dumps(hang_report(con, "g"), default=str))
    con.close()
    res = CliRunner().invoke(cli, ["hang", "--db", str(dbp), "--job", "g", "--format", "json"])
    assert res.exit_code == 1 and json.loads(res.output) == expect          # exit 1: a hung group was found
    txt = CliRunner().invoke(cli, ["hang", "--db", str(dbp), "--job", "g"])
    assert "pg 0 (default_pg) HUNG" in txt.output and f"max seq {gt['hang']['seq']}" in txt.output
    none = CliRunner().invoke(cli, ["hang", "--db", str(dbp), "--job", "other"])
    assert none.exit_code == 2 and "no Flight Recorder dumps" in none.output
