"""ninefold efficiency: FLOPs of known shapes, nccl-tests' bus bandwidth against the tables nccl-tests printed,
a generated job end to end through the CLI, and real traces with recorded shapes against their device's peak."""
import gzip
import json
import subprocess
import sys

import pytest

from ninefold.analysis.attribution.attribute import attribute_job
from ninefold.analysis.efficiency import EfficiencyError, _dtype_peak, _peaks, compute_efficiency, kernel_efficiency
from ninefold.analysis.kernel_work import attention_flops, bus_bandwidth, bus_factor, gemm_flops, memory_bytes
from conftest import ROOT, SHARED_TRACES, needs_shared
from ninefold.ingest import nccl_tests
from ninefold.ingest.load import ingest_paths, load_kineto
from ninefold.store.connection import connect

BF = "c10::BFloat16"


# ---------------------------------------------------------------- FLOPs and bytes from shapes
def test_gemm_flops_of_known_shapes():
    assert gemm_flops("aten::mm", [[8944, 1024], [1024, 2816]], [BF, BF]) == (2.0 * 8944 * 1024 * 2816, "bf16")
    # addmm(bias, mat1, mat2, beta, alpha): the bias does not count
    assert gemm_flops("aten::addmm", [[30522], [141, 512], [512, 30522], [], []],
                      [BF, BF, BF, "Scalar", "Scalar"]) == (2.0 * 141 * 512 * 30522, "bf16")
    assert gemm_flops("aten::bmm", [[4, 32, 64], [4, 64, 16]], ["float", "float"]) == (2.0 * 4 * 32 * 64 * 16,
                                                                                       "fp32")
    assert gemm_flops("aten::baddbmm", [[4, 32, 16], [4, 32, 64], [4, 64, 16], [], []],
                      ["c10::Half"] * 3 + ["Scalar"] * 2) == (2.0 * 4 * 32 * 64 * 16, "fp16")
    assert gemm_flops("aten::_scaled_mm", [[128, 256], [256, 512], [], [], [], [], [], []],
                      ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", "float", "float", "", "", "", "Scalar"]) == \
        (2.0 * 128 * 256 * 512, "fp8")
    with pytest.raises(ValueError, match="do not multiply"):
        gemm_flops("aten::mm", [[8, 16], [32, 4]], [BF, BF])
    with pytest.raises(ValueError, match="two 2-D tensor operands"):
        gemm_flops("aten::mm", [[8, 16]], [BF])


def test_dtype_peaks_of_the_presets():
    h100, a100 = _peaks("H100"), _peaks("A100")
    assert _dtype_peak(h100, "bf16") == (989e12, None) and _dtype_peak(h100, "fp16") == (989e12, None)
    assert _dtype_peak(h100, "fp8") == (1979e12, None)
    assert _dtype_peak(a100, "fp8") == (312e12, None)            # no FP8 on A100: the BF16 peak
    assert _dtype_peak(a100, "fp32") == (156e12, None)           # float32 against TF32, the fastest it can run
    assert _dtype_peak(h100, "fp64")[1] == "no fp64 peak in the device preset"
    assert _dtype_peak(None, "bf16") == (None, None)


def test_attention_flops():
    q = [1, 141, 8, 64]
    dims = [q, q, q] + [[]] * 12
    types = [BF] * 3 + [""] * 12
    conc = ["", "", "", "", "", "141", "141", "0.", "False", "False", "0.125", "", "", "", ""]
    assert attention_flops("aten::_flash_attention_forward", dims, types, conc) == (
        4.0 * 1 * 8 * 141 * 141 * 64, "bf16", False)
    conc[8] = "True"
    assert attention_flops("aten::_flash_attention_forward", dims, types, conc) == (
        2.0 * 8 * (141 * 142 / 2) * 128, "bf16", True)
    # backward: 2.5 x forward; [B, H, S, D] layout of the sdpa ops
    bq = [2, 8, 256, 64]
    f_b, _, _ = attention_flops("aten::_scaled_dot_product_flash_attention_backward", [bq] * 6 + [[]] * 9,
                             [BF] * 6 + [""] * 9, [""] * 11 + ["False"] + [""] * 3)
    assert f_b == 2.5 * 4 * 2 * 8 * 256 * 256 * 64
    with pytest.raises(ValueError, match="is_causal not recorded"):
        attention_flops("aten::_flash_attention_forward", dims, types, None)
    with pytest.raises(ValueError, match="variable-length"):
        attention_flops("aten::_flash_attention_forward", [[141, 8, 64]] * 3 + [[2]] * 2, [BF] * 3 + ["int"] * 2,
                        conc)


def test_memory_bytes():
    assert memory_bytes("aten::add", [[4, 8], [8], []], [BF, BF, "Scalar"]) == (
        (32 + 8) * 2 + 32 * 2, "inputs read + output written")
    assert memory_bytes("aten::add_", [[4, 8], [4, 8], []], [BF, BF, "Scalar"])[0] == 3 * 32 * 2
    assert memory_bytes("aten::copy_", [[4, 8], [4, 8], []], [BF, "float", "Scalar"])[0] == 32 * 2 + 32 * 4
    assert memory_bytes("aten::eq", [[4, 8], []], ["long int", "Scalar"])[0] == 32 * 8 + 32
    assert memory_bytes("aten::fill_", [[1024], []], ["float", "Scalar"])[0] == 4096
    assert memory_bytes("aten::sum", [[64, 64], [], []], ["float", "ScalarList", "Scalar"])[1].endswith(
        "a lower bound)")
    for op in ("aten::index_select", "aten::cudnn_convolution"):
        with pytest.raises(ValueError):
            memory_bytes(op, [[4, 8], [], [3]], [BF, "Scalar", "long int"])


# ---------------------------------------------------------------- bus bandwidth as nccl-tests defines it
def test_bus_factors_are_nccl_tests():
    n = 8
    assert bus_factor("allreduce", n) == 2 * 7 / 8
    assert bus_factor("_allgather_base", n) == bus_factor("reduce_scatter_tensor", n) == 7 / 8
    assert bus_factor("all_to_all", n) == 7 / 8
    assert bus_factor("broadcast", n) == bus_factor("reduce", n) == bus_factor("send", n) == 1.0
    assert bus_factor("barrier", n) is None
    with pytest.raises(ValueError):
        bus_bandwidth("barrier", 1, 1.0, 2)


@needs_shared
def test_busbw_matches_the_table_nccl_tests_printed(db):
    """Every row of the real nccl-tests run in the corpus: algbw and busbw recomputed from size, time and the
    rank count with bus_bandwidth equal the columns nccl-tests printed (to their two decimals)."""
    log = SHARED_TRACES / "nccl_logs_repo" / "Timez-zx_nccl-tests" / "nccl.log"
    nccl_tests.load(db, log, "t")
    rows = db.execute("SELECT op, nranks, size_bytes, time_us, algbw_gbs, busbw_gbs FROM nccl_tests_results"
                      ).fetchall()
    assert len(rows) == 22
    for op, n, size, t_us, alg_p, bus_p in rows:
        alg, bus = bus_bandwidth(op, size, t_us * 1e-6, n)
        assert alg / 1e9 == pytest.approx(alg_p, rel=2e-3, abs=0.006), (size, t_us)
        assert bus / 1e9 == pytest.approx(bus_p, rel=2e-3, abs=0.006), (size, t_us)


@needs_shared
def test_busbw_matches_nccl_inspector_records():
    """NCCL Inspector's README records (8 ranks): all-reduce 2(n-1)/n; reduce-scatter (n-1)/n over the whole
    buffer (the record's message size is one rank's share)."""
    for f in sorted((SHARED_TRACES / "nccl_inspector").glob("*.json")):
        rec = json.loads(f.read_text())
        c, n = rec["coll_perf"], rec["header"]["n_ranks"]
        size = c["coll_msg_size_bytes"] * (n if c["coll"] in ("ReduceScatter", "AllGather") else 1)
        alg, bus = bus_bandwidth(c["coll"], size, c["coll_exec_time_us"] * 1e-6, n)
        assert alg / 1e9 == pytest.approx(c["coll_algobw_gbs"], rel=1e-6)
        assert bus / 1e9 == pytest.approx(c["coll_busbw_gbs"], rel=1e-6)


# ---------------------------------------------------------------- a generated job, end to end
@pytest.fixture(scope="module")
def gen_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("eff")
    out = d / "job"
    r = subprocess.run([sys.executable, "-m", "sample_traces.generate", str(out), "--ranks", "2", "--steps", "3",
                        "--seed", "0"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    con = connect(d / "e.duckdb")
    ingest_paths(con, sorted(out.glob("rank-*.json")), job="gen")
    attribute_job(con, "gen")
    ingest_paths(con, sorted(out.glob("rank-*.json")), job="unknown_gpu")
    con.execute("UPDATE traces SET device_name = 'Tesla V100-SXM2-32GB' WHERE job = 'unknown_gpu'")
    con.close()
    return d / "e.duckdb", json.loads((out / "ground_truth.json").read_text())


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ninefold.cli.main", "efficiency", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True)


def test_generated_job_end_to_end(gen_store):
    db, truth = gen_store
    r = _cli("--db", db, "--job", "gen", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rows = doc["rows"]
    assert doc["device"] == "device: ranks 0-1: H100 (from 'NVIDIA H100 80GB HBM3')"
    con = connect(db, read_only=True)
    stored = con.execute("SELECT count(*), count(DISTINCT rank) FROM kernel_efficiency WHERE job = 'gen'").fetchone()
    gpu = con.execute("SELECT count(*), sum(end_ns - start_ns) FROM gpu_ops WHERE job = 'gen' "
                      "AND kind IN ('kernel', 'memcpy', 'memset')").fetchone()
    con.close()
    assert stored == (len(rows), 2)
    assert (sum(x["calls"] for x in rows), sum(x["time_ns"] for x in rows)) == gpu  # every GPU op, once
    known = [x for x in rows if x["efficiency"] is not None]
    assert {x["kclass"] for x in known} >= {"allreduce", "memcpy", "memset"}
    for x in known:
        assert 0 < x["efficiency"] <= 1, x
        ideal = x["work"] / x["peak"] * 1e9
        assert abs(x["lost_ns"] - (x["time_ns"] - ideal)) <= 1
        assert x["efficiency"] == pytest.approx(ideal / x["time_ns"], rel=1e-9)
    # the generator's DtoH copies run at exactly bytes / 24 ns per byte: 24 GB/s against PCIe Gen5's 64
    dtoh = [x for x in known if x["kclass"] == "memcpy"]
    assert dtoh and all(x["achieved"] == pytest.approx(24e9, rel=1e-3) for x in dtoh)
    assert all(x["efficiency"] == pytest.approx(24 / 64, rel=1e-3) for x in dtoh)
    # all-reduce of 2 ranks: busbw = algbw; planted bus bandwidth 180 GB/s plus a fixed 15 us: never above it
    for x in (x for x in known if x["kclass"] == "allreduce"):
        assert x["achieved"] == pytest.approx(x["algbw"]) and x["achieved"] < 180e9
        c = truth["collectives"][0]
        assert c["dtype"] == "BFloat16" and x["work"] == pytest.approx(c["nelems"] * 2 * x["calls"])
    # the job is attributed: each rank's all-reduce time waiting for the last member is the generator's planted
    # wait (the straggler ledger); nothing else has a wait
    for rank in (0, 1):
        w = [x["wait_ns"] for x in rows if x["rank"] == rank and x["kclass"] == "allreduce"]
        assert w == [sum(c["wait_ns"][rank] for c in truth["collectives"])]
    assert sum(c["wait_ns"][0] for c in truth["collectives"]) > 1_000_000      # the planted straggler step
    assert all(x["wait_ns"] is None for x in rows if x["kclass"] != "allreduce")
    # the generator records no shapes: its GEMMs say so and carry no efficiency
    gemm = [x for x in rows if x["kclass"] == "gemm" and "sm90_xmma" in x["kernel"]]
    assert gemm and all(x["efficiency"] is None and x["lost_ns"] is None and x["work"] is None for x in gemm)
    assert all(x["note"] == "no Input Dims on the launching op aten::mm" for x in gemm)
    # ordered by lost time, the rows without it last
    lost = [x["lost_ns"] for x in rows]
    k = sum(v is not None for v in lost)
    assert all(v is None for v in lost[k:]) and lost[:k] == sorted(lost[:k], reverse=True)


def test_table_device_override_and_errors(gen_store, tmp_path):
    db, _ = gen_store
    t = _cli("--db", db, "--job", "gen", "--top", "3")
    assert t.returncode == 0, t.stderr
    lines = t.stdout.splitlines()
    assert lines[0].startswith("device: ranks 0-1: H100") and "lost against peak" in lines[1]
    assert "without known work" in t.stdout and "no Input Dims on the launching op aten::mm" in t.stdout
    a = json.loads(_cli("--db", db, "--job", "gen", "--format", "json", "--device", "a100").stdout)
    assert a["device"] == "device: ranks 0-1: A100 (--device)"
    cp = [x for x in a["rows"] if x["kclass"] == "memcpy"]
    assert cp and all(x["peak"] == 32e9 and x["efficiency"] == pytest.approx(0.75, rel=1e-3) for x in cp)
    u = _cli("--db", db, "--job", "unknown_gpu")
    assert u.returncode == 0
    assert u.stdout.splitlines()[0] == ("device: ranks 0-1: device 'Tesla V100-SXM2-32GB' matches no preset "
                                        "(A100, H100, H200, B200, MI300X); pass --device PRESET for efficiencies")
    con = connect(db, read_only=True)
    rows, _ = compute_efficiency(con, "unknown_gpu")
    con.close()
    assert rows and all(x["efficiency"] is None and x["lost_ns"] is None for x in rows)
    assert any(x["achieved"] for x in rows)       # the work is known; only the peak is not
    for args, msg in ((("--job", "nope"), f"error: job 'nope' is not in the store {db} (jobs: gen, unknown_gpu)"),
                      (("--job", "gen", "--device", "V100"),
                       "error: unknown hardware preset 'V100' (known: A100, H100, H200, B200, MI300X)")):
        e = _cli("--db", db, *args)
        assert e.returncode == 2 and e.stderr.strip() == msg and not e.stdout
    e = _cli("--db", tmp_path / "none.duckdb", "--job", "gen")
    assert e.returncode == 2 and e.stderr.strip() == (f"error: no store at {tmp_path / 'none.duckdb'}: create it "
                                                      f"with `ninefold ingest TRACES --db {tmp_path / 'none.duckdb'}`")
    assert not (tmp_path / "none.duckdb").exists()
    with pytest.raises(EfficiencyError):
        c = connect(tmp_path / "x.duckdb")
        try:
            kernel_efficiency(c, "gen")
        finally:
            c.close()


# ---------------------------------------------------------------- real traces with recorded shapes
BERT_H100 = SHARED_TRACES / "tracelens" / "traces" / "h100" / "gaunernst_bert-small-uncased__1016001.json.gz"


def _independent_flops(path, op):
    """Sum of 2·M·N·K over the kernels launched (by External id) by OP, straight from the JSON."""
    ev = json.load(gzip.open(path))["traceEvents"]
    ops = {e["args"]["External id"]: e for e in ev if e.get("cat") == "cpu_op" and e.get("name") == op}
    fl = 0.0
    for k in ev:
        x = (k.get("args") or {}).get("External id")
        if k.get("cat") == "kernel" and x in ops:
            d = ops[x]["args"]["Input Dims"]
            (m, kk), (_, n) = d[1], d[2]
            fl += 2 * m * kk * n
    return fl


@needs_shared
def test_real_h100_trace_gemms_within_peak(db):
    load_kineto(db, BERT_H100, "bert", rank=0)
    rows, devs = kernel_efficiency(db, "bert")
    assert devs == {0: {"preset": "H100", "from": "NVIDIA H100 80GB HBM3"}}
    gemm = [x for x in rows if x["unit"] == "FLOP/s" and x["basis"].startswith("aten::addmm")]
    assert len(gemm) >= 3
    for x in gemm:
        assert x["peak"] == 989e12 and 0 < x["efficiency"] <= 1, x
    assert sum(x["work"] for x in gemm) == pytest.approx(_independent_flops(BERT_H100, "aten::addmm"), rel=1e-9)
    fa = [x for x in rows if x["basis"] and x["basis"].startswith("aten::_flash_attention_forward")]
    assert fa and sum(x["work"] for x in fa) == pytest.approx(4 * 4 * 1 * 8 * 141 * 141 * 64)  # 4 calls, no mask
    assert all(0 < x["efficiency"] <= 1 for x in rows if x["efficiency"] is not None)
    miss = [x for x in rows if x["work"] is None]
    assert miss and all(x["note"] for x in miss)
    stored = db.execute("SELECT sum(time_ns), count(*) FROM kernel_efficiency WHERE job = 'bert'").fetchone()
    assert stored == (sum(x["time_ns"] for x in rows), len(rows))


@needs_shared
def test_real_a100_trace_links_launches_by_thread(db):
    """HTA's A100 trace of 2022 writes the correlation as the kernels' External id: the launching op is found as
    the innermost cpu op around the launch call on its thread; float32 GEMMs are measured against TF32."""
    load_kineto(db, SHARED_TRACES / "hta" / "trace_diff" / "control" / "control.json.gz", "ctl", rank=0)
    rows, devs = kernel_efficiency(db, "ctl")
    assert devs[0]["preset"] == "A100"
    mm = [x for x in rows if x["basis"] and x["basis"].startswith(("aten::mm", "aten::addmm", "aten::bmm"))]
    assert len(mm) >= 5 and all(x["peak"] == 156e12 and 0 < x["efficiency"] <= 1 for x in mm)
    assert all(0 < x["efficiency"] <= 1 for x in rows if x["efficiency"] is not None)
    comm = [x for x in rows if x["kclass"] == "allreduce"]
    assert comm and all(x["note"] == "allreduce: message size or dtype not recorded" for x in comm)


def test_shipped_four_rank_job_all_reduce_bus_bytes(db):
    """The shipped 4-rank data-parallel job: each all-reduce moves 2(n-1)/n = 1.5 times its buffer over the bus,
    the buffer being the ground truth's gradient elements in bf16."""
    ingest_paths(db, [str(ROOT / "sample_traces" / "dp4")])
    gt = json.loads((ROOT / "sample_traces" / "dp4" / "ground_truth.json").read_text())
    rows, _ = compute_efficiency(db, "dp4")
    ar = [x for x in rows if x["kclass"] == "allreduce"]
    assert sorted(x["rank"] for x in ar) == [0, 1, 2, 3]
    size = gt["collectives"][0]["nelems"] * 2
    for x in ar:
        assert x["calls"] == len(gt["collectives"]) and x["basis"].startswith("allreduce n=4 busbw x1.5")
        assert x["work"] == pytest.approx(1.5 * size * x["calls"])
        assert x["achieved"] == pytest.approx(1.5 * x["algbw"]) and 0 < x["efficiency"] <= 1
        assert x["algbw"] == pytest.approx(size * x["calls"] / (x["time_ns"] / 1e9))
