"""Capture real multi-rank CPU traces with torch.distributed on gloo, to pin the host-op names that
collectives and activation checkpointing leave in a Kineto trace.

Needs torch (not a ninefold dependency): ``pip install torch`` into any environment, then
``python -m sample_traces.capture_gloo OUT_DIR``. Writes ``rank-<r>.json`` per rank (2 ranks, 2 profiler steps):
each step runs all_reduce, all_to_all_single, all_gather, reduce_scatter, broadcast, a send/recv pair and a
barrier, and a small model whose first block is checkpointed reentrantly and second non-reentrantly, with
``with_stack=True`` so the checkpoint's python frames are recorded. CPU only: the trace has host ops, no kernels.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def _worker(rank: int, world: int, out: str, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.utils.checkpoint import checkpoint

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(3)])

    def step():
        x = torch.randn(32, 64, requires_grad=True)
        h = checkpoint(blocks[0], x, use_reentrant=True)
        h = checkpoint(blocks[1], h, use_reentrant=False)
        blocks[2](h).sum().backward()
        t = torch.ones(1024) * rank
        dist.all_reduce(t)
        a = torch.arange(world * 8, dtype=torch.float32)
        b = torch.empty_like(a)
        dist.all_to_all_single(b, a)
        outs = [torch.empty(16) for _ in range(world)]
        dist.all_gather(outs, torch.full((16,), float(rank)))
        rs = torch.empty(16)
        dist.reduce_scatter_tensor(rs, torch.ones(16 * world)) if hasattr(dist, "reduce_scatter_tensor") else None
        dist.broadcast(t, src=0)
        if rank == 0:
            dist.send(torch.ones(8), dst=1)
        elif rank == 1:
            dist.recv(torch.empty(8), src=0)
        dist.barrier()

    acts = [torch.profiler.ProfilerActivity.CPU]
    sched = torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1)
    with torch.profiler.profile(activities=acts, schedule=sched, with_stack=True, record_shapes=True) as prof:
        for _ in range(3):
            step()
            prof.step()
    prof.export_chrome_trace(str(Path(out) / f"rank-{rank}.json"))
    dist.destroy_process_group()


def main(argv=None) -> None:
    import socket

    import torch.multiprocessing as mp

    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "gloo_capture")
    out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, str(out), port), nprocs=2, join=True)


if __name__ == "__main__":
    main()
