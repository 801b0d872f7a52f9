"""Every view reads what the analysis decided: on real multi-rank jobs of the shared corpus, the shipped samples and
generated jobs, the Stragglers view's total is the straggler ledger, the MoE view's all-to-all time is the
all-to-all kernel time of the collectives `waits` reads, breakdown names collectives as `waits` does, and
`inspect` counts the communication kernels attribution charges as communication."""
import pytest

from ninefold.analysis.attribution.attribute import attribute_job
from ninefold.analysis.inspect import inspect_store
from ninefold.analysis.waits import is_all_to_all, waits
from conftest import ROOT, SHARED_TRACES, needs_shared
from ninefold.dashboards import queries
from ninefold.dashboards.views import stragglers as stragglers_view
from ninefold.ingest.load import load_kineto
from ninefold.store.connection import connect

SAMPLES = ROOT / "sample_traces"


def _shared(*rel):
    return lambda d: [SHARED_TRACES / r for r in rel]


def _generated(fn):
    def files(d):
        fn(d / "gen")
        return sorted((d / "gen").glob("rank-*.json"))
    return files


def _dp(d):
    from sample_traces.generate import generate

    generate(d, ranks=4, steps=3, seed=2)


def _moe(d):
    from sample_traces.moe import generate_moe

    generate_moe(d, ranks=4, steps=2, layers=3, overloaded=1, seed=4)


def _a2a(d):
    from sample_traces.alltoall2023 import generate_a2a

    generate_a2a(d, ranks=8, steps=2, seed=5)


# job name -> files (rank i = the i-th file); shared ones need the corpus beside the checkout
JOBS = {
    "torchrec_sampled_pair": _shared("hta/trace_filter/sampled_rank-0.json.gz",
                                     "hta/trace_filter/sampled_rank-1.json.gz"),
    "cpu_gloo_2rank": _shared("torch_cpu_gloo_2rank/rank-0.pt.trace.json", "torch_cpu_gloo_2rank/rank-1.pt.trace.json"),
    # one rank of a real MoE job (DeepEP dispatch/combine): the per-rank checks hold with one rank too
    "deepseek_v3_rank": _shared("deepseek/train.json"),
    "dp4": lambda d: sorted((SAMPLES / "dp4").glob("rank-*.json.gz")),
    "pp4_1f1b": lambda d: sorted((SAMPLES / "pp4_1f1b").glob("stage-*.json.gz")),
    "generated_dp": _generated(_dp),
    "generated_moe": _generated(_moe),
    "generated_a2a2023": _generated(_a2a),
}
SHARED_JOBS = {"torchrec_sampled_pair", "cpu_gloo_2rank", "deepseek_v3_rank"}
CHECKS = ("stragglers", "moe", "breakdown", "inspect")
# inspect counts NCCL/RCCL kernel names; attribution also charges DeepEP's dispatch/combine as communication
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store; each job ingested and attributed the first time a check asks for it."""
    d = tmp_path_factory.mktemp("consistency")
    con = connect(d / "c.duckdb")
    done = set()

    def get(job):
        if job not in done:
            for i, f in enumerate(JOBS[job](d / job)):
                load_kineto(con, f, job, rank=i)
            attribute_job(con, job)
            done.add(job)
        return con
    yield get
    con.close()


def _cases():
    out = []
    for job in JOBS:
        for check in CHECKS:
            marks = []
            if job in SHARED_JOBS:
                marks.append(needs_shared)
            out.append(pytest.param(job, check, marks=marks, id=f"{job}-{check}"))
    return out


def _ledger(con, job, name):
    return con.execute("SELECT coalesce(sum(ns), 0) FROM ledger_totals WHERE job = ? AND ledger = ?",
                       [job, name]).fetchone()[0]


@pytest.mark.parametrize("job,check", _cases())
def test_views_agree_with_the_analysis(store, job, check):
    con = store(job)
    w = waits(con, job)
    if check == "stragglers":
        data = stragglers_view.load(con, job)
        total = _ledger(con, job, "straggler")
        assert data["straggler_ns"] == total
        assert int(data["matrix"]["straggler_ns"].sum()) == total  # (no job here has over 400 collectives)
        assert sum(r["straggler_ns"] for r in w["rows"]) == total
    elif check == "moe":
        m = queries.moe(con, job)
        got = int(m["ranks"]["a2a_ns"].sum()) if m["slowest"] is not None else 0
        matched = sum(r["dur_ns"] for r in w["rows"] if is_all_to_all(r["coll"]))
        # all-to-alls no peer matched (one rank; a peer's events sampled away) are kernel time all the same
        unmatched = sum(e - s for c, s, e in con.execute(
            "SELECT coll, start_ns, end_ns FROM collective_matches WHERE job = ? AND NOT matched", [job]).fetchall()
            if is_all_to_all(c))
        assert got == matched + unmatched
    elif check == "breakdown":
        bd = queries.ledger_breakdown(con, job, top=100_000)
        types = {r["coll"] for r in w["rows"]}
        unmatched = {c for (c,) in con.execute("SELECT DISTINCT coll FROM collective_matches WHERE job = ? "
                                                "AND NOT matched", [job]).fetchall()}
        # waiting at a collective is only ever charged at one waits lists, under its name
        for key in bd.filter(bd["ledger"] == "straggler")["key"]:
            assert key.split(" (")[0] in types, key
        assert set(bd["coll"].drop_nulls()) <= types | unmatched
    else:
        facts = {e["rank"]: e["facts"]["comm_kernels"] for e in inspect_store(con, job) if e["kind"] == "kineto"}
        charged = dict(con.execute("""SELECT g.rank, count(*) FROM gpu_ops g
            JOIN kernel_classes k ON k.job = g.job AND k.name = g.name
            WHERE g.job = ? AND g.kind = 'kernel' AND k.family = 'comm' GROUP BY g.rank""", [job]).fetchall())
        assert facts == {r: charged.get(r, 0) for r in facts}
