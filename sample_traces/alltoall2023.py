"""Seeded Kineto traces in the shape of a 2023 TorchRec/DLRM job: all-to-all as SendRecv kernels, old-style
``record_param_comms`` with no collective arguments, planted arrivals.

    python -m sample_traces.alltoall2023 OUT_DIR [--ranks 8] [--steps 2] [--seed 0] [--host-name node0]
    generate_a2a(out_dir, ...) -> ground truth dict

Per step and rank: forward GEMMs, then five embedding all-to-alls and three gradient all-reduces. Each
collective is launched the way PyTorch of that era recorded it: ``c10d::alltoall_base_`` (or
``c10d::allreduce_``) enclosing ``record_param_comms`` that carries only ``Input Dims``/``Input type`` (no
collective name, process group or sequence), enclosing ``nccl:all_to_all`` (``nccl:all_reduce``), enclosing
the ``cudaLaunchKernel`` of an ``ncclKernel_SendRecv_*`` (``ncclKernel_AllReduce_*``) kernel. Every rank
arrives at each collective at a planted lateness after the earliest; all members end together, so a rank's
straggler time is exactly (last arrival − own arrival) summed over its collectives. One clock for all ranks
(one host); with ``host_name`` the files say so in their metadata, as newer Kineto writes it.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from .generate import (BASE_TIME_NS, COMM_STREAM, COMPUTE_STREAM, DEVICE_PROPERTIES, FIRST_STEP, GEMM_H100,
                       LAUNCH_LAT_NS, STEP_SEPARATION_NS, TRUE_START_REL_NS, RankTrace, footer_text,
                       metadata_lines, open_out)

SENDRECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
ALLREDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
COLLS = [("c10d::alltoall_base_", "nccl:all_to_all", SENDRECV)] * 5 + \
        [("c10d::allreduce_", "nccl:all_reduce", ALLREDUCE)] * 3
TRANSFER_NS = 180_000
OLD_RPC_ARGS = '"Input Dims": [[384], [], [], [], [], [], []], "Input type": ["long", "Scalar", "Scalar", ' \
               '"Scalar", "", "", ""]'


def _header(rank, world, host_name):
    dist = {"backend": "nccl", "rank": rank, "world_size": world}
    host = f'  "host_name": {json.dumps(host_name)},\n' if host_name else ""
    return ('{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    ' + DEVICE_PROPERTIES + '\n  ],\n'
            f'  "distributedInfo": {json.dumps(dist)},\n{host}'
            f'  "baseTimeNanoseconds": {BASE_TIME_NS},\n  "traceEvents": [\n')


def _launch(rt: RankTrace, outer, inner, arrival):
    """outer c10d op > record_param_comms (old style) > nccl: op > cudaLaunchKernel, launching at ARRIVAL."""
    x, cid = rt.ids()
    rtt = arrival - LAUNCH_LAT_NS
    t0 = rtt - 9000
    assert t0 >= rt.c, "host cursor past the planted arrival"
    rt.cpu("cpu_op", outer, t0, 22_000, f'{{"External id": {x}}}')
    x2, _ = rt.ids()
    rt.cpu("cpu_op", "record_param_comms", t0 + 1000, 20_000, f'{{"External id": {x2}, {OLD_RPC_ARGS}}}')
    x3, _ = rt.ids()
    rt.cpu("cpu_op", inner, t0 + 3000, 16_000, f'{{"External id": {x3}, "Input Dims": [[384]], '
                                                 '"Input type": ["long"]}')
    rt.runtime("cudaLaunchKernel", rtt, 5000, cid, cid, 211)
    rt.c = t0 + 24_000
    return cid


def generate_a2a(out_dir, ranks=8, steps=2, seed=0, host_name="node0"):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    W = int(ranks)
    rng = random.Random(seed)
    rts = [RankTrace(r, W, 0, random.Random(seed * 1000 + 31 + r)) for r in range(W)]
    files = [f"rank-{r}.json" for r in range(W)]
    fhs = [open_out(out / f, False) for f in files]
    S = TRUE_START_REL_NS
    for r, rt in enumerate(rts):
        fhs[r].write(_header(r, W, host_name) + metadata_lines(rt, S, (COMPUTE_STREAM, COMM_STREAM)))
    gt_steps = []
    for n in range(steps):
        step_no = FIRST_STEP + n
        for rt in rts:
            rt.c = S + 5000
            for _ in range(4):
                rt.op_kernel("aten::mm", GEMM_H100, rt.jitter(150_000))
        waits = [0] * W
        colls = []
        for k, (outer, inner, kname) in enumerate(COLLS):
            # earliest each rank could arrive: its host free and its compute stream drained
            ready = [max(rt.c + 9000 + LAUNCH_LAT_NS, rt.g + 1000) for rt in rts]
            base = max(ready)
            late = [rng.choice((0, 0, 7_000, 23_000, 61_000)) for _ in range(W)]
            if k == 2:
                late[W - 1] = 400_000  # one clear straggler in the third all-to-all of every step
            arr = [base + x for x in late]
            end = max(arr) + TRANSFER_NS
            for r, rt in enumerate(rts):
                cid = _launch(rt, outer, inner, arr[r])
                rt.gpu("kernel", kname, COMM_STREAM, arr[r], end - arr[r], cid, cid, "")
                rt.g = end  # the compute stream waits for the collective
                waits[r] += max(arr) - arr[r]
            colls.append({"index": k, "host_op": inner, "kernel": kname,
                          "arrival_true_ns": [BASE_TIME_NS + a for a in arr], "end_true_ns": BASE_TIME_NS + end,
                          "wait_ns": [max(arr) - a for a in arr]})
        for rt in rts:
            rt.c = max(rt.c, rt.g) + 5000
            rt.op_kernel("aten::mm", GEMM_H100, rt.jitter(90_000))
        S_next = max(max(rt.c, rt.g) for rt in rts) + STEP_SEPARATION_NS
        for r, rt in enumerate(rts):
            x, _ = rt.ids()
            rt.cpu("user_annotation", f"ProfilerStep#{step_no}", S, S_next - S, f'{{"External id": {x}}}')
            rt.flush_to(fhs[r])
        gt_steps.append({"step": step_no, "straggler_ns": waits, "collectives": colls})
        S = S_next
    for r, rt in enumerate(rts):
        fhs[r].write(footer_text(rt, S, str(out / files[r])))
        fhs[r].close()
    gt = {"generator": "sample_traces.alltoall2023", "seed": seed, "world_size": W, "host_name": host_name,
          "files": files, "steps": gt_steps,
          "straggler_ns_per_rank": [sum(s["straggler_ns"][r] for s in gt_steps) for r in range(W)]}
    (out / "ground_truth.json").write_text(json.dumps(gt, indent=1))
    return gt


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--host-name", default="node0", help="host_name metadata ('' for none)")
    a = ap.parse_args(argv)
    generate_a2a(a.out_dir, a.ranks, a.steps, a.seed, a.host_name or None)


if __name__ == "__main__":
    main()
