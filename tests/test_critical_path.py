"""The cross-rank critical path and the what-if replay, validated against the generator: the same seeded job with
and without its planted straggler delay, host launch gap or 2x slower GEMMs. The what-if on the planted job must
give the measured step time of its un-planted twin; the path must be contiguous, cover each step window exactly
and cross ranks where they wait on each other (the straggler, the 1F1B warm-up and cool-down)."""
import itertools
import subprocess
import sys

import pytest

from ninefold.analysis.attribution.attribute import attribute_job
from ninefold.analysis.critical_path import CriticalPathError, critical_path
from ninefold.analysis.whatif import WhatIfError, rank_removals, whatif
from conftest import ROOT, SHARED_TRACES, needs_shared
from ninefold.ingest.load import ingest_paths, load_kineto
from path_ledgers import assert_path_within_ledgers
from sample_traces.generate import generate
from ninefold.store.connection import connect

JOBS = {  # name: generator options (seed 0, 4 ranks, 3 steps)
    "planted": {},
    "no_straggler": {"straggler_delay_ns": 0},
    "no_gap": {"host_gap_ns": 0},
    "slow_gemm": {"gemm_scale": 2.0, "straggler_delay_ns": 0},
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("cp")
    db = d / "cp.duckdb"
    con = connect(db)
    truth = {}
    for job, kw in JOBS.items():
        truth[job] = generate(d / job, ranks=4, steps=3, seed=0, **kw)
        ingest_paths(con, sorted((d / job).glob("rank-*.json")), job=job)
        attribute_job(con, job)
    ingest_paths(con, sorted((ROOT / "sample_traces" / "pp4_1f1b").glob("stage-*.json.gz")), job="pp")
    attribute_job(con, "pp")
    for job in list(JOBS) + ["pp"]:
        critical_path(con, job)
    con.close()
    return db, truth


def _windows(con, job):
    """{step: (aligned start, aligned end)} over the ranks."""
    return {s: (a, b) for s, a, b in con.execute(
        "SELECT w.step, min(w.start_ns - coalesce(o.offset_ns, 0)), max(w.end_ns - coalesce(o.offset_ns, 0)) "
        "FROM step_windows w LEFT JOIN clock_offsets o USING (job, rank) WHERE w.job = ? GROUP BY w.step",
        [job]).fetchall()}


def _path(con, job, step):
    return con.execute("SELECT rank, kind, op_name, aligned_start_ns, aligned_end_ns, ledger, start_ns, end_ns "
                       "FROM critical_path WHERE job = ? AND step = ? ORDER BY seq", [job, step]).fetchall()


def _well_formed(con, job):
    wins = _windows(con, job)
    assert wins
    for step, (w0, w1) in wins.items():
        p = _path(con, job, step)
        assert p, f"{job} step {step}: no path"
        assert abs(p[0][3] - w0) <= 1000 and abs(p[-1][4] - w1) <= 1000
        for a, b in zip(p, p[1:]):
            assert a[4] == b[3], f"{job} step {step}: a gap or overlap at {a[4]}"
        assert all(r[4] > r[3] for r in p)
        assert abs(sum(r[4] - r[3] for r in p) - (w1 - w0)) <= 1000
    return wins


def test_paths_are_contiguous_and_cover_each_step_window(store):
    db, _ = store
    con = connect(db, read_only=True)
    for job in list(JOBS) + ["pp"]:
        _well_formed(con, job)
    # own-clock times are the aligned ones plus the rank's offset
    off = dict(con.execute("SELECT rank, offset_ns FROM clock_offsets WHERE job = 'planted'").fetchall())
    for r in _path(con, "planted", 11):
        assert r[6] - r[3] == off[r[0]] and r[7] - r[4] == off[r[0]]


def test_paths_charge_no_rank_more_than_its_ledgers(store):
    db, _ = store
    con = connect(db, read_only=True)
    for job in list(JOBS) + ["pp"]:
        assert_path_within_ledgers(con, job)
    # the planted job's steps: the host is on the path only where the GPU waited for it
    for step in (10, 11, 12):
        p = _path(con, "planted", step)
        host = {}
        for r in p:
            if r[5] == "host":
                host[r[0]] = host.get(r[0], 0) + r[4] - r[3]
        assert sum(host.values()) < 0.25 * (p[-1][4] - p[0][3])


def test_the_straggler_step_runs_through_the_late_rank(store):
    db, truth = store
    con = connect(db, read_only=True)
    st = truth["planted"]["straggler"]
    coll = next(c for c in truth["planted"]["collectives"] if c["step"] == st["step"])
    others = max(a for r, a in enumerate(coll["true_arrival_ns"]) if r != st["rank"])
    late = coll["true_arrival_ns"][st["rank"]]
    assert late - others == st["delay_ns"]
    off = dict(con.execute("SELECT rank, offset_ns FROM clock_offsets WHERE job = 'planted'").fetchall())
    p = _path(con, "planted", st["step"])
    # through the delay (true times; the aligned clocks agree within the offsets' residuals)
    mid = [r for r in p if r[3] <= (others + late) // 2 < r[4]]
    assert mid and mid[0][0] == st["rank"]
    ranks = {r[0] for r in p if r[3] < late - 10_000}
    assert ranks == {st["rank"]}, "before its arrival, the path is the late rank's"
    # the steps without a straggler end on some rank's compute, not on a wait
    for step in (10, 12):
        p = _path(con, "planted", step)
        led = {}
        for r in p:
            led[r[5]] = led.get(r[5], 0) + r[4] - r[3]
        assert max(led, key=led.get) == "compute" and led.get("straggler", 0) == 0
    assert off  # offsets were read for every rank


def test_1f1b_path_climbs_the_stages_in_warm_up_and_descends_in_cool_down(store):
    db, _ = store
    con = connect(db, read_only=True)
    (step,) = _windows(con, "pp")
    # before stage 0's window begins (its first op is the path's first node) the path is a gap on the stage whose
    # window opened the step, waiting in its recv: a bubble
    p = _path(con, "pp", step)
    lead = list(itertools.takewhile(lambda r: r[1] == "gap", p))
    assert all(r[5] == "bubble" for r in lead) and sum(r[4] - r[3] for r in lead) < 1_000_000
    seq = [k for k, _ in itertools.groupby(r[0] for r in p[len(lead):])]
    assert seq[:4] == [0, 1, 2, 3], seq  # F0 through every stage
    assert seq[-4:] == [3, 2, 1, 0], seq  # the last backward back to stage 0
    p = _path(con, "pp", step)
    comp = sum(r[4] - r[3] for r in p if r[5] == "compute")
    # the path is the pipeline's compute chain: far more than one stage's own compute of 8 x (1.2 + 2.4) ms
    assert comp > 1.3 * 8 * 3_600_000


@pytest.mark.parametrize("planted,twin,kw", [
    ("planted", "no_straggler", {"remove": ("straggler",)}),
    ("planted", "no_gap", {"remove": ("launch_gaps",)}),
    ("slow_gemm", "no_straggler", {"scale": {"gemm": 0.5}}),
])
def test_whatif_on_the_planted_job_gives_its_twins_step_time(store, planted, twin, kw):
    db, _ = store
    con = connect(db, read_only=True)
    w = whatif(con, planted, **kw)
    m = whatif(con, twin)["measured_ns"]
    true_saving = w["measured_ns"] - m
    assert true_saving > 0
    assert abs(w["projected_ns"] - m) <= 0.02 * m
    assert abs(w["saved_ns"] - true_saving) <= 0.1 * true_saving
    for s, t in zip(w["steps"], whatif(con, twin)["steps"]):
        assert abs(s["projected_ns"] - t["measured_ns"]) <= 0.02 * t["measured_ns"]


def test_unchanged_replay_is_the_measurement_and_removals_rank(store):
    db, truth = store
    con = connect(db, read_only=True)
    w = whatif(con, "planted", scale={"gemm": 1.0})
    assert w["projected_ns"] == w["measured_ns"]
    wins = _windows(con, "planted")
    assert w["measured_ns"] == sum(b - a for a, b in wins.values())
    rows = rank_removals(con, "planted")
    assert [r["saved_ns"] for r in rows] == sorted((r["saved_ns"] for r in rows), reverse=True)
    assert all(0 <= r["saved_ns"] <= r["measured_ns"] for r in rows)
    strag = next(r for r in rows if r["remove"] == "straggler")
    assert abs(strag["saved_ns"] - truth["planted"]["straggler"]["delay_ns"]) <= 1000
    with pytest.raises(WhatIfError, match="cannot remove"):
        whatif(con, "planted", remove=("compute",))
    with pytest.raises(WhatIfError, match="no GPU ops of kernel class"):
        whatif(con, "planted", scale={"nosuchclass": 0.5})


def test_cli(store, tmp_path):
    db, _ = store

    def run(*args):
        return subprocess.run([sys.executable, "-m", "ninefold.cli.main", *args], cwd=ROOT, capture_output=True,
                              text=True)

    r = run("whatif", "--db", str(db), "--job", "planted")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].split()[0] == "remove" and any(x.startswith("straggler ") for x in lines)
    r = run("whatif", "--db", str(db), "--job", "slow_gemm", "--scale", "gemm=0.5")
    assert r.returncode == 0 and "gemm x0.5" in r.stdout, r.stderr
    r = run("whatif", "--db", str(db), "--job", "planted", "--scale", "gemm")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "KERNEL_CLASS=FACTOR" in r.stderr
    r = run("critical-path", "--db", str(db), "--job", "nope")
    assert r.returncode == 2 and "error: job 'nope' is not in the store" in r.stderr
    r = run("critical-path", "--db", str(db), "--job", "planted", "--step", "11")
    assert r.returncode == 0, r.stderr
    assert "step 11: critical path" in r.stdout and "rank 3 100.0%" in r.stdout


@needs_shared
def test_real_traces_give_well_formed_paths(db):
    # two ranks of a down-sampled TorchRec job (their SendRecv groups cross ranks), and single-rank GPU traces
    for r in (0, 1):
        load_kineto(db, SHARED_TRACES / f"hta/trace_filter/sampled_rank-{r}.json.gz", "t")
    attribute_job(db, "t")
    res = critical_path(db, "t")
    assert {s["step"] for s in res["steps"]} == {551, 552}
    _well_formed(db, "t")
    for i, rel in enumerate(["hta/nccl_parser_config/nccl_data.json.gz",
                             "hta/trace_diff/control/control.json.gz",
                             "tracelens/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
                             "hta/df_index_resolver/df_index_resolver.json.gz"]):
        job = f"r{i}"
        load_kineto(db, SHARED_TRACES / rel, job, rank=0)
        attribute_job(db, job)
        critical_path(db, job)
        _well_formed(db, job)
        w = whatif(db, job)
        assert w["projected_ns"] == w["measured_ns"]
    # a CPU-only 2-rank gloo job has no GPU timeline: said in one line, not a traceback
    for r in (0, 1):
        load_kineto(db, SHARED_TRACES / f"torch_cpu_gloo_2rank/rank-{r}.pt.trace.json", "gloo")
    attribute_job(db, "gloo")
    with pytest.raises(CriticalPathError, match="no GPU ops"):
        critical_path(db, "gloo")


def test_a_new_attribution_drops_the_results_computed_from_the_old(tmp_path):
    """critical_path and kernel_efficiency rows are computed from a job's attribution: re-attributing the job
    (new traces, other patterns) removes them, and leaves other jobs' rows alone."""
    from ninefold.analysis.efficiency import kernel_efficiency

    db = connect(tmp_path / "s.duckdb")
    for job in ("a", "b"):
        generate(tmp_path / job, ranks=2, steps=2, seed=1)
        ingest_paths(db, sorted((tmp_path / job).glob("rank-*.json")), job=job)
        attribute_job(db, job)
        critical_path(db, job)
        kernel_efficiency(db, job)

    def count(t, job):
        return db.execute(f"SELECT count(*) FROM {t} WHERE job = ?", [job]).fetchall()[0][0]

    assert all(count(t, j) > 0 for t in ("critical_path", "kernel_efficiency") for j in "ab")
    attribute_job(db, "a")
    assert count("critical_path", "a") == 0 and count("kernel_efficiency", "a") == 0
    assert count("critical_path", "b") > 0 and count("kernel_efficiency", "b") > 0
    critical_path(db, "a")
    assert count("critical_path", "a") > 0
