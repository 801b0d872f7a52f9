"""The ledgers on traces shaped like real ones that were not planted for the core: old-style all-to-all, both
checkpoint forms, one-host clocks; host-op names pinned on real captures."""
import gzip
import json

import pytest

from ninefold.analysis.attribution.attribute import REENTRANT_HOST, RECOMPUTE_HOST, attribute_job
from conftest import ROOT, SHARED_TRACES, needs_shared
from ninefold.ingest.host_colls import host_coll_type
from ninefold.ingest.load import ingest_paths, load_kineto
from sample_traces.alltoall2023 import generate_a2a
from sample_traces.checkpointed import generate_checkpointed

CAPTURE = ROOT / "sample_traces" / "gloo_capture"


def _ingest(db, d, job):
    res = ingest_paths(db, sorted(d.glob("rank-*.json")), job=job)
    assert all(r.status == "stored" for r in res), [r.message for r in res]


def _diag(db, job, code):
    r = db.execute("SELECT sum(count) FROM diagnostics WHERE job = ? AND code = ?", [job, code]).fetchone()[0]
    return r or 0


@pytest.mark.parametrize("host_name", ["node0", None])
def test_old_style_all_to_all_is_a_matched_collective_and_straggler_is_the_planted_lateness(db, tmp_path, host_name):
    gt = generate_a2a(tmp_path / "a2a", ranks=8, steps=2, seed=3, host_name=host_name)
    _ingest(db, tmp_path / "a2a", "a")
    # every SendRecv kernel became an all_to_all collective from its host op; the all-reduces too
    kinds = dict(db.execute("SELECT coll, count(*) FROM collectives WHERE job = 'a' GROUP BY coll").fetchall())
    assert kinds == {"all_to_all": 8 * 2 * 5, "allreduce": 8 * 2 * 3}
    attribute_job(db, "a")
    assert _diag(db, "a", "unmatched_comm") == 0 and _diag(db, "a", "order_match_rejected") == 0
    got = {(r, s): ns for r, s, ns in db.execute(
        "SELECT rank, step, ns FROM ledger_totals WHERE job = 'a' AND ledger = 'straggler'").fetchall()}
    for st in gt["steps"]:
        for r in range(8):
            assert abs(got[(r, st["step"])] - st["straggler_ns"][r]) <= 1000, (r, st["step"])
    # the late rank of the third all-to-all waits least; the waiting is straggler, not exposed comm
    assert min(gt["straggler_ns_per_rank"]) == gt["straggler_ns_per_rank"][7]
    # one clock: no offset applied, and the reason says why
    rows = db.execute("SELECT rank, offset_ns, applied, reason FROM clock_offsets WHERE job = 'a' "
                      "ORDER BY rank").fetchall()
    assert all(off == 0 and not applied for _, off, applied, _ in rows)
    want = "same host" if host_name else "within the completion skew"
    assert all(want in reason for rank, _, _, reason in rows if rank > 0)


def test_clock_offsets_across_hosts_are_applied(db, tmp_path):
    # two hosts, rank 1's clock 2 ms ahead: the offset is estimated and applied, with its reason
    d = tmp_path / "a2a"
    gt = generate_a2a(d, ranks=2, steps=2, seed=1, host_name=None)
    for r, host in ((0, "node0"), (1, "node1")):
        p = d / f"rank-{r}.json"
        doc = json.loads(p.read_text())
        doc["host_name"] = host
        if r == 1:
            doc["baseTimeNanoseconds"] += 2_000_000
        p.write_text(json.dumps(doc))
    _ingest(db, d, "h")
    attribute_job(db, "h")
    off, applied, reason = db.execute("SELECT offset_ns, applied, reason FROM clock_offsets "
                                      "WHERE job = 'h' AND rank = 1").fetchone()
    assert off == 2_000_000 and applied and "another host" in reason
    got = dict(db.execute("SELECT rank, sum(ns) FROM ledger_totals WHERE job = 'h' AND ledger = 'straggler' "
                          "GROUP BY rank").fetchall())
    for r in range(2):
        assert abs(got[r] - gt["straggler_ns_per_rank"][r]) <= 1000 * len(gt["steps"])


def test_recompute_is_what_was_launched_inside_the_recomputation(db, tmp_path):
    gt = generate_checkpointed(tmp_path / "ck", ranks=2, steps=2, seed=5)
    _ingest(db, tmp_path / "ck", "c")
    attribute_job(db, "c")
    for rk in gt["ranks"]:
        assert rk["other_thread_kernels_inside_recompute"] > 0
        for st in rk["steps"]:
            tot = dict(db.execute("SELECT ledger, ns FROM ledger_totals WHERE job = 'c' AND rank = ? AND step = ?",
                                  [rk["rank"], st["step"]]).fetchall())
            # exact: the re-run forward of both forms, not the original forward (CheckpointFunction), not the
            # segment's own backward, not the main thread's kernel that ran inside the window
            assert tot["recompute"] == st["recompute_kernel_ns"]
            assert tot["compute"] == st["compute_kernel_ns"]


def test_checkpoint_and_collective_host_op_names_are_the_ones_real_captures_record():
    # torch 2.13 on gloo, 2 ranks (sample_traces/capture_gloo.py): both checkpoint forms and every collective
    import duckdb

    names = set()
    for p in sorted(CAPTURE.glob("rank-*.json.gz")):
        names |= {e["name"] for e in json.load(gzip.open(p))["traceEvents"] if e.get("ph") == "X"}
    con = duckdb.connect()
    con.execute("CREATE TABLE host_ops (name VARCHAR)")
    con.execute("INSERT INTO host_ops SELECT unnest(?::VARCHAR[])", [sorted(names)])
    rec = {n for (n,) in con.execute(f"SELECT name FROM host_ops WHERE {RECOMPUTE_HOST}").fetchall()}
    ree = {n for (n,) in con.execute(f"SELECT name FROM host_ops WHERE {REENTRANT_HOST}").fetchall()}
    assert len(rec) == 1 and next(iter(rec)).startswith("torch/utils/checkpoint.py(") and "recompute_fn" in next(iter(rec))
    assert "CheckpointFunctionBackward" in ree and "CheckpointFunction" not in ree | rec
    typed = {n: host_coll_type(n) for n in names if n.startswith(("c10d::", "gloo:"))}
    assert typed["c10d::alltoall_base_"] == typed["gloo:all_to_all"] == "all_to_all"
    assert typed["c10d::allreduce_"] == typed["gloo:all_reduce"] == "allreduce"
    assert typed["c10d::allgather_"] == typed["gloo:all_gather"] == "all_gather"
    assert typed["c10d::_reduce_scatter_base_"] == "reduce_scatter"
    assert typed["c10d::broadcast_"] == typed["gloo:broadcast"] == "broadcast"
    assert typed["c10d::send"] == typed["gloo:send"] == "send"
    assert None not in typed.values(), typed


@needs_shared
def test_shared_gloo_capture_names_are_typed():
    names = {e["name"] for p in sorted((SHARED_TRACES / "torch_cpu_gloo_2rank").glob("rank-*.json"))
             for e in json.load(open(p))["traceEvents"] if e.get("ph") == "X"}
    comm = {n for n in names if n.startswith(("c10d::", "gloo:"))}
    assert comm and all(host_coll_type(n) for n in comm), comm


@needs_shared
def test_real_torchrec_all_to_all_kernels_are_collectives_typed_by_their_host_op(db):
    # 2 of 128 ranks of a down-sampled TorchRec job: every NCCL kernel (all SendRecv here) is launched under
    # nccl:all_to_all / nccl:all_reduce / nccl:_all_gather_base; each becomes a collective of that type.
    for r in (0, 1):
        load_kineto(db, SHARED_TRACES / f"hta/trace_filter/sampled_rank-{r}.json.gz", "t")
    n_kernels = db.execute("SELECT count(*) FROM gpu_ops WHERE job = 't' AND name LIKE 'ncclKernel%'").fetchone()[0]
    rows = db.execute("SELECT rank, coll, count(*) FROM collectives WHERE job = 't' GROUP BY ALL").fetchall()
    assert sum(n for _, _, n in rows) == n_kernels == 20
    assert {c for _, c, _ in rows} == {"all_to_all", "allreduce", "all_gather"}
    attribute_job(db, "t")
    # the ranks' events were sampled independently, so some collectives lost their peer: those order matches
    # are refused by their ends, and only those are unmatched
    rejected, unmatched = _diag(db, "t", "order_match_rejected"), _diag(db, "t", "unmatched_comm")
    assert unmatched == rejected < n_kernels
    # what was matched completes together on both ranks (no offset applied: the estimate is in the noise)
    assert db.execute("SELECT bool_and(NOT applied) FROM clock_offsets WHERE job = 't'").fetchone()[0]


def test_waits_explain_the_straggler_ledger_and_match_tracelens_where_ends_coincide(db, tmp_path):
    from click.testing import CliRunner

    from ninefold.analysis.waits import waits
    from ninefold.cli.main import cli

    gt = generate_a2a(tmp_path / "a2a", ranks=4, steps=2, seed=7)
    _ingest(db, tmp_path / "a2a", "w")
    attribute_job(db, "w")
    w = waits(db, "w")
    assert len(w["rows"]) == 4 * 2 * 8
    led = dict(db.execute("SELECT rank, sum(ns) FROM ledger_totals WHERE job = 'w' AND ledger = 'straggler' "
                          "GROUP BY rank").fetchall())
    for r in w["ranks"]:
        planted = gt["straggler_ns_per_rank"][r["rank"]]
        # nothing overlaps the waits here: every ns of waiting is straggler, as the ledger says
        assert r["wait_ns"] == r["straggler_ns"] == led[r["rank"]] == planted
        # all members end together, so TraceLens's wait (duration minus the shortest member's) is the same
        assert r["tracelens_wait_ns"] == planted
    for row in w["rows"]:
        assert row["wait_ns"] == row["last_arrival_ns"] - row["arrival_ns"] >= 0
        assert row["transfer_ns"] == 180_000
    db.close()
    res = CliRunner().invoke(cli, ["waits", "--db", str(tmp_path / "t.duckdb"), "--job", "w", "--format", "csv"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("rank,pg,coll,seq,ord,members,arrival_ns") and len(lines) == 1 + 64
    res = CliRunner().invoke(cli, ["waits", "--db", str(tmp_path / "t.duckdb"), "--job", "nope"])
    assert res.exit_code == 2 and "error: job 'nope' is not in the store" in res.output


@needs_shared
def test_comm_compute_overlap_equals_an_independent_interval_count(db):
    from ninefold.analysis.classify import classify_kernel
    from ninefold.analysis.waits import comm_compute_overlap

    load_kineto(db, SHARED_TRACES / "hta/trace_diff/control/control.json.gz", "o", rank=3)
    attribute_job(db, "o")
    (got,) = comm_compute_overlap(db, "o")
    wins = db.execute("SELECT start_ns, end_ns FROM step_windows WHERE job = 'o'").fetchall()
    ks = db.execute("SELECT name, start_ns, end_ns FROM gpu_ops WHERE job = 'o' AND kind = 'kernel'").fetchall()

    def merged(iv):
        out = []
        for s, e in sorted(iv):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            elif e > s:
                out.append([s, e])
        return out

    def inter(a, b):
        i = j = 0
        out = []
        while i < len(a) and j < len(b):
            s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
            if e > s:
                out.append([s, e])
            if a[i][1] < b[j][1]:
                i += 1
            else:
                j += 1
        return out

    W = merged(wins)
    comm = inter(merged([(s, e) for n, s, e in ks if classify_kernel(n)[0] == "comm"]), W)
    comp = merged([(s, e) for n, s, e in ks if classify_kernel(n)[0] != "comm"])
    comm_ns = sum(e - s for s, e in comm)
    hidden = sum(e - s for s, e in inter(comm, comp))
    assert got["comm_ns"] == comm_ns > 0 and got["hidden_ns"] == hidden > 0
    assert 0 < got["overlap"] < 1
