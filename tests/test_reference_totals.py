"""The recorded ledger results (tests/reference_totals.py) of the planted jobs, the shipped samples and every
GPU trace of the shared corpus: each is rebuilt here, attributed, and must be found among the references and
reproduce them to the nanosecond (every other test's attribution runs are checked the same way, by conftest)."""
from pathlib import Path

import pytest

from ninefold.analysis.attribution.attribute import attribute_job
from conftest import _REF, ROOT, SHARED_TRACES, needs_shared
from ninefold.ingest.load import ingest_paths, load_kineto
from tests import reference_totals

SAMPLES = ROOT / "sample_traces"


def _gen_dp(d, seed, ranks):
    from sample_traces.generate import generate
    generate(d, ranks=ranks, steps=3, seed=seed)


def _gen_moe(d):
    from sample_traces.moe import generate_moe
    generate_moe(d, ranks=4, steps=2, seed=1)


def _gen_1f1b(d):
    from sample_traces.pipeline import generate_1f1b
    generate_1f1b(d, stages=4, microbatches=8, seed=2)


def _gen_ckpt(d):
    from sample_traces.checkpointed import generate_checkpointed
    generate_checkpointed(d, ranks=2, steps=2, seed=4)


def _gen_a2a(d):
    from sample_traces.alltoall2023 import generate_a2a
    generate_a2a(d, ranks=8, steps=2, seed=5)


PLANTED = {
    "dp4-seed0": lambda d: _gen_dp(d, 0, 4), "dp8-seed7": lambda d: _gen_dp(d, 7, 8), "moe4": _gen_moe,
    "pp4-1f1b": _gen_1f1b, "checkpointed2": _gen_ckpt, "a2a8": _gen_a2a,
}
SHIPPED = {"dp4": "rank-*.json*", "pp4_1f1b": "stage-*.json*"}  # (gloo_capture has no GPU ops)
SHARED_SINGLE = [
    "hta/nccl_parser_config/nccl_data.json.gz",
    "hta/trace_diff/control/control.json.gz",
    "hta/trace_diff/test/test.json.gz",
    "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "kineto_tb_plugin/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "tracelens/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "hta/df_index_resolver/df_index_resolver.json.gz",
]
SHARED_MULTI = {"sampled-pair": ["hta/trace_filter/sampled_rank-0.json.gz", "hta/trace_filter/sampled_rank-1.json.gz"]}


def _check(db, job):
    attribute_job(db, job)  # conftest compares with the reference when the key is recorded
    key = reference_totals.input_key(db, job, None, None)
    ref = _REF  # the recorded references (conftest loads them once per session)
    assert key in ref, f"job {job!r}: no recorded reference for these inputs (record with NINEFOLD_RECORD_REFERENCE=1)"
    assert reference_totals.compare(ref[key], reference_totals.results(db, job)) is None
    assert ref[key]["totals"], "a reference with no windows proves nothing"


def _ingest(db, files, job):
    res = ingest_paths(db, [Path(f) for f in files], job=job)
    assert all(r.status == "stored" for r in res), [r.message for r in res]


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_jobs_reproduce_the_recorded_ledgers(db, tmp_path, name):
    PLANTED[name](tmp_path / name)
    _ingest(db, sorted(p for p in (tmp_path / name).glob("*.json*") if p.name != "ground_truth.json"), name)
    _check(db, name)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_samples_reproduce_the_recorded_ledgers(db, name):
    _ingest(db, sorted((SAMPLES / name).glob(SHIPPED[name])), name)
    _check(db, name)


@needs_shared
@pytest.mark.parametrize("rel", SHARED_SINGLE)
def test_shared_gpu_traces_reproduce_the_recorded_ledgers(db, rel):
    load_kineto(db, SHARED_TRACES / rel, "j", rank=0)
    _check(db, "j")


@needs_shared
@pytest.mark.parametrize("name", sorted(SHARED_MULTI))
def test_shared_multirank_traces_reproduce_the_recorded_ledgers(db, name):
    _ingest(db, [SHARED_TRACES / r for r in SHARED_MULTI[name]], name)
    _check(db, name)
