"""Seeded generator of realistic multi-rank PyTorch-profiler (Kineto Chrome-trace JSON) traces
with known, planted timings.  Standard library only.

    python -m sample_traces.generate OUT_DIR [--ranks 4] [--steps 3] [--seed 0] [--gzip] [--target-mb N]
        [--gemm-scale F] [--straggler-delay-ns N] [--host-gap-ns N] [--host-op-ns N | --cpu-ahead-ns N]

writes ``OUT_DIR/rank-<r>.json`` (``.json.gz`` with --gzip) and ``OUT_DIR/ground_truth.json``.
``generate(out_dir, ...)`` does the same and returns the ground-truth dict.

Time conventions (all ground-truth times are integer nanoseconds):

* ``*_true_ns``  absolute Unix ns on the one true reference clock shared by all ranks.
* ``*_abs_ns``   absolute Unix ns as that rank's file shows it
  (= baseTimeNanoseconds + ts*1000 = true + the rank's ``clock_offset_ns``).

The file text is written by hand, one event per line, with ``ts``/``dur`` printed as
``<ns//1000>.<ns%1000:03d>`` exactly like kineto's ``fmtTs``.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from .kineto_writer import *  # noqa: F401,F403  (the generators import the writer's names from here too)
from .kineto_writer import _TAILS, _j, _union_ns  # noqa: F401


# ====================================================================== host pacing
class PacedRankTrace(RankTrace):
    """A rank whose host is paced against its GPU before each compute kernel's launch (the launches after a
    planted gap excepted): HOST_OP_NS of untraced host time first (Python, dispatch: a launch-bound job whose GPU
    starves when kernels are shorter), or held back until the GPU is within CPU_AHEAD_NS of the launch (a full
    launch queue, a busy-poll: a GPU-bound job whose host runs that far ahead of its GPU). No random draw
    changes: the job is its unpaced twin's, paced."""

    host_op_ns = 0
    cpu_ahead_ns = None

    def op_kernel(self, cpu_name, kname, kdur, rt_at=None, stream=COMPUTE_STREAM, compute=True):
        if rt_at is None:
            self.c += self.host_op_ns
            if self.cpu_ahead_ns is not None:
                self.c = max(self.c, self.g - self.cpu_ahead_ns)
        return super().op_kernel(cpu_name, kname, kdur, rt_at=rt_at, stream=stream, compute=compute)


# ====================================================================== data-parallel steps
def _phase_forward_backward(rt: RankTrace, S, layers, ckpt_layers, st, host_gap_ns=HOST_GAP_NS):
    rng = rt.rng
    # (d) dataloader wait
    dl_s = S + 4000 + rng.randrange(4000)
    x, _ = rt.ids()
    rt.cpu("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
           dl_s, DATALOADER_NS, f'{{"External id": {x}}}')
    st["dataloader"] = {"ns": DATALOADER_NS, "start_true_ns": BASE_TIME_NS + dl_s,
                        "start_abs_ns": BASE_TIME_NS + dl_s + rt.off}
    rt.c = dl_s + DATALOADER_NS + 3000 + rng.randrange(2000)

    # (f') memset (zero grads / buffers)
    x, cid = rt.ids()
    t0 = rt.c
    rtt = t0 + 2000
    ms_s = max(rtt + LAUNCH_LAT_NS, rt.g + 1000)
    ms_d = 4000 + rng.randrange(2000)
    mbytes = 4 * MIB
    rt.cpu("cpu_op", "aten::zero_", t0, 9000, f'{{"External id": {x}}}')
    rt.runtime("cudaMemsetAsync", rtt, 5000, cid, x, 51)
    rt.gpu("gpu_memset", MEMSET_DEVICE, COMPUTE_STREAM, ms_s, ms_d, cid, x,
           f', "bytes": {mbytes}, "memory bandwidth (GB/s)": {mbytes / ms_d!r}')
    rt.g = ms_s + ms_d
    rt.c = t0 + 9000 + 2000
    st["memset"] = {"ns": ms_d, "bytes": mbytes, "start_abs_ns": BASE_TIME_NS + ms_s + rt.off}
    st["first_gpu_start_true_ns"] = BASE_TIME_NS + ms_s
    st["first_gpu_start_abs_ns"] = BASE_TIME_NS + ms_s + rt.off

    gap_layer = layers // 2
    for li in range(layers):
        for j, (cname, kname, base) in enumerate(FWD_LAYER):
            if li == gap_layer and j == 0:
                # (c) host launch gap: aten::item syncs, then python overhead delays the next launch
                prev_end = rt.g
                item_s = rt.c
                assert not host_gap_ns or item_s + 20_000 < prev_end + host_gap_ns - LAUNCH_LAT_NS - 3000
                sync_s = item_s + 2000
                sync_e = max(sync_s + 3000, prev_end + 1500)
                x, cid = rt.ids()
                rt.cpu("cpu_op", "aten::item", item_s, sync_e + 2500 - item_s, f'{{"External id": {x}}}')
                x2, _ = rt.ids()
                rt.cpu("cpu_op", "aten::_local_scalar_dense", item_s + 1000, sync_e + 500 - item_s,
                       f'{{"External id": {x2}}}')
                rt.runtime("cudaStreamSynchronize", sync_s, sync_e - sync_s, cid, x2, 131)
                rt.c = sync_e + 3000
                # without a planted gap the kernel is launched as soon as the sync returns (the same draws)
                at = prev_end + host_gap_ns - LAUNCH_LAT_NS if host_gap_ns else rt.c + 3000
                ks, _ = rt.op_kernel(cname, kname, rt.jitter(base), rt_at=at)
                assert ks - prev_end == host_gap_ns or not host_gap_ns
                st["host_launch_gap"] = {"ns": host_gap_ns, "start_true_ns": BASE_TIME_NS + prev_end,
                                         "end_true_ns": BASE_TIME_NS + ks,
                                         "start_abs_ns": BASE_TIME_NS + prev_end + rt.off,
                                         "end_abs_ns": BASE_TIME_NS + ks + rt.off,
                                         "cpu_op": "aten::item"}
            else:
                rt.op_kernel(cname, kname, rt.jitter(base))
    # (e) backward with reentrant checkpoint regions
    recompute = 0
    recompute_count = 0
    for li in reversed(range(layers)):
        if li in ckpt_layers:
            w_s = rt.c
            x_w, _ = rt.ids()
            x_i, _ = rt.ids()
            rt.c = w_s + 1500
            i_s = rt.c
            rt.c += 2000
            for cname, kname, base in FWD_LAYER:
                ks, ke = rt.op_kernel(cname, kname, rt.jitter(base))
                recompute += ke - ks
                recompute_count += 1
            # the layer's backward runs as a nested autograd graph task inside the checkpoint node
            b_s = rt.c
            x_b, _ = rt.ids()
            rt.c += 1000
            for cname, kname, base in BWD_LAYER:
                rt.op_kernel(cname, kname, rt.jitter(base))
            rt.c += 1000
            rt.cpu("cpu_op", "autograd::engine::evaluate_function: MmBackward0", b_s, rt.c - b_s,
                   f'{{"External id": {x_b}}}')
            i_e = rt.c
            rt.cpu("cpu_op", "CheckpointFunctionBackward", i_s, i_e - i_s, f'{{"External id": {x_i}}}')
            rt.cpu("cpu_op", "autograd::engine::evaluate_function: CheckpointFunctionBackward",
                   w_s, i_e + 1500 - w_s, f'{{"External id": {x_w}}}')
            rt.c = i_e + 3000
        else:
            for cname, kname, base in BWD_LAYER:
                rt.op_kernel(cname, kname, rt.jitter(base))
    st["recompute_kernel_ns"] = recompute
    st["recompute_kernel_count"] = recompute_count


def _comm_args(coll, nelems, group_size, pg_name, pg_desc, pg_ranks, rank, seq):
    return (f'"Collective name": "{coll}", "In msg nelems": {nelems}, "Out msg nelems": {nelems}, '
            f'"Group size": {group_size}, "dtype": "BFloat16", "Process Group Name": "{pg_name}", '
            f'"Process Group Description": "{pg_desc}", '
            f'"Process Group Ranks": "[{", ".join(str(r) for r in pg_ranks)}]", "Rank": {rank}, "Seq": {seq}')


def launch_comm(rt: RankTrace, comm_args, arrival_at=None, ready=None, extra=None):
    """record_param_comms cpu_op + cudaLaunchKernel.  Returns (arrival, x, cid).
    The kernel itself is written later by finish_comm once the common end is known. EXTRA: the kernel's start
    after the stream is ready beyond 1 us (default a random draw of up to 0.5 us)."""
    rng = rt.rng
    x, cid = rt.ids()
    pre = 3000
    rtd = 5000
    if arrival_at is None:
        t0 = rt.c
        rtt = t0 + pre
        extra = rng.randrange(500) if extra is None else extra
        arrival = max(rtt + LAUNCH_LAT_NS, (rt.g if ready is None else ready) + 1000 + extra)
    else:
        arrival = arrival_at
        rtt = arrival - LAUNCH_LAT_NS
        t0 = rtt - pre
        assert t0 >= rt.c
    opd = pre + rtd + 4000
    rt.cpu("cpu_op", "record_param_comms", t0, opd, f'{{"External id": {x}, {comm_args}}}')
    rt.runtime("cudaLaunchKernel", rtt, rtd, cid, x, 211)
    rt.c = t0 + opd + 2000
    return arrival, x, cid


def finish_comm(rt: RankTrace, kname, stream, start, end, x, cid, comm_args):
    rt.gpu("kernel", kname, stream, start, end - start, cid, x, _TAILS[kname] + ", " + comm_args)
    rt.kernel_count += 1


def _phase_after_collective(rt: RankTrace, coll_end, st):
    rng = rt.rng
    rt.g = coll_end  # compute stream waits on the collective (cudaStreamWaitEvent)
    o_s = rt.c
    x_o, _ = rt.ids()
    rt.c += 2000
    for _ in range(2):
        rt.op_kernel("aten::_fused_adamw_", FUSED_ADAM, rt.jitter(120_000))
    rt.cpu("user_annotation", "Optimizer.step#AdamW.step", o_s, rt.c - o_s, f'{{"External id": {x_o}}}')
    rt.c += 2000
    # (f) D2H offload copy, not overlapped by anything
    x, cid = rt.ids()
    t0 = rt.c
    rtt = t0 + 3000
    nbytes = 32 * MIB * (1 + rng.randrange(3))
    md = nbytes // 24  # ~24 GB/s
    ms = max(rtt + LAUNCH_LAT_NS, rt.g + 1000)
    rt.cpu("cpu_op", "aten::copy_", t0, 12_000, f'{{"External id": {x}}}')
    rt.runtime("cudaMemcpyAsync", rtt, 6000, cid, x, 41)
    rt.gpu("gpu_memcpy", MEMCPY_DTOH, COMPUTE_STREAM, ms, md, cid, x,
           f', "bytes": {nbytes}, "memory bandwidth (GB/s)": {nbytes / md!r}')
    rt.g = ms + md
    st["memcpy_dtoh"] = {"ns": md, "bytes": nbytes, "start_true_ns": BASE_TIME_NS + ms,
                         "start_abs_ns": BASE_TIME_NS + ms + rt.off,
                         "end_abs_ns": BASE_TIME_NS + ms + md + rt.off}
    rt.c = t0 + 12_000 + 1000
    s_s = rt.c
    s_e = max(s_s + 3000, rt.g + 1500)
    x2, cid2 = rt.ids()
    rt.runtime("cudaStreamSynchronize", s_s, s_e - s_s, cid2, None, 131)
    rt.c = s_e + 2000
    return rt.c


def generate(out_dir, ranks=4, steps=3, seed=0, gzip=False, target_mb=None, gemm_scale=1.0,
             straggler_delay_ns=STRAGGLER_DELAY_NS, host_gap_ns=HOST_GAP_NS, host_op_ns=0, cpu_ahead_ns=None):
    """Write rank-<r>.json[.gz] + ground_truth.json into out_dir; return the ground truth dict. GEMM_SCALE
    stretches every GEMM kernel (the same seed's job with slower GEMMs: every other draw is the same).
    STRAGGLER_DELAY_NS: how late the last rank arrives at the all-reduce of step index STRAGGLER_STEP_INDEX
    after the others; 0 = it arrives when its own GPU work is done (the twin without the straggler).
    HOST_GAP_NS: the planted host launch gap of each step (>= 50 us); 0 = the kernel after the aten::item
    sync is launched as soon as the sync returns. HOST_OP_NS / CPU_AHEAD_NS pace the host (PacedRankTrace): that
    much host time before each compute launch, or the host held within that much of its GPU. Twins share every
    random draw."""
    if host_gap_ns and host_gap_ns < 50_000:
        raise ValueError(f"host_gap_ns {host_gap_ns}: 0 or at least 50000")
    if host_op_ns < 0 or (cpu_ahead_ns is not None and cpu_ahead_ns < 0):
        raise ValueError(f"host_op_ns {host_op_ns}, cpu_ahead_ns {cpu_ahead_ns}: must be >= 0")
    paced = bool(host_op_ns) or cpu_ahead_ns is not None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    W = int(ranks)
    rng = random.Random(seed)
    offsets = clock_offsets(W, rng)
    layers = 32 if target_mb else 4
    ckpt_layers = set(range(max(1, layers // 4)))
    target_bytes = int(target_mb * MIB) if target_mb else 0
    ext = ".json.gz" if gzip else ".json"
    files = [f"rank-{r}{ext}" for r in range(W)]
    rts = [(PacedRankTrace if paced else RankTrace)(r, W, offsets[r], random.Random(seed * 1000 + 17 + r))
           for r in range(W)]
    for rt in rts:
        rt.gemm_scale = float(gemm_scale)
        if paced:
            rt.host_op_ns, rt.cpu_ahead_ns = int(host_op_ns), cpu_ahead_ns
    fhs = [open_out(out / files[r], gzip) for r in range(W)]
    written = [0] * W
    pg_ranks = list(range(W))
    nelems = 25_165_824  # 48 MiB of bf16 gradients
    nbytes = nelems * 2
    transfer_ns = (int(2 * (W - 1) / W * nbytes / 180.0) if W > 1 else 0) + 15_000
    S = TRUE_START_REL_NS
    for r, rt in enumerate(rts):
        h = header_text(r, W) + metadata_lines(rt, S, (COMPUTE_STREAM, COMM_STREAM))
        fhs[r].write(h)
        written[r] += len(h)
    rank_steps = [[] for _ in range(W)]
    collectives = []
    straggler = None
    n = 0
    while n < steps or (target_bytes and min(written) < target_bytes):
        step_no = FIRST_STEP + n
        sts = []
        for rt in rts:
            rt.gpu_iv = []
            rt.compute_ns = 0
            rt.kernel_count = 0
            st = {"step": step_no, "index": n}
            _phase_forward_backward(rt, S, layers, ckpt_layers, st, host_gap_ns)
            sts.append(st)
        # (b) all-reduce
        seq = n + 1
        is_strag = (n == STRAGGLER_STEP_INDEX and W > 1)
        delay = straggler_delay_ns if is_strag else 0
        arrivals = [None] * W
        launched = [None] * W
        cargs = [_comm_args("allreduce", nelems, W, "0", "default_pg", pg_ranks, r, seq) for r in range(W)]
        order = list(range(W - 1)) + [W - 1]
        for r in order:
            if is_strag and r == W - 1 and delay:
                target = max(arrivals[:W - 1]) + delay
                launched[r] = launch_comm(rts[r], cargs[r], arrival_at=target)
            elif is_strag and r == W - 1:
                # the twin: launched as soon as its host gets there, like the others, with no random draw
                # (as when planted): the kernel starts when its stream is ready
                launched[r] = launch_comm(rts[r], cargs[r], extra=250)
            else:
                launched[r] = launch_comm(rts[r], cargs[r])
            arrivals[r] = launched[r][0]
        last = max(arrivals)
        end = last + transfer_ns
        for r, rt in enumerate(rts):
            a, x, cid = launched[r]
            finish_comm(rt, NCCL_ALLREDUCE, COMM_STREAM, a, end, x, cid, cargs[r])
            sts[r]["allreduce"] = {"seq": seq, "arrival_true_ns": BASE_TIME_NS + a,
                                   "arrival_abs_ns": BASE_TIME_NS + a + rt.off,
                                   "end_abs_ns": BASE_TIME_NS + end + rt.off,
                                   "kernel_ns": end - a, "wait_ns": last - a}
        coll = {"step": step_no, "step_index": n, "seq": seq, "collective": "allreduce",
                "kernel_name": NCCL_ALLREDUCE, "nelems": nelems, "dtype": "BFloat16",
                "process_group": "0", "transfer_ns": transfer_ns,
                "true_arrival_ns": [BASE_TIME_NS + a for a in arrivals],
                "abs_arrival_ns": [BASE_TIME_NS + a + rts[r].off for r, a in enumerate(arrivals)],
                "true_end_ns": BASE_TIME_NS + end,
                "abs_end_ns": [BASE_TIME_NS + end + rt.off for rt in rts],
                "last_arrival_rank": arrivals.index(last),
                "wait_ns": [last - a for a in arrivals],
                "planted_delay_ns": delay,
                "straggler_rank": (W - 1) if is_strag and delay else None}
        collectives.append(coll)
        if is_strag and delay:
            straggler = {"step": step_no, "step_index": n, "rank": W - 1, "seq": seq,
                         "delay_ns": delay,
                         "definition": "arrival[rank] - max(arrival of all other ranks)"}
        cpu_ends = [_phase_after_collective(rt, end, sts[r]) for r, rt in enumerate(rts)]
        S_next = max(cpu_ends) + STEP_SEPARATION_NS
        for r, rt in enumerate(rts):
            st = sts[r]
            x, _ = rt.ids()
            rt.cpu("user_annotation", f"ProfilerStep#{step_no}", S, S_next - S, f'{{"External id": {x}}}')
            busy = _union_ns(rt.gpu_iv)
            st["window_true_ns"] = [BASE_TIME_NS + S, BASE_TIME_NS + S_next]
            st["window_abs_ns"] = [BASE_TIME_NS + S + rt.off, BASE_TIME_NS + S_next + rt.off]
            st["last_gpu_end_abs_ns"] = BASE_TIME_NS + max(e for _, e in rt.gpu_iv) + rt.off
            st["compute_kernel_ns"] = rt.compute_ns
            st["kernel_count"] = rt.kernel_count
            st["gpu_busy_ns"] = busy
            st["gpu_idle_ns"] = (S_next - S) - busy
            rank_steps[r].append(st)
            written[r] += rt.flush_to(fhs[r])
        S = S_next
        n += 1
    for r, rt in enumerate(rts):
        f = footer_text(rt, S, str(out / files[r]))
        fhs[r].write(f)
        written[r] += len(f)
        fhs[r].close()
    gt = {
        "generator": "sample_traces.generate",
        "seed": seed,
        "gemm_scale": float(gemm_scale),
        "world_size": W,
        "num_steps": n,
        "first_step": FIRST_STEP,
        "layers_per_step": layers,
        "base_time_ns": BASE_TIME_NS,
        "gzip": bool(gzip),
        "time_conventions": {
            "true_ns": "absolute Unix ns on the shared true clock",
            "abs_ns": "absolute Unix ns as written in that rank's file = base + ts*1000 = true + clock_offset_ns",
        },
        "constants": {"host_launch_gap_ns": host_gap_ns, "dataloader_ns": DATALOADER_NS,
                      "straggler_delay_ns": straggler_delay_ns, "device": DEVICE,
                      "compute_stream": COMPUTE_STREAM, "comm_stream": COMM_STREAM},
        "straggler": straggler,
        "collectives": collectives,
        **({"host_pacing": {"host_op_ns": host_op_ns, "cpu_ahead_ns": cpu_ahead_ns}} if paced else {}),
        "ranks": [],
    }
    for r, rt in enumerate(rts):
        c = rt.counts
        gt["ranks"].append({
            "rank": r,
            "file": files[r],
            "pid": rt.pid,
            "main_tid": rt.tid,
            "clock_offset_ns": rt.off,
            "uncompressed_bytes": written[r],
            "counts": {
                "kernel": c.get("kernel", 0),
                "gpu_memcpy": c.get("gpu_memcpy", 0),
                "gpu_memset": c.get("gpu_memset", 0),
                "profiler_steps": n,
                "cpu_op": c.get("cpu_op", 0),
                "user_annotation": c.get("user_annotation", 0),
                "cuda_runtime": c.get("cuda_runtime", 0),
                "flow_start": c.get("flow_s", 0),
                "flow_end": c.get("flow_f", 0),
                "metadata": c.get("M", 0),
                "trace_events": sum(c.get(k, 0) for k in (
                    "kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "user_annotation", "cuda_runtime",
                    "flow_s", "flow_f", "M")) + 1,
            },
            "totals": {
                "compute_kernel_ns": sum(s["compute_kernel_ns"] for s in rank_steps[r]),
                "recompute_kernel_ns": sum(s["recompute_kernel_ns"] for s in rank_steps[r]),
                "host_launch_gap_ns": sum(s["host_launch_gap"]["ns"] for s in rank_steps[r]),
                "dataloader_ns": sum(s["dataloader"]["ns"] for s in rank_steps[r]),
                "memcpy_ns": sum(s["memcpy_dtoh"]["ns"] for s in rank_steps[r]),
                "memset_ns": sum(s["memset"]["ns"] for s in rank_steps[r]),
                "allreduce_kernel_ns": sum(s["allreduce"]["kernel_ns"] for s in rank_steps[r]),
            },
            "steps": rank_steps[r],
        })
    with open(out / "ground_truth.json", "w") as fh:
        json.dump(gt, fh, indent=1)
    return gt


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m sample_traces.generate", description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gzip", action="store_true")
    ap.add_argument("--gemm-scale", type=float, default=1.0, help="stretch every GEMM kernel by this factor")
    ap.add_argument("--straggler-delay-ns", type=int, default=STRAGGLER_DELAY_NS,
                    help="the planted straggler's late arrival (0: the same job without it)")
    ap.add_argument("--host-gap-ns", type=int, default=HOST_GAP_NS,
                    help="the planted host launch gap per step (0: the same job without it)")
    pace = ap.add_mutually_exclusive_group()
    pace.add_argument("--host-op-ns", type=int, default=0,
                      help="host time before each compute launch (a launch-bound job when kernels are shorter)")
    pace.add_argument("--cpu-ahead-ns", type=int, default=None,
                      help="hold the host within N ns of its GPU (a GPU-bound job, the host that far ahead)")
    ap.add_argument("--target-mb", type=float, default=None,
                    help="repeat steps (32 layers/step) until every rank file is >= N MiB (uncompressed)")
    a = ap.parse_args(argv)
    gt = generate(a.out_dir, ranks=a.ranks, steps=a.steps, seed=a.seed, gzip=a.gzip, target_mb=a.target_mb,
                  gemm_scale=a.gemm_scale, straggler_delay_ns=a.straggler_delay_ns, host_gap_ns=a.host_gap_ns,
                  host_op_ns=a.host_op_ns, cpu_ahead_ns=a.cpu_ahead_ns)
    print(json.dumps({"out_dir": a.out_dir, "ranks": gt["world_size"], "steps": gt["num_steps"],
                      "bytes": [r["uncompressed_bytes"] for r in gt["ranks"]]}))


if __name__ == "__main__":
    main()
