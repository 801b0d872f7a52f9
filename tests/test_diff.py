"""ninefold diff on generated twins: the same seeded job with every GEMM 10 % slower is flagged on compute and
on the gemm class with the generator's own delta; two seeds of the same job (only step-to-step noise) flag
nothing; kernels are matched by normalised name; new and vanished kernels are told."""
import json
import subprocess
import sys

import pytest

from ninefold.analysis.attribution.attribute import attribute_job
from ninefold.analysis.diff import DiffError, diff_jobs, normalise_kernel
from ninefold.analysis.ledgers import LEDGERS
from conftest import ROOT, SHARED_TRACES, needs_shared
from ninefold.ingest.load import ingest_paths, load_kineto
from sample_traces.alltoall2023 import generate_a2a
from sample_traces.generate import generate
from ninefold.store.connection import connect

STEPS = 12


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("diff")
    con = connect(d / "d.duckdb")
    truth = {}
    for job, seed, scale in (("base", 0, 1.0), ("slow_gemm", 0, 1.1), ("noise", 1, 1.0)):
        gt = generate(d / job, ranks=2, steps=STEPS, seed=seed, gemm_scale=scale)
        truth[job] = sum(s["compute_kernel_ns"] for r in gt["ranks"] for s in r["steps"]) / STEPS
        ingest_paths(con, sorted((d / job).glob("rank-*.json")), job=job)
        attribute_job(con, job)
    generate_a2a(d / "a2a", ranks=2, steps=2, seed=0)
    ingest_paths(con, sorted((d / "a2a").glob("rank-*.json")), job="a2a")
    attribute_job(con, "a2a")
    con.close()
    return d / "d.duckdb", truth


def _rows(db, a, b):
    con = connect(db, read_only=True)
    try:
        return {(r["level"], r["key"]): r for r in diff_jobs(con, a, b)}
    finally:
        con.close()


def test_ten_percent_slower_gemms_are_flagged_with_the_generators_delta(store):
    db, truth = store
    rows = _rows(db, "base", "slow_gemm")
    sig = {k for k, r in rows.items() if r["significant"]}
    assert {("ledger", "compute"), ("kclass", "gemm"), ("ledger", "step")} <= sig
    assert not {k for k in sig if k[0] in ("ledger", "kclass") and k[1] not in ("compute", "gemm", "step")}
    assert not [k for k in sig if k[0] == "kernel" and "gemm" not in k[1]]  # only GEMM kernels moved
    g = rows[("kclass", "gemm")]
    step = rows[("ledger", "step")]["a_ns"]
    want = truth["slow_gemm"] - truth["base"]  # every compute kernel's time per step, per the generator
    assert abs(g["delta_ns"] - want) / step <= 0.01, (g["delta_ns"], want)
    assert g["ci_low_ns"] <= want <= g["ci_high_ns"] and g["ci_low_ns"] > 0
    assert g["delta_share"] == pytest.approx(g["delta_ns"] / step)


def test_step_to_step_noise_alone_flags_nothing(store):
    db, _ = store
    rows = _rows(db, "base", "noise")
    assert [k for k, r in rows.items() if r["significant"]] == []
    assert any(r["delta_ns"] != 0 for r in rows.values())  # the runs do differ, within their noise


def test_kernels_are_matched_by_normalised_name_and_new_ones_are_told(store):
    a = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
    b = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64_warpgroupsize2x1x1_execute_segment_k_off"
    assert normalise_kernel(a) == normalise_kernel(b)
    assert normalise_kernel("void at::native::vectorized_elementwise_kernel<4, Add<float>>(int, Add<float>)") == \
        normalise_kernel("void at::native::vectorized_elementwise_kernel<8, Add<c10::BFloat16>>(int, Add<bf16>)")
    assert normalise_kernel(a) != normalise_kernel("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn")
    db, _ = store
    rows = _rows(db, "base", "a2a")
    status = {r["status"] for (lv, _), r in rows.items() if lv == "kernel"}
    assert {"new", "vanished"} <= status
    for r in rows.values():
        if r["status"] == "new":
            assert r["a_ns"] == 0 and r["b_ns"] > 0
        if r["status"] == "vanished":
            assert r["b_ns"] == 0 and r["a_ns"] > 0


def test_diff_cli_json_and_errors(store, tmp_path):
    db, _ = store
    cli = [sys.executable, "-m", "ninefold.cli.main", "diff", "--db", str(db)]
    r = subprocess.run(cli + ["base", "slow_gemm", "--format", "json"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    need = {"level", "key", "a_ns", "b_ns", "delta_ns", "ci_low_ns", "ci_high_ns", "significant"}
    assert rows and all(need <= set(x) for x in rows)
    assert {x["level"] for x in rows} == {"ledger", "kclass", "coll", "kernel"}
    t = subprocess.run(cli + ["base", "slow_gemm"], cwd=ROOT, capture_output=True, text=True)
    assert t.returncode == 0 and "kclass  gemm" in t.stdout and "*" in t.stdout
    bad = subprocess.run(cli + ["base", "nope"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: job 'nope' is not in the store ")
    fresh = tmp_path / "f.duckdb"
    c = connect(fresh)
    generate_a2a(tmp_path / "j", ranks=2, steps=1, seed=0)
    ingest_paths(c, sorted((tmp_path / "j").glob("rank-*.json")), job="j")
    with pytest.raises(DiffError, match="run `ninefold attribute` first"):
        diff_jobs(c, "j", "j")
    c.close()


@needs_shared
def test_real_traces_a100_control_against_v100_test(tmp_path):
    """HTA's trace-diff pair (rank 3 of an A100 job, rank 1 of a V100 job, six steps each): the V100 run's step
    is longer beyond doubt; a job against a second copy of itself moves nothing."""
    con = connect(tmp_path / "r.duckdb")
    for job, rel in (("control", "control/control.json.gz"), ("test", "test/test.json.gz")):
        load_kineto(con, SHARED_TRACES / "hta" / "trace_diff" / rel, job, rank=0)
        attribute_job(con, job)
    load_kineto(con, SHARED_TRACES / "hta" / "trace_diff" / "control" / "control.json.gz", "control2", rank=0)
    attribute_job(con, "control2")
    rows = {(r["level"], r["key"]): r for r in diff_jobs(con, "control", "test")}
    assert {("ledger", n) for n in ("step",) + tuple(LEDGERS)} <= set(rows)
    step = rows[("ledger", "step")]
    assert step["significant"] and step["delta_ns"] > 0.3 * step["a_ns"]
    assert all(r["ci_low_ns"] <= r["delta_ns"] <= r["ci_high_ns"] for r in rows.values())
    assert {r["status"] for r in rows.values()} >= {"same", "new", "vanished"}  # A100 and V100 kernels differ
    same = diff_jobs(con, "control", "control2")
    assert same and all(r["delta_ns"] == 0 and not r["significant"] and r["status"] == "same" for r in same)
    con.close()
