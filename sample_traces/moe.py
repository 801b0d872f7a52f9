"""Seeded expert-parallel (MoE) Kineto traces with all-to-all dispatch/combine and one overloaded expert rank.

    python -m sample_traces.moe OUT_DIR [--ranks 4] [--steps 2] [--layers 3] [--overloaded 2] [--seed 0]
    generate_moe(out_dir, ...) -> ground truth dict

Writes ``rank-<r>.json`` per rank and ``ground_truth.json``, with the writer functions and time conventions of
:mod:`sample_traces.generate` (``*_true_ns`` shared clock; files carry per-rank clock offsets).

Per step and MoE layer, on every rank: attention kernels, then the dispatch ``all_to_allv``
(``record_param_comms`` with ``In split size``/``Out split size`` in tokens, Seq shared by all members, the
``ncclDevKernel_SendRecv`` kernel NCCL launches for it), then the expert grouped GEMMs launched inside a
``moe::experts`` annotation, then the combine ``all_to_allv``. The router sends the overloaded rank
``overload`` times the tokens of the others, so its expert GEMMs run longer and every other rank waits for
it in the combine.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from .generate import (BASE_TIME_NS, COMM_STREAM, COMPUTE_STREAM, FIRST_STEP, FLASH_FWD, GEMM_H100, LAUNCH_LAT_NS,
                       NCCL_SENDRECV, STEP_SEPARATION_NS, RankTrace, clock_offsets, finish_comm, footer_text,
                       header_text, launch_comm, metadata_lines, open_out)

GROUPED_GEMM = ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_grouped_bf16_128x128_32x4_tn_align8>"
                "(cutlass_80_tensorop_bf16_s16816gemm_grouped_bf16_128x128_32x4_tn_align8::Params)")
GROUPED_TAIL = (', "registers per thread": 232, "shared memory": 81920, "blocks per SM": 1.0, '
                '"warps per SM": 4.0, "grid": [132, 1, 1], "block": [128, 1, 1], "est. achieved occupancy %": 6')
HIDDEN = 4096
TOKENS_PER_RANK = 8192            # tokens each rank routes per layer (top-k already applied)
EXPERT_NS_PER_TOKEN = 60          # two grouped GEMMs (up + down) together, per received token
A2A_GBPS = 400.0                  # bytes/ns = GB/s of the all-to-all transfer
EXPERTS_ANNOTATION = "moe::experts"


def _splits(world, overloaded, overload):
    """tokens[src][dst]: every rank sends its tokens with weight `overload` to the overloaded rank."""
    w = [overload if d == overloaded else 1.0 for d in range(world)]
    tot = sum(w)
    out = []
    for _src in range(world):
        row = [int(TOKENS_PER_RANK * x / tot) for x in w]
        row[overloaded] += TOKENS_PER_RANK - sum(row)
        out.append(row)
    return out


def _a2a_args(rank, world, seq, send, recv):
    return (f'"Collective name": "all_to_allv", "In msg nelems": {sum(send) * HIDDEN}, '
            f'"Out msg nelems": {sum(recv) * HIDDEN}, "In split size": "{send}", "Out split size": "{recv}", '
            f'"Group size": {world}, "dtype": "BFloat16", "Process Group Name": "1", '
            f'"Process Group Description": "ep_group", '
            f'"Process Group Ranks": "[{", ".join(str(r) for r in range(world))}]", "Rank": {rank}, "Seq": {seq}')


def _expert_gemm(rt: RankTrace, dur):
    """cpu_op -> cudaLaunchKernel -> grouped GEMM on the compute stream (like RankTrace.op_kernel)."""
    rng = rt.rng
    x, cid = rt.ids()
    t0 = rt.c
    rt_at = t0 + 2500 + rng.randrange(2000)
    rtd = 4000 + rng.randrange(2000)
    ks = max(rt_at + LAUNCH_LAT_NS, rt.g + 800 + rng.randrange(700))
    opd = rt_at - t0 + rtd + 1500
    rt.cpu("cpu_op", "aten::_grouped_mm", t0, opd, f'{{"External id": {x}}}')
    rt.runtime("cudaLaunchKernel", rt_at, rtd, cid, x, 211)
    rt.gpu("kernel", GROUPED_GEMM, COMPUTE_STREAM, ks, dur, cid, x, GROUPED_TAIL)
    rt.c = t0 + opd + 1000 + rng.randrange(2000)
    rt.g = ks + dur
    rt.kernel_count += 1
    return ks, ks + dur


def _all_to_all(rts, seq, splits, world, gt_calls, step_no, phase):
    """One all_to_allv across all ranks: arrival = when each rank's GPU is ready; ends together."""
    launched = []
    for r, rt in enumerate(rts):
        send = splits[r] if phase == "dispatch" else [splits[d][r] for d in range(world)]
        recv = [splits[s][r] for s in range(world)] if phase == "dispatch" else splits[r]
        args = _a2a_args(r, world, seq, send, recv)
        arrival, x, cid = launch_comm(rt, args)
        launched.append((arrival, x, cid, args, sum(send) * HIDDEN * 2, sum(recv) * HIDDEN * 2))
    last = max(a for a, *_ in launched)
    moved = max(max(s, r) for *_, s, r in launched)
    end = last + int(moved / A2A_GBPS) + 10_000
    for r, rt in enumerate(rts):
        a, x, cid, args, sb, rb = launched[r]
        finish_comm(rt, NCCL_SENDRECV, COMM_STREAM, a, end, x, cid, args)
        rt.g = end  # the experts (or the next layer) consume the all-to-all's output
    gt_calls.append({"step": step_no, "seq": seq, "phase": phase, "end_true_ns": BASE_TIME_NS + end,
                     "arrival_true_ns": [BASE_TIME_NS + a for a, *_ in launched],
                     "wait_ns": [last - a for a, *_ in launched],
                     "in_bytes": [sb for *_, sb, _rb in launched], "out_bytes": [rb for *_, rb in launched],
                     "last_rank": max(range(world), key=lambda i: launched[i][0])})


def generate_moe(out_dir, ranks=4, steps=2, layers=3, overloaded=2, overload=3.0, seed=0):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    W = int(ranks)
    if not 0 <= overloaded < W:
        raise ValueError(f"overloaded rank {overloaded} is not in 0..{W - 1}")
    rng = random.Random(seed)
    offsets = clock_offsets(W, rng)
    rts = [RankTrace(r, W, offsets[r], random.Random(seed * 1000 + 331 + r)) for r in range(W)]
    files = [f"rank-{r}.json" for r in range(W)]
    fhs = [open_out(out / f, False) for f in files]
    ep_pg = [{"pg_name": "1", "pg_desc": "ep_group", "backend_config": "cuda:nccl", "pg_size": W,
              "ranks": list(range(W))}]
    S = 2_000_000_000
    for r, rt in enumerate(rts):
        fhs[r].write(header_text(r, W, ep_pg) + metadata_lines(rt, S, (COMPUTE_STREAM, COMM_STREAM)))
    splits = _splits(W, overloaded, overload)
    recv_tokens = [sum(splits[s][r] for s in range(W)) for r in range(W)]
    calls = []
    expert_ns = [0] * W
    seq = 0
    windows = []
    for n in range(steps):
        step_no = FIRST_STEP + n
        for rt in rts:
            rt.c = max(rt.c, S + 5_000)
            rt.g = max(rt.g, S + 20_000)
        for _layer in range(layers):
            for rt in rts:
                rt.op_kernel("aten::mm", GEMM_H100, rt.jitter(300_000))
                rt.op_kernel("aten::_flash_attention_forward", FLASH_FWD, rt.jitter(250_000))
            seq += 1
            _all_to_all(rts, seq, splits, W, calls, step_no, "dispatch")
            for r, rt in enumerate(rts):
                a_s = rt.c
                x, _ = rt.ids()
                rt.c += 1500
                for _half in range(2):  # up and down projections
                    ks, ke = _expert_gemm(rt, recv_tokens[r] * EXPERT_NS_PER_TOKEN // 2)
                    expert_ns[r] += ke - ks
                rt.c += 1500
                rt.cpu("user_annotation", EXPERTS_ANNOTATION, a_s, rt.c - a_s, f'{{"External id": {x}}}')
            seq += 1
            _all_to_all(rts, seq, splits, W, calls, step_no, "combine")
        S_next = max(max(rt.c for rt in rts), max(rt.g for rt in rts)) + STEP_SEPARATION_NS
        for r, rt in enumerate(rts):
            x, _ = rt.ids()
            rt.cpu("user_annotation", f"ProfilerStep#{step_no}", S, S_next - S, f'{{"External id": {x}}}')
            rt.flush_to(fhs[r])
        windows.append([BASE_TIME_NS + S, BASE_TIME_NS + S_next])
        S = S_next
    for r, rt in enumerate(rts):
        fhs[r].write(footer_text(rt, S, str(out / files[r])))
        fhs[r].close()
    gt = {
        "generator": "sample_traces.moe.generate_moe", "seed": seed, "world_size": W, "num_steps": steps,
        "first_step": FIRST_STEP, "layers": layers, "hidden": HIDDEN, "dtype_bytes": 2,
        "overloaded_rank": overloaded, "overload": overload, "tokens_sent_per_rank": TOKENS_PER_RANK,
        "splits_tokens": splits, "recv_tokens_per_layer": recv_tokens,
        "expert_gemm_ns": expert_ns, "expert_kernel": GROUPED_GEMM, "experts_annotation": EXPERTS_ANNOTATION,
        "a2a_calls": calls, "a2a_in_bytes_total": [sum(c["in_bytes"][r] for c in calls) for r in range(W)],
        "a2a_wait_ns_total": [sum(c["wait_ns"][r] for c in calls) for r in range(W)],
        "windows_true_ns": windows, "clock_offsets_ns": offsets, "files": files,
    }
    with open(out / "ground_truth.json", "w") as fh:
        json.dump(gt, fh, indent=1)
    return gt


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m sample_traces.moe", description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--overloaded", type=int, default=2)
    ap.add_argument("--overload", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    gt = generate_moe(a.out_dir, ranks=a.ranks, steps=a.steps, layers=a.layers, overloaded=a.overloaded,
                      overload=a.overload, seed=a.seed)
    print(json.dumps({"out_dir": a.out_dir, "ranks": gt["world_size"], "overloaded_rank": gt["overloaded_rank"]}))


if __name__ == "__main__":
    main()
