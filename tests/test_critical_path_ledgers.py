"""The critical path carries the ledger partition: on every kind of job, for every (step, rank, ledger), the path's
time charged to that ledger on that rank is at most the rank's own (tests/path_ledgers.py); and planted pairs from
the generator: a GPU-bound job whose host runs 5 ms ahead of its GPU runs through GPU ops, a launch-bound job
through the host, charged exactly as the host ledger."""
import numpy as np
import pytest

from ninefold.analysis.attribution.attribute import attribute_job
from ninefold.analysis.critical_path import critical_path
from ninefold.analysis.whatif import whatif
from conftest import ROOT, SHARED_TRACES, needs_shared
from ninefold.ingest.load import ingest_paths, load_kineto
from path_ledgers import assert_path_within_ledgers
from sample_traces.generate import generate
from test_attribution_shared import GPU_TRACES

SAMPLES = ROOT / "sample_traces"


def _attribute(con, job):
    attribute_job(con, job)
    critical_path(con, job)
    assert_path_within_ledgers(con, job)


def _by(con, job, step, col, where=""):
    return dict(con.execute(f"SELECT {col}, sum(aligned_end_ns - aligned_start_ns) FROM critical_path "
                            f"WHERE job = ? AND step = ? {where} GROUP BY ALL", [job, step]).fetchall())


def test_shipped_and_generated_jobs(db, tmp_path):
    from sample_traces.alltoall2023 import generate_a2a
    from sample_traces.moe import generate_moe

    ingest_paths(db, sorted((SAMPLES / "dp4").glob("rank-*.json.gz")), job="dp4")
    _attribute(db, "dp4")
    ingest_paths(db, sorted((SAMPLES / "pp4_1f1b").glob("stage-*.json.gz")), job="pp4")
    _attribute(db, "pp4")
    generate_moe(tmp_path / "moe", ranks=4, steps=2)
    ingest_paths(db, [tmp_path / "moe"], job="moe")
    _attribute(db, "moe")
    generate_a2a(tmp_path / "a2a", ranks=8, steps=2, seed=3)
    ingest_paths(db, [tmp_path / "a2a"], job="a2a")
    _attribute(db, "a2a")


@pytest.fixture(scope="module")
def paced(tmp_path_factory):
    from ninefold.store.connection import connect

    d = tmp_path_factory.mktemp("paced")
    con = connect(d / "p.duckdb")
    # no planted gap or straggler: the pacing alone decides where the GPU waits
    for job, kw in (("gpu_bound", {"cpu_ahead_ns": 5_000_000}), ("launch_bound", {"host_op_ns": 1_000_000})):
        generate(d / job, ranks=2, steps=3, seed=0, host_gap_ns=0, straggler_delay_ns=0, **kw)
        ingest_paths(con, sorted((d / job).glob("rank-*.json")), job=job)
        _attribute(con, job)
    yield con
    con.close()


def test_host_ahead_of_a_busy_gpu_is_not_on_the_path(paced):
    steps = [s for (s,) in paced.execute("SELECT DISTINCT step FROM critical_path WHERE job = 'gpu_bound'").fetchall()]
    assert len(steps) == 3
    for st in steps:
        kinds = _by(paced, "gpu_bound", st, "kind")
        length = sum(kinds.values())
        assert kinds["op"] >= 0.95 * length, (st, kinds)
        host = _by(paced, "gpu_bound", st, "rank", "AND ledger = 'host'")
        own = dict(paced.execute("SELECT rank, ns FROM ledger_totals WHERE job = 'gpu_bound' AND step = ? "
                                 "AND ledger = 'host'", [st]).fetchall())
        # the GPU waited on its host only around the step's syncs: as little on the path as in the ledgers
        assert sum(host.values()) <= 0.01 * length
        assert all(v <= own[r] + 1000 for r, v in host.items())
    # the what-if's path (the unchanged replay) is the same story, by kind
    for s in whatif(paced, "gpu_bound")["steps"]:
        k = s["path_kinds"]
        assert k["op"] >= 0.95 * sum(k.values()), k


def test_a_starving_gpu_puts_the_host_ledger_on_the_path(paced):
    steps = [s for (s,) in paced.execute("SELECT DISTINCT step FROM critical_path WHERE job = 'launch_bound'"
                                         ).fetchall()]
    assert len(steps) == 3
    for st in steps:
        ranks = _by(paced, "launch_bound", st, "rank")
        length = sum(ranks.values())
        r = max(ranks, key=ranks.get)
        assert ranks[r] >= 0.99 * length
        kinds = _by(paced, "launch_bound", st, "kind", f"AND rank = {int(r)}")
        assert kinds["host"] >= 0.5 * length, kinds  # the host's own time between launches
        host = _by(paced, "launch_bound", st, "rank", "AND ledger = 'host'").get(r, 0)
        own = paced.execute("SELECT ns FROM ledger_totals WHERE job = 'launch_bound' AND step = ? AND rank = ? "
                            "AND ledger = 'host'", [st, r]).fetchone()[0]
        assert own > 0.5 * length and abs(host - own) <= 1000


@needs_shared
@pytest.mark.parametrize("rel", ["deepseek/train.json"] + GPU_TRACES)
def test_shared_single_rank_traces(db, rel):
    load_kineto(db, SHARED_TRACES / rel, "j", rank=0)
    _attribute(db, "j")


@needs_shared
def test_shared_two_rank_job(db):
    for r in (0, 1):
        load_kineto(db, SHARED_TRACES / f"hta/trace_filter/sampled_rank-{r}.json.gz", "t")
    _attribute(db, "t")


@needs_shared
def test_deepseek_path_tells_the_ledgers_story(db):
    """One DeepSeek-V3 training rank: the host waited on its GPU (DeepEP's notify_dispatch readback among
    others), and the GPU waited on the host for 0.042 ms: the path's host time is that, not most of the step;
    its DeepEP dispatch/combine kernels are on the path as the partition charges the time they run: exposed_comm,
    or compute where a compute kernel overlaps them."""
    load_kineto(db, SHARED_TRACES / "deepseek/train.json", "ds", rank=0)
    _attribute(db, "ds")
    (st,) = [s for (s,) in db.execute("SELECT DISTINCT step FROM critical_path WHERE job = 'ds'").fetchall()]
    path = _by(db, "ds", st, "ledger")
    own = dict(db.execute("SELECT ledger, ns FROM ledger_totals WHERE job = 'ds' AND step = ?", [st]).fetchall())
    # one rank: the path is its window, charged as its partition
    assert {k: v for k, v in path.items() if v} == {k: v for k, v in own.items() if v}
    assert path["host"] < 0.001 * sum(path.values())
    deepep = db.execute("""SELECT DISTINCT ledger FROM critical_path WHERE job = 'ds' AND kind = 'op'
                           AND (op_name ILIKE '%dispatch%' OR op_name ILIKE '%combine%')""").fetchall()
    # what-if without the host's time tells the same story: it saves the host ledger, and the path it projects
    # runs through GPU ops, not the host
    w = whatif(db, "ds", remove=("host",))
    assert abs(w["saved_ns"] - own["host"]) <= 1000
    kinds = w["steps"][0]["path_kinds"]
    assert kinds.get("host", 0) < 0.01 * sum(kinds.values()), kinds
    assert "exposed_comm" in {x for (x,) in deepep} and {x for (x,) in deepep} <= {"exposed_comm", "compute"}


def test_time_outside_a_ranks_step_window_goes_to_the_rank_whose_window_holds_it():
    from ninefold.analysis.critical_path import K_GAP, K_HOST, K_OP, _place

    # rank 0's window [100, 200), rank 1's [50, 180), rank 2's [150, 260); the path: rank 0's host from 40 (before
    # every window), its op to 230 (past its own window's end)
    wins = {0: (100, 200), 1: (50, 180), 2: (150, 260)}
    p = np.array([[0, K_HOST, 7, 40, 120], [0, K_OP, 8, 120, 230]], np.int64)
    out = _place(p, wins)
    assert out[:, 3].tolist() == [40, 50, 100, 120, 200] and out[:, 4].tolist() == [50, 100, 120, 200, 230]
    assert out[:, 0].tolist() == [0, 1, 0, 0, 2]  # before any window: left on its rank, no partition charges it
    assert out[:, 1].tolist() == [K_GAP, K_GAP, K_HOST, K_OP, K_GAP]
    # inside their windows, pieces are untouched
    q = np.array([[1, K_OP, 3, 60, 170]], np.int64)
    assert (_place(q, wins) == q).all()


def test_an_implicit_sync_is_an_edge_from_the_op_the_host_waited_for():
    from ninefold.analysis import step_graph as sg

    b = sg._Builder()
    # ops of one rank (start, end, issued): A [0, 100) at -5, B [90, 150) at 5, C [120, 400) at 160, D [430, 470)
    # at 425: the GPU busy [0, 400) and [430, 470). Launches after the host's quiet time:
    #   160, quiet since 10 (GPU busy), B issued by then ended 10 before: waited on B
    #   420, quiet since 160 (GPU busy), C issued at 160 ended 20 before: waited on C (as notify_dispatch's readback)
    #   480, quiet since 425 when the GPU was idle (the host launched D and was late): no edge
    #   800, quiet since 480: nothing ended within 50 before
    S, E, issued = np.array([0, 90, 120, 430]), np.array([100, 150, 400, 470]), np.array([-5, 5, 160, 425])
    gs = b.nodes(sg.GS, 0, 1, S, E - S)
    eo = np.argsort(E)
    at = np.array([160, 420, 480, 800])
    hn = b.nodes(sg.H, 0, 1, at)
    sg._implicit_syncs(b, hn, at, np.array([10, 160, 425, 480]), S, E, issued, E[eo], eo, gs, np.ones(4, np.int64))
    _, e = b.done()
    assert e["src"].tolist() == [gs[1], gs[2]] and e["dst"].tolist() == [hn[0], hn[1]]
    assert e["off"].tolist() == [10, 20] and set(e["kind"].tolist()) == {sg.E_IMPLICIT}


@needs_shared
def test_deepseek_dispatch_waits_on_notify_dispatch(db):
    """DeepEP's internode dispatch is launched after the host read back notify_dispatch's counts (no synchronize
    call in the trace): the graph has that edge, and the path follows notify_dispatch into the dispatch."""
    from ninefold.analysis import step_graph as sg
    from ninefold.analysis.critical_path import paths

    load_kineto(db, SHARED_TRACES / "deepseek/train.json", "ds", rank=0)
    attribute_job(db, "ds")
    g = sg.build(db, "ds")
    n, names = g["nodes"], np.asarray(g["ops"]["name"], dtype=object)
    m = g["kind"] == sg.E_IMPLICIT
    pairs = {(names[n["op"][u]].split("<")[0], names[n["op"][v]].split("<")[0])
             for u, v in zip(g["src"][m], g["dst"][m])}
    assert ("void dpsk::ep::internode::notify_dispatch", "void dpsk::ep::internode::dispatch") in pairs
    on = np.ones(g["src"].size, bool)
    z = np.full(n["T"].size, -1, np.int64)
    t, best = sg.replay(g["order"], g["ptr"], g["src"], g["off"], g["fe"], on, n["T"], g["lag"], n["dur"],
                        g["source"], z, z, np.zeros_like(z), False)
    (p,) = paths(g, t, best, g["lag"], n["dur"], g["off"]).values()
    seq = [names[n["op"][v]] if n["op"][v] >= 0 else "" for v in p[:, 2]]
    hops = [i for i in range(1, len(seq)) if "notify_dispatch" in seq[i - 1] and "internode::dispatch" in seq[i]]
    assert hops, "the path never goes from notify_dispatch to the dispatch it gates"
