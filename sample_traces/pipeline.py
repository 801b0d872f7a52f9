"""Seeded 1F1B pipeline-parallel Kineto traces (one file per stage rank) with a known bubble.

    generate_1f1b(out_dir, stages=4, microbatches=8, seed=0) -> ground truth dict

Writes ``stage-<s>.json`` per stage plus ``ground_truth.json``.  Same file format and time
conventions as :mod:`sample_traces.generate` (``*_true_ns`` shared clock, ``*_abs_ns`` = as in
that stage's file = true + clock_offset_ns).

Model: forward of one micro-batch = 4 back-to-back compute kernels summing exactly to F ns,
backward = the same kernels at 2x (exactly 2F).  Activations / gradients move with
``ncclDevKernel_SendRecv`` kernels (record_param_comms "send"/"recv", one process group per stage
pair, Group size 2).  Send kernels run [producer end, producer end + T] on the sender; the recv
kernel is posted early by the CPU and waits, ending at producer end + T; the consumer compute
starts only after that.  Forward send/recv use stream 20/21, backward send/recv stream 22/23.
The compute stream is 7.  The CPU thread runs ahead and finally blocks in cudaDeviceSynchronize.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from ninefold.analysis.cost_model.pipeline import simulate

from .generate import (BASE_TIME_NS, COMPUTE_STREAM, FIRST_STEP, GEMM_AMPERE, GEMM_H100, FLASH_FWD,
                       LAUNCH_LAT_NS, NCCL_SENDRECV, ELEM_ADD, RankTrace, _TAILS, clock_offsets,
                       footer_text, header_text, metadata_lines, open_out)

FWD_NS = 1_200_000
P2P_NS = 20_000
FWD_SPLIT = [(("aten::mm", GEMM_H100), 0.35), (("aten::_flash_attention_forward", FLASH_FWD), 0.25),
             (("aten::mm", GEMM_AMPERE), 0.3), (("aten::add", ELEM_ADD), 0.10)]
S_FWD, R_FWD, S_BWD, R_BWD = 20, 21, 22, 23


def generate_1f1b(out_dir, stages=4, microbatches=8, seed=0):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    p, m = int(stages), int(microbatches)
    rng = random.Random(seed)
    offsets = clock_offsets(p, rng)
    F = FWD_NS
    T = P2P_NS
    S0 = 2_000_000_000
    t_first = S0 + 400_000  # first forward on stage 0 starts here (CPU launched it earlier)
    # the cost model's own list schedule of 1F1B (backward = 2 x forward), from the first forward's start
    progs, start, end = simulate("1f1b", p, m, F, 2 * F, T, free0=[t_first] * p)
    pgs = [{"pg_name": str(1 + s), "pg_desc": f"pp_{s}_{s + 1}", "backend_config": "cuda:nccl",
            "pg_size": 2, "ranks": [s, s + 1]} for s in range(p - 1)]
    seqs = {}  # (pg, direction-free) seq counters are shared by both ends: key pg index
    files = [f"stage-{s}.json" for s in range(p)]
    rts = [RankTrace(s, p, offsets[s], random.Random(seed * 1000 + 91 + s)) for s in range(p)]
    W0 = start[("F", 0, 0)]
    W1 = max(end[("B", s, m - 1)] for s in range(p))
    step_end = W1 + 30_000
    # pre-compute the transfers so that both ends agree on Seq / timing
    transfers = {}  # (kind, s_from, i) -> dict
    for s in range(p):
        for kind, i in progs[s]:
            if kind == "F" and s < p - 1:
                pg = s
                x0 = end[("F", s, i)]
                transfers[("F", s, i)] = {"pg": pg, "start": x0, "end": x0 + T, "src": s, "dst": s + 1}
            if kind == "B" and s > 0:
                pg = s - 1
                x0 = end[("B", s, i)]
                transfers[("B", s, i)] = {"pg": pg, "start": x0, "end": x0 + T, "src": s, "dst": s - 1}
    # Seq: per process group, in order of transfer start time (both ends see the same number)
    for key in sorted(transfers, key=lambda k: transfers[k]["start"]):
        tr = transfers[key]
        seqs[tr["pg"]] = seqs.get(tr["pg"], 0) + 1
        tr["seq"] = seqs[tr["pg"]]
    nelems = 8 * 4096 * 1024  # activation of one micro-batch (bf16)

    def cargs(tr, me, coll):
        pg = tr["pg"]
        return (f'"Collective name": "{coll}", "In msg nelems": {nelems}, "Out msg nelems": {nelems}, '
                f'"Group size": 2, "dtype": "BFloat16", "Process Group Name": "{pg + 1}", '
                f'"Process Group Description": "pp_{pg}_{pg + 1}", '
                f'"Process Group Ranks": "[{pg}, {pg + 1}]", "Rank": {me - pg}, "Seq": {tr["seq"]}')

    gt_stages = []
    for s, rt in enumerate(rts):
        fh = open_out(out / files[s], False)
        fh.write(header_text(s, p, pgs) + metadata_lines(rt, S0, (COMPUTE_STREAM, S_FWD, R_FWD, S_BWD, R_BWD)))
        rt.c = S0 + 5_000
        stream_free = {S_FWD: 0, R_FWD: 0, S_BWD: 0, R_BWD: 0}
        busy = 0
        n_p2p = 0

        def p2p(tr, coll, stream, wait_start):
            nonlocal n_p2p
            x, cid = rt.ids()
            t0 = rt.c
            rtt = t0 + 3000
            rt.cpu("cpu_op", "record_param_comms", t0, 12_000, f'{{"External id": {x}, {cargs(tr, s, coll)}}}')
            rt.runtime("cudaLaunchKernel", rtt, 5000, cid, x, 211)
            rt.c = t0 + 14_000
            ks = tr["start"] if coll == "send" else max(rtt + LAUNCH_LAT_NS, stream_free[stream])
            assert rtt + LAUNCH_LAT_NS <= ks <= tr["start"]
            rt.gpu("kernel", NCCL_SENDRECV, stream, ks, tr["end"] - ks, cid, x,
                   _TAILS[NCCL_SENDRECV] + ", " + cargs(tr, s, coll))
            stream_free[stream] = tr["end"]
            n_p2p += 1

        for kind, i in progs[s]:
            if kind == "F" and s > 0:
                p2p(transfers[("F", s - 1, i)], "recv", R_FWD, True)
            if kind == "B" and s < p - 1:
                p2p(transfers[("B", s + 1, i)], "recv", R_BWD, True)
            blk_s = start[(kind, s, i)]
            total = F if kind == "F" else 2 * F
            t = blk_s
            for j, ((cname, kname), frac) in enumerate(FWD_SPLIT):
                d = total - (t - blk_s) if j == len(FWD_SPLIT) - 1 else int(total * frac)
                x, cid = rt.ids()
                t0 = rt.c
                rtt = t0 + 3000
                assert rtt + LAUNCH_LAT_NS <= t, "CPU fell behind the GPU"
                name = cname if kind == "F" else ("aten::mm" if "mm" in cname else cname + "_backward")
                rt.cpu("cpu_op", name, t0, 12_000, f'{{"External id": {x}}}')
                rt.runtime("cudaLaunchKernel", rtt, 5000, cid, x, 211)
                rt.gpu("kernel", kname, COMPUTE_STREAM, t, d, cid, x, _TAILS[kname])
                rt.c = t0 + 14_000
                t += d
                busy += d
            assert t == end[(kind, s, i)]
            if kind == "F" and s < p - 1:
                p2p(transfers[("F", s, i)], "send", S_FWD, False)
            if kind == "B" and s > 0:
                p2p(transfers[("B", s, i)], "send", S_BWD, False)
        # final device synchronize
        last_gpu = max(e for _, e in rt.gpu_iv)
        x, cid = rt.ids()
        rt.runtime("cudaDeviceSynchronize", rt.c, last_gpu + 2000 - rt.c, cid, None, 165)
        x, _ = rt.ids()
        rt.cpu("user_annotation", f"ProfilerStep#{FIRST_STEP}", S0, step_end - S0, f'{{"External id": {x}}}')
        rt.flush_to(fh)
        fh.write(footer_text(rt, step_end, str(out / files[s])))
        fh.close()
        first_f = start[("F", s, 0)]
        last_b = end[("B", s, m - 1)]
        window = W1 - W0
        idle_total = window - busy
        before = first_f - W0
        after = W1 - last_b
        c = rt.counts
        gt_stages.append({
            "stage": s, "rank": s, "file": files[s], "pid": rt.pid, "clock_offset_ns": rt.off,
            "counts": {"kernel": c.get("kernel", 0), "compute_kernels": m * 2 * len(FWD_SPLIT),
                       "p2p_kernels": n_p2p, "gpu_memcpy": 0, "gpu_memset": 0, "profiler_steps": 1},
            "first_forward_start_true_ns": BASE_TIME_NS + first_f,
            "first_forward_start_abs_ns": BASE_TIME_NS + first_f + rt.off,
            "last_backward_end_true_ns": BASE_TIME_NS + last_b,
            "last_backward_end_abs_ns": BASE_TIME_NS + last_b + rt.off,
            "compute_busy_ns": busy,
            "idle_before_first_forward_ns": before,
            "idle_after_last_backward_ns": after,
            "idle_between_ns": idle_total - before - after,
            "idle_total_ns": idle_total,
            "bubble_fraction_actual": idle_total / window,
        })
    gt = {
        "generator": "sample_traces.pipeline.generate_1f1b",
        "seed": seed, "stages": p, "microbatches": m, "base_time_ns": BASE_TIME_NS, "step": FIRST_STEP,
        "forward_ns": F, "backward_ns": 2 * F, "p2p_transfer_ns": T,
        "theoretical_bubble_fraction": (p - 1) / (m + p - 1),
        "window_true_ns": [BASE_TIME_NS + W0, BASE_TIME_NS + W1],
        "window_ns": W1 - W0,
        "streams": {"compute": COMPUTE_STREAM, "send_fwd": S_FWD, "recv_fwd": R_FWD,
                    "send_bwd": S_BWD, "recv_bwd": R_BWD},
        "process_groups": pgs,
        "schedule": [[f"{k}{i}" for k, i in prog] for prog in progs],
        "stage_info": gt_stages,
    }
    with open(out / "ground_truth.json", "w") as fh:
        json.dump(gt, fh, indent=1)
    return gt
