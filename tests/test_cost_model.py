"""Cost model formulas against hand-computed values, calibration fits, configuration errors, trace inference."""
import gzip
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ninefold.analysis.cost_model import calibrate, collectives as C, memory as M, moe, pipeline as PL
from ninefold.analysis.cost_model.compute import flops_per_token
from ninefold.analysis.cost_model.config import ConfigError, load_config, resolve
from ninefold.analysis.cost_model.hardware import Link, hardware, load_presets, preset_for_device
from ninefold.analysis.cost_model.timeline import StepPlan, step_ledgers
from tests.conftest import SHARED_TRACES, needs_shared

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "sample_traces" / "configs"


def write(tmp_path, text, name="c.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


# ---------------------------------------------------------------- memory
def test_zero_worked_example_70b():
    P = 70e9
    s0 = M.model_state_bytes(P, 0, 64)
    assert sum(s0.values()) == pytest.approx(1120e9)            # 16P unsharded
    s3 = M.model_state_bytes(P, 3, 64)
    assert sum(s3.values()) == pytest.approx(17.5e9)            # 16P/N
    # ZeRO-1: 4P + 12P/N, ZeRO-2: 2P + 14P/N, with P = 1e9, N = 8
    assert sum(M.model_state_bytes(1e9, 1, 8).values()) == pytest.approx(4e9 + 12e9 / 8)
    assert sum(M.model_state_bytes(1e9, 2, 8).values()) == pytest.approx(2e9 + 14e9 / 8)


def test_memory_ledger_of_shipped_70b_config():
    cfg = resolve(load_config(CONFIGS / "llama70b_zero3_64gpu.toml"))
    mem = M.memory_ledger(cfg, 0)
    assert mem["params"] + mem["grads"] + mem["optimizer"] == pytest.approx(17.5e9)
    # full recompute keeps 2·s·b·h per layer: 2·4096·1·8192·80 layers, one micro-batch in flight (pp = 1)
    assert mem["activations"] == pytest.approx(2 * 4096 * 8192 * 80)
    assert mem["pipeline_buffers"] == 0


def test_activation_memory_korthikanti_table2():
    s, b, h, a = 2048, 1, 4096, 32
    sbh = s * b * h
    assert M.activation_bytes_per_layer(s, b, h, a, 1, False, "none") == sbh * (34 + 5 * a * s / h)  # 114·sbh
    assert M.activation_bytes_per_layer(s, b, h, a, 1, False, "none") == 956_301_312
    assert M.activation_bytes_per_layer(s, b, h, a, 8, False, "none") == sbh * (10 + 24 / 8 + 5 * a * s / (h * 8))
    assert M.activation_bytes_per_layer(s, b, h, a, 8, True, "none") == 956_301_312 / 8
    assert M.activation_bytes_per_layer(s, b, h, a, 8, True, "selective") == 34 * sbh / 8
    assert M.activation_bytes_per_layer(s, b, h, a, 8, False, "selective") == sbh * 13
    assert M.activation_bytes_per_layer(s, b, h, a, 8, True, "full") == 2 * sbh


def test_moe_experts_sharded_over_ep(tmp_path):
    text = ("[model]\nlayers = 2\nhidden = 1024\nheads = 8\nffn_hidden = 4096\nseq_len = 1024\nvocab = 1000\n"
            "experts = 8\ntop_k = 2\nmlp = 'gelu'\n[parallel]\ndp = 8\nep = {ep}\n")
    a = resolve(load_config(write(tmp_path, text.format(ep=1), "a.toml")))
    b = resolve(load_config(write(tmp_path, text.format(ep=8), "b.toml")))
    pc = M.param_count(a)
    assert pc["expert"] == 2 * 8 * 2 * 1024 * 4096                 # layers · experts · 2 matrices · h · f
    assert pc["active"] == pc["dense"] + 2 * 2 * 2 * 1024 * 4096    # top-2 of the experts per token
    diff = M.memory_ledger(a)["params"] - M.memory_ledger(b)["params"]
    assert diff == pytest.approx(2 * pc["expert"] * (1 - 1 / 8))   # bf16 expert weights, 7/8 of them gone


# ---------------------------------------------------------------- collectives
def test_ring_and_tree_alpha_beta():
    link = Link(alpha=3e-6, beta=450e9)
    assert C.coll_time("allreduce", 1e9, 8, link) == pytest.approx(14 * 3e-6 + 2 * 7 / 8 * 1e9 / 450e9)
    assert C.coll_time("all_gather_into_tensor", 1e9, 8, link) == pytest.approx(7 * 3e-6 + 7 / 8 * 1e9 / 450e9)
    assert C.coll_time("reduce_scatter", 8e6, 4, link) == pytest.approx(3 * 3e-6 + 3 / 4 * 8e6 / 450e9)
    assert C.coll_time("all_to_allv", 8e6, 4, link) == pytest.approx(3 * 3e-6 + 3 / 4 * 8e6 / 450e9)
    assert C.coll_time("send", 1e6, 2, link) == pytest.approx(3e-6 + 1e6 / 450e9)
    assert C.coll_time("allreduce", 1e6, 8, link, algo="tree") == pytest.approx(6 * 3e-6 + 1.75 * 1e6 / 450e9)
    assert C.coll_time("allreduce", 1e9, 1, link) == 0.0
    assert C.exposed(1e-3, 0.3) == pytest.approx(0.7e-3)
    assert [C.BUSBW[k](8) for k in ("allreduce", "allgather", "reducescatter", "alltoall", "sendrecv")] == \
        [1.75, 0.875, 0.875, 0.875, 1.0]
    assert C.canonical("nccl:all_reduce") == "allreduce" and C.canonical("_reduce_scatter_base") == "reducescatter"
    assert C.canonical("barrier") is None


def test_hardware_presets_and_devices():
    pre = load_presets()
    assert set(pre) == {"A100", "H100", "H200", "H800", "B200", "MI300X"}
    # H800: H100's compute and memory, NVLink cut to 400 GB/s bidirectional (200 per direction)
    assert pre["H800"].peak_bf16 == pre["H100"].peak_bf16 and pre["H800"].hbm_bw == pre["H100"].hbm_bw
    assert pre["H800"].nvlink_beta == 200e9 < pre["H100"].nvlink_beta
    assert preset_for_device("NVIDIA H800") == "H800" and preset_for_device("NVIDIA H800 80GB HBM3") == "H800"
    assert pre["A100"].peak_bf16 == 312e12 and pre["H100"].peak_bf16 == 989e12
    assert pre["H200"].hbm_bytes == 141e9 and pre["B200"].hbm_bw == 8e12 and pre["MI300X"].peak_bf16 == 1307.4e12
    assert pre["A100"].peak("fp8") == 312e12           # no FP8 on A100: BF16 peak
    assert hardware("h100", {"ib_beta": 25e9}).ib_beta == 25e9
    assert preset_for_device("NVIDIA H100 80GB HBM3") == "H100"
    assert preset_for_device("AMD Instinct MI300X VF") == "MI300X"
    assert preset_for_device("Tesla V100-SXM2-32GB") is None


# ---------------------------------------------------------------- pipeline
def test_bubble_closed_forms():
    assert PL.bubble_fraction("1f1b", 4, 8) == pytest.approx(3 / 11)
    assert PL.bubble_fraction("gpipe", 4, 8) == pytest.approx(3 / 11)
    assert PL.bubble_fraction("interleaved", 4, 8, v=2) == pytest.approx(3 / 19)
    assert PL.bubble_fraction("zero-bubble", 4, 8) == pytest.approx(3 / 27)
    # DualPipe, PP = 8: (PP/2 − 1)(F&B + B − 3W) with F = 1, B(input) = 1, W = 1: 3 · (3 + 2 − 3) = 6
    assert PL.bubble_time("dualpipe", 8, 16, 1.0, 1.0, 1.0) == pytest.approx(6.0)
    assert PL.bubble_time("zero-bubble", 4, 8, 1.0, 1.0, 1.0) == pytest.approx(3.0)
    assert PL.bubble_time("1f1b", 1, 8, 1.0, 1.0, 1.0) == 0.0
    assert PL.in_flight_microbatches("gpipe", 4, 8) == 8
    assert [PL.in_flight_microbatches("1f1b", 4, 8, stage=s) for s in range(4)] == [4, 3, 2, 1]
    assert PL.in_flight_microbatches("interleaved", 4, 8, v=2) == pytest.approx(4 + 3 / 2)
    assert PL.in_flight_microbatches("dualpipe", 4, 8) == 5
    assert PL.param_copies("dualpipe") == 2 and PL.param_copies("1f1b") == 1


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_simulated_schedule_matches_closed_form_without_comm(schedule):
    """With no communication, every stage's bubble in the simulated step is (p−1)(t_f + t_b)."""
    plan = StepPlan(dp=1, tp=1, pp=4, ep=1, cp=1, schedule=schedule, m=8, fwd=[1000], bwd=[2000], rec=[0])
    led, _ev, win = step_ledgers(plan)
    for r in range(4):
        assert led[r]["compute"] == 8 * 3000
        assert led[r]["bubble"] == 3 * 3000
        assert sum(led[r].values()) == win[r][1] - win[r][0] == 11 * 3000


# ---------------------------------------------------------------- MoE and compute
def test_moe_payload_loads_and_wait():
    assert moe.a2a_payload_bytes(4096, 2, 4096, 2) == 4096 * 2 * 4096 * 2 == 67_108_864
    assert moe.expert_loads(4, 1.6) == pytest.approx([1.6, 0.8, 0.8, 0.8])
    assert moe.expert_loads(4, measured=[3, 1, 1, 1]) == pytest.approx([2.0, 2 / 3, 2 / 3, 2 / 3])
    assert moe.makespan([0.8, 1.6, 0.8]) == 1.6
    strag, exp = moe.combine_split(0.8, 1.6, 0.5, 0.2)
    assert strag == pytest.approx(0.7) and exp == pytest.approx(0.5)
    assert moe.combine_split(1.6, 1.6, 0.5, 0.2) == pytest.approx((0.0, 0.4))


def test_flops_per_token_6n_plus_attention(tmp_path):
    cfg = resolve(load_config(write(tmp_path, "[model]\nparameters = 1e9\nlayers = 10\nhidden = 1000\nheads = 10\n"
                                              "seq_len = 100\n")))
    f = flops_per_token(cfg)
    assert f["training"] == pytest.approx(6e9 + 12 * 10 * 1000 * 100)
    assert f["forward"] == pytest.approx(f["training"] / 3)


# ---------------------------------------------------------------- calibration
def test_fit_recovers_alpha_beta():
    sizes = np.logspace(4, 9, 12)
    alpha, beta = 5e-6, 100e9
    t = alpha * 14 + 1.75 * sizes / beta
    f = calibrate.fit_alpha_beta("allreduce", 8, sizes, t, "x")
    assert f.alpha == pytest.approx(alpha, rel=1e-6) and f.beta == pytest.approx(beta, rel=1e-6)
    assert f.time(1e8) == pytest.approx(alpha * 14 + 1.75e8 / beta)


def test_fit_from_nccl_tests_table_shape():
    sizes = [2 ** k for k in range(10, 31, 2)]
    rows = []
    for op, n, a, b, fac in (("AllReduce", 8, 20e-6, 180e9, 1.75), ("AllGather", 16, 30e-6, 40e9, 15 / 16)):
        steps = 14 if op == "AllReduce" else 15
        for s in sizes:
            t = a * steps + fac * s / b
            rows.append({"size_bytes": s, "time_us": t * 1e6, "op": op, "nranks": n, "placement": "out"})
            rows.append({"size_bytes": s, "time_us": t * 2e6, "op": op, "nranks": n, "placement": "in"})
    fits = {f.coll: f for f in calibrate.fit_nccl_tests(pl.DataFrame(rows))}
    assert fits["allreduce"].nranks == 8 and fits["allreduce"].source == "nccl-tests"
    assert fits["allreduce"].alpha == pytest.approx(20e-6, rel=1e-4)
    assert fits["allreduce"].beta == pytest.approx(180e9, rel=1e-4)      # out-of-place rows only
    assert fits["allgather"].beta == pytest.approx(40e9, rel=1e-4)
    with pytest.raises(ValueError, match="placement"):
        calibrate.fit_nccl_tests(pl.DataFrame(rows).drop("placement"))


def test_fit_from_generated_trace_excludes_straggler_wait(db):
    """dp4 plants a 2 ms late arrival in one step; the transfer part (last arrival → end) is the same in every
    step, so the fitted model reproduces the generator's transfer time."""
    from ninefold.ingest.load import ingest_paths

    ingest_paths(db, [str(ROOT / "sample_traces" / "dp4")], job="dp4")
    gt = json.loads((ROOT / "sample_traces" / "dp4" / "ground_truth.json").read_text())
    fits = calibrate.fit_from_trace(db, "dp4", alpha_prior=3e-6)
    ar = [f for f in fits if f.coll == "allreduce"]
    assert len(ar) == 1 and ar[0].nranks == 4 and ar[0].n == gt["num_steps"]
    nbytes = gt["collectives"][0]["nelems"] * 2
    assert ar[0].time(nbytes) * 1e9 == pytest.approx(gt["collectives"][0]["transfer_ns"], rel=1e-3)


def test_gemm_flops_shapes():
    assert calibrate.gemm_flops("aten::mm", "[[8944,1024],[1024,2816]]") == 2 * 8944 * 1024 * 2816
    assert calibrate.gemm_flops("aten::addmm", [[1024], [8944, 1024], [1024, 1024], [], []]) == 2 * 8944 * 1024 ** 2
    assert calibrate.gemm_flops("aten::bmm", [[4, 32, 64], [4, 64, 16]]) == 2 * 4 * 32 * 64 * 16
    assert calibrate.gemm_flops("aten::mm", "[[1]]") is None


@needs_shared
def test_gemm_achieved_on_real_trace(db):
    """A real MI300X torch.compile trace: aten::mm ops with Input Dims, kernels linked by External id. The
    figure is recomputed here straight from the JSON."""
    from ninefold.ingest.load import ingest_paths

    path = SHARED_TRACES / "tracelens" / "traces" / "torch_compile_triton" / "trace.json.gz"
    r = ingest_paths(db, [str(path)], job="tc", rank=0)
    assert r[0].status == "stored"
    got = calibrate.gemm_achieved(db, "tc")
    ev = json.load(gzip.open(path))["traceEvents"]
    ops = {e["args"]["External id"]: e for e in ev if e.get("cat") == "cpu_op" and e.get("name") == "aten::mm"}
    fl = us = 0.0
    for k in ev:
        x = (k.get("args") or {}).get("External id")
        if k.get("cat") == "kernel" and x in ops:
            (m_, kk), (_k2, n_) = ops[x]["args"]["Input Dims"][:2]
            fl += 2 * m_ * kk * n_
            us += k["dur"]
    assert got["kernels"] == 7
    assert got["achieved"] == pytest.approx(fl / (us * 1e-6), rel=1e-6)
    assert 0 < got["achieved"] < load_presets()["MI300X"].peak_bf16


# ---------------------------------------------------------------- configuration and inference
@pytest.mark.parametrize("text, where", [
    ("[parallel]\nschedule = 'looped'\n", "parallel.schedule"),
    ("[model]\nlayerz = 3\n", "model.layerz"),
    ("[parallel]\ntp = 1.5\n", "parallel.tp"),
    ("[overlap]\ndp = 1.5\n", "overlap.dp"),
    ("[hardware]\npreset = 'V100'\n", "hardware"),
    ("[bogus]\nx = 1\n", "[bogus]"),
    ("[model\n", None),
])
def test_config_errors_name_file_and_key(tmp_path, text, where):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert msg.startswith(str(p)) and "\n" not in msg
    if where:
        assert where in msg


def test_required_shape_missing(tmp_path):
    cfg = load_config(write(tmp_path, "[model]\nlayers = 2\n"))
    with pytest.raises(ConfigError, match="model.hidden"):
        resolve(cfg)


def test_inference_from_shipped_samples(db):
    from ninefold.analysis.cost_model.infer import infer
    from ninefold.ingest.load import ingest_paths

    ingest_paths(db, [str(ROOT / "sample_traces" / "dp4"), str(ROOT / "sample_traces" / "pp4_1f1b")])
    f = infer(db, "dp4")
    assert f["world_size"] == 4 and f["dp"] == 4 and f["preset"][0] == "H100"
    gt = json.loads((ROOT / "sample_traces" / "dp4" / "ground_truth.json").read_text())
    assert f["dp_grad_bytes"] == gt["collectives"][0]["nelems"] * 2
    g = infer(db, "pp4_1f1b")
    gtp = json.loads((ROOT / "sample_traces" / "pp4_1f1b" / "ground_truth.json").read_text())
    assert g["pp"] == gtp["stages"] and g["micro_batches"] == gtp["microbatches"]
    assert {v["axis"] for v in g["groups"].values()} == {"pp"} and "dp" not in g
    assert g["p2p_bytes"] == 8 * 4096 * 1024 * 2


def test_expert_loads_from_measured_split_sizes(tmp_path, db):
    """The generated MoE job routes 3x the tokens to one rank: the loads come from the dispatch all-to-alls'
    "Out split size" (first of each dispatch/combine pair), and every other rank waits for that rank."""
    from ninefold.analysis.cost_model.infer import infer
    from ninefold.analysis.cost_model.predict import predict
    from ninefold.ingest.load import ingest_paths
    from sample_traces.moe import generate_moe

    gt = generate_moe(tmp_path / "moe", ranks=4, steps=2, layers=3, overloaded=2, overload=3.0)
    ingest_paths(db, [str(tmp_path / "moe")], job="moe")
    f = infer(db, "moe")
    assert f["ep"] == 4 and f["groups"]["1"]["axis"] == "ep"
    per_call = [x / (gt["num_steps"] * gt["layers"]) for x in f["ep_loads"]]
    assert per_call == gt["recv_tokens_per_layer"]
    assert f["a2a_bytes"] == gt["tokens_sent_per_rank"] * gt["hidden"] * gt["dtype_bytes"]
    cfg = load_config(write(tmp_path, "[model]\nlayers = 3\nhidden = 4096\nheads = 32\nseq_len = 8192\n"
                                      "experts = 4\ntop_k = 1\n"))
    # the configured MFU, as before shape-free calibration: this test is about the loads (the generated job is
    # forward-only, so calibrating a training step's compute from its kernels is tested elsewhere)
    pred = predict(cfg, db, "moe", calibrate_from_trace=False)
    assert cfg.values["parallel.ep"].source == "trace" and cfg["parallel.dp"] == 4
    mean = sum(gt["recv_tokens_per_layer"]) / 4
    loads = next(v for k, v, _ in pred.details if k == "EP loads per EP index")
    assert loads == pytest.approx([x / mean for x in gt["recv_tokens_per_layer"]], abs=1e-3)
    led = pred.ledgers
    assert led[2]["straggler"] == 0
    assert all(led[r]["straggler"] > 0.1 * sum(led[r].values()) for r in (0, 1, 3))
    assert len({sum(d.values()) for d in led.values()}) == 1      # one step time: the busiest rank's


@needs_shared
def test_fit_from_real_nccl_tests_log(db):
    """A real all_reduce_perf run (2 ranks, 8 MB .. 8 GB) ingested by the nccl-tests loader: the relative
    least-squares fit follows every out-of-place row within 15% and its β is the large-message bus bandwidth."""
    from ninefold.ingest import nccl_tests

    path = SHARED_TRACES / "nccl_logs_repo" / "Timez-zx_nccl-tests" / "nccl.log"
    nccl_tests.load(db, path, "nt")
    fits = calibrate.fit_from_nccl_tests(db)
    assert [(f.coll, f.nranks, f.source) for f in fits] == [("allreduce", 2, "nccl-tests")]
    f = fits[0]
    rows = db.execute("SELECT size_bytes, time_us, busbw_gbs FROM nccl_tests_results WHERE placement = 'out' "
                      "ORDER BY size_bytes").fetchall()
    assert f.n == len(rows) > 5
    assert f.rms_rel < 0.1
    for size, t_us, _bw in rows:
        assert f.time(size) * 1e6 == pytest.approx(t_us, rel=0.15)
    assert f.beta / 1e9 == pytest.approx(rows[-1][2], rel=0.1)
    assert 0 < f.alpha < 1e-4
