"""Attribution on real GPU traces of the shared corpus: conservation and the compute-busy identity."""
import pytest

from ninefold.analysis.attribution.attribute import attribute_job
from ninefold.analysis.classify import classify_kernel
from ninefold.analysis.intervals import union
from conftest import SHARED_TRACES, needs_shared
from ninefold.ingest.load import load_kineto

pytestmark = needs_shared

GPU_TRACES = [
    "hta/nccl_parser_config/nccl_data.json.gz",
    "hta/trace_diff/control/control.json.gz",
    "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "kineto_tb_plugin/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "tracelens/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "hta/df_index_resolver/df_index_resolver.json.gz",
]


@pytest.mark.parametrize("rel", GPU_TRACES)
def test_real_trace_ledgers(db, rel):
    load_kineto(db, SHARED_TRACES / rel, "j", rank=0)
    attribute_job(db, "j")
    wins = db.execute("SELECT step, start_ns, end_ns FROM step_windows WHERE job = 'j' ORDER BY step").fetchall()
    assert wins
    ops = db.execute("SELECT name, start_ns, end_ns FROM gpu_ops WHERE kind = 'kernel'").fetchall()
    comp = [(s, e) for n, s, e in ops if classify_kernel(n)[0] == "compute"]
    for step, w0, w1 in wins:
        tot = dict(db.execute("SELECT ledger, ns FROM ledger_totals WHERE step = ?", [step]).fetchall())
        assert sum(tot.values()) == w1 - w0
        assert min(tot.values()) >= 0
        us, ue = union([max(s, w0) for s, e in comp], [min(e, w1) for s, e in comp])
        assert tot["compute"] + tot["recompute"] == int((ue - us).sum())


def test_single_rank_of_multirank_job_charges_comm_as_exposed_and_flags_it(db):
    # rank 0 of a 2-rank DDP job: its AllReduce peers are absent
    load_kineto(db, SHARED_TRACES / "hta/nccl_parser_config/nccl_data.json.gz", "j", rank=0)
    attribute_job(db, "j")
    tot = dict(db.execute("SELECT ledger, sum(ns) FROM ledger_totals GROUP BY ledger").fetchall())
    assert tot["exposed_comm"] > 0 and tot["straggler"] == 0
    d = db.execute("SELECT count FROM diagnostics WHERE code = 'unmatched_comm'").fetchone()
    assert d is not None and d[0] > 0
