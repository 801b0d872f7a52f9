"""Seeded generator of realistic multi-rank PyTorch-profiler (Kineto Chrome-trace JSON) traces
with known, planted timings.  Standard library only.

    python -m sample_traces.generate OUT_DIR [--ranks 4] [--steps 3] [--seed 0] [--gzip] [--target-mb N]

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
import gzip as _gzip
import json
import random
from pathlib import Path

BASE_TIME_NS = 1735689600000000000
TRUE_START_REL_NS = 2_000_000_000  # first step starts 2 s after baseTimeNanoseconds (true clock)
FIRST_STEP = 10
HOST_GAP_NS = 300_000
DATALOADER_NS = 500_000
STRAGGLER_DELAY_NS = 2_000_000
STRAGGLER_STEP_INDEX = 1
LAUNCH_LAT_NS = 2_500  # cudaLaunchKernel start -> earliest kernel start
STEP_SEPARATION_NS = 10_000
DEVICE = 0
COMPUTE_STREAM = 7
COMM_STREAM = 20
MIB = 1 << 20

DEVICE_PROPERTIES = (
    '{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85899345920, '
    '"computeMajor": 9, "computeMinor": 0, "maxThreadsPerBlock": 1024, '
    '"maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32, '
    '"sharedMemPerBlock": 49152, "numSms": 132, "regsPerMultiprocessor": 65536, '
    '"sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472, '
    '"maxSharedMemoryPerMultiProcessor": 233472}'
)

# ---------------------------------------------------------------- kernel catalogue
GEMM_H100 = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"
             "_execute_segment_k_off_kernel__5x_cublas")
GEMM_AMPERE = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn"
FLASH_FWD = ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
             "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, "
             "false, true, false, false, true, true, false, false>(Flash_fwd_params)")
FLASH_BWD = ("void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, "
             "2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, "
             "cutlass::bfloat16_t> >, true, false, false, false, false, true, false>(Flash_bwd_params)")
ELEM_ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
            "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, "
            "at::detail::Array<char*, 3>)")
ELEM_GELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl("
             "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::"
             "{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >"
             "(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::"
             "{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, "
             "at::detail::Array<char*, 2>)")
ELEM_GELU_BWD = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl("
                 "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::"
                 "{lambda()#4}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, "
                 "at::detail::Array<char*, 3> >(int, at::native::GeluBackwardCUDAKernelImpl("
                 "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::"
                 "{lambda()#4}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, "
                 "at::detail::Array<char*, 3>)")
LAYER_NORM = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
              "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, "
              "float*, c10::BFloat16*)")
LAYER_NORM_BWD = ("void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized"
                  "<c10::BFloat16, float>(c10::BFloat16 const*, c10::BFloat16 const*, float const*, "
                  "float const*, c10::BFloat16 const*, c10::BFloat16*, int)")
FUSED_ADAM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
              "namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor"
              "<float, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, "
              "double, bool, float*, float*>(at::native::(anonymous namespace)::TensorListMetadata<4>, "
              "at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, "
              "false>, float*, double, double, double, double, double, double, bool, float*, float*)")
NCCL_ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NCCL_SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
MEMCPY_DTOH = "Memcpy DtoH (Device -> Pinned)"
MEMSET_DEVICE = "Memset (Device)"

# name -> static tail of the kernel args (after correlation)
_KERNEL_TAIL = {
    GEMM_H100: (168, 213248, "1.0", "12.0", (132, 1, 1), (384, 1, 1), 19),
    GEMM_AMPERE: (238, 98304, "2.0", "16.0", (16, 8, 4), (256, 1, 1), 25),
    FLASH_FWD: (255, 49152, "1.0", "4.0", (16, 32, 8), (128, 1, 1), 6),
    FLASH_BWD: (255, 98304, "1.0", "8.0", (8, 32, 8), (256, 1, 1), 12),
    ELEM_ADD: (26, 0, "8.0", "32.0", (8192, 1, 1), (128, 1, 1), 62),
    ELEM_GELU: (30, 0, "8.0", "32.0", (8192, 1, 1), (128, 1, 1), 60),
    ELEM_GELU_BWD: (32, 0, "8.0", "32.0", (8192, 1, 1), (128, 1, 1), 58),
    LAYER_NORM: (40, 0, "4.0", "32.0", (4096, 1, 1), (256, 1, 1), 50),
    LAYER_NORM_BWD: (48, 0, "4.0", "32.0", (4096, 1, 1), (256, 1, 1), 45),
    FUSED_ADAM: (64, 0, "6.0", "24.0", (320, 1, 1), (512, 1, 1), 38),
    NCCL_ALLREDUCE: (96, 0, "0.242424", "4.848485", (32, 1, 1), (640, 1, 1), 0),
    NCCL_SENDRECV: (96, 0, "0.015152", "0.303030", (2, 1, 1), (640, 1, 1), 0),
}


def _tail(name: str) -> str:
    regs, smem, bps, wps, grid, block, occ = _KERNEL_TAIL[name]
    return (f', "registers per thread": {regs}, "shared memory": {smem}, "blocks per SM": {bps}, '
            f'"warps per SM": {wps}, "grid": [{grid[0]}, {grid[1]}, {grid[2]}], '
            f'"block": [{block[0]}, {block[1]}, {block[2]}], "est. achieved occupancy %": {occ}')


_TAILS = {k: _tail(k) for k in _KERNEL_TAIL}
_J = {}


def _j(s: str) -> str:
    """JSON string literal (cached)."""
    v = _J.get(s)
    if v is None:
        v = _J[s] = json.dumps(s)
    return v


def fmt_us(ns: int) -> str:
    """Kineto fmtTs: integer ns -> microseconds with exactly three decimals."""
    return f"{ns // 1000}.{ns % 1000:03d}"


# (cpu op name, kernel name, base duration ns)
FWD_LAYER = [
    ("aten::native_layer_norm", LAYER_NORM, 35_000),
    ("aten::mm", GEMM_H100, 420_000),
    ("aten::_flash_attention_forward", FLASH_FWD, 380_000),
    ("aten::mm", GEMM_AMPERE, 150_000),
    ("aten::add", ELEM_ADD, 28_000),
    ("aten::native_layer_norm", LAYER_NORM, 35_000),
    ("aten::mm", GEMM_H100, 560_000),
    ("aten::gelu", ELEM_GELU, 60_000),
    ("aten::mm", GEMM_AMPERE, 560_000),
    ("aten::add", ELEM_ADD, 28_000),
]
BWD_LAYER = [
    ("aten::mm", GEMM_AMPERE, 560_000),
    ("aten::mm", GEMM_AMPERE, 560_000),
    ("aten::gelu_backward", ELEM_GELU_BWD, 80_000),
    ("aten::mm", GEMM_H100, 560_000),
    ("aten::mm", GEMM_H100, 560_000),
    ("aten::native_layer_norm_backward", LAYER_NORM_BWD, 60_000),
    ("aten::mm", GEMM_AMPERE, 150_000),
    ("aten::mm", GEMM_AMPERE, 150_000),
    ("aten::_flash_attention_backward", FLASH_BWD, 900_000),
    ("aten::mm", GEMM_H100, 420_000),
    ("aten::mm", GEMM_H100, 420_000),
    ("aten::native_layer_norm_backward", LAYER_NORM_BWD, 60_000),
    ("aten::add", ELEM_ADD, 28_000),
]


def _union_ns(intervals):
    total = 0
    cur_s = cur_e = None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        total += cur_e - cur_s
    return total


class RankTrace:
    """Event emitter for one rank.  All times passed in are *true* ns relative to BASE_TIME_NS;
    the rank's clock offset is added when the line is written."""

    def __init__(self, rank, world, offset_ns, rng, pid=None):
        self.rank = rank
        self.world = world
        self.off = offset_ns
        self.rng = rng
        self.pid = pid if pid is not None else 1000 + rank
        self.tid = self.pid
        self.ext = 1
        self.corr = 1
        self.cbuf = []  # CPU-side lines of the current chunk
        self.gbuf = []  # GPU-side lines of the current chunk
        self.counts = {}
        self.c = 0  # CPU (main thread) cursor
        self.g = 0  # compute-stream free time
        self.gpu_iv = []  # (start, end) of GPU activities of the current step
        self.compute_ns = 0
        self.kernel_count = 0

    # --------------------------------------------------------------- low level
    def _count(self, key, n=1):
        self.counts[key] = self.counts.get(key, 0) + n

    def cpu(self, cat, name, t, d, args):
        ts = t + self.off
        self.cbuf.append(
            f'  {{"ph": "X", "cat": "{cat}", "name": {_j(name)}, "pid": {self.pid}, "tid": {self.tid}, '
            f'"ts": {ts // 1000}.{ts % 1000:03d}, "dur": {d // 1000}.{d % 1000:03d}, "args": {args}}},\n')
        c = self.counts
        c[cat] = c.get(cat, 0) + 1

    def runtime(self, name, t, d, cid, x, cbid):
        ts = t + self.off
        pid, tid = self.pid, self.tid
        tss = f"{ts // 1000}.{ts % 1000:03d}"
        ext = f', "External id": {x}' if x is not None else ""
        self.cbuf.append(
            f'  {{"ph": "X", "cat": "cuda_runtime", "name": "{name}", "pid": {pid}, "tid": {tid}, '
            f'"ts": {tss}, "dur": {d // 1000}.{d % 1000:03d}, '
            f'"args": {{"cbid": {cbid}, "correlation": {cid}{ext}}}}},\n')
        c = self.counts
        c["cuda_runtime"] = c.get("cuda_runtime", 0) + 1
        if cbid in (211, 41, 51):  # launch / memcpy / memset: has a GPU side and a flow
            self.cbuf.append(
                f'  {{"ph": "s", "id": {cid}, "pid": {pid}, "tid": {tid}, "ts": {tss}, '
                f'"cat": "ac2g", "name": "ac2g"}},\n')
            c["flow_s"] = c.get("flow_s", 0) + 1

    def gpu(self, cat, name, stream, s, d, cid, x, tail):
        ts = s + self.off
        tss = f"{ts // 1000}.{ts % 1000:03d}"
        self.gbuf.append(
            f'  {{"ph": "X", "cat": "{cat}", "name": {_j(name)}, "pid": {DEVICE}, "tid": {stream}, '
            f'"ts": {tss}, "dur": {d // 1000}.{d % 1000:03d}, '
            f'"args": {{"External id": {x}, "queued": 0, "device": {DEVICE}, "context": 1, '
            f'"stream": {stream}, "correlation": {cid}{tail}}}}},\n')
        self.gbuf.append(
            f'  {{"ph": "f", "id": {cid}, "pid": {DEVICE}, "tid": {stream}, "ts": {tss}, '
            f'"cat": "ac2g", "name": "ac2g", "bp": "e"}},\n')
        c = self.counts
        c[cat] = c.get(cat, 0) + 1
        c["flow_f"] = c.get("flow_f", 0) + 1
        self.gpu_iv.append((s, s + d))

    def ids(self):
        x = self.ext
        cid = self.corr
        self.ext += 1
        self.corr += 1
        return x, cid

    # --------------------------------------------------------------- ops
    def op_kernel(self, cpu_name, kname, kdur, rt_at=None, stream=COMPUTE_STREAM, compute=True):
        """cpu_op -> cudaLaunchKernel -> kernel on `stream` (queued behind self.g)."""
        rng = self.rng
        x, cid = self.ids()
        if rt_at is None:
            pre = 2500 + rng.randrange(3000)
            t0 = self.c
            rt = t0 + pre
        else:
            pre = 3000
            rt = rt_at
            t0 = rt - pre
            assert t0 >= self.c, "CPU cursor already past the requested launch time"
        rtd = 3500 + rng.randrange(3000)
        ks = rt + LAUNCH_LAT_NS
        q = self.g + 800 + rng.randrange(700)
        if q > ks:
            ks = q
        opd = pre + rtd + 1500 + rng.randrange(2000)
        self.cpu("cpu_op", cpu_name, t0, opd, f'{{"External id": {x}}}')
        self.runtime("cudaLaunchKernel", rt, rtd, cid, x, 211)
        self.gpu("kernel", kname, stream, ks, kdur, cid, x, _TAILS[kname])
        self.c = t0 + opd + 1000 + rng.randrange(3000)
        self.g = ks + kdur
        self.kernel_count += 1
        if compute:
            self.compute_ns += kdur
        return ks, ks + kdur

    def jitter(self, base):
        return int(base * (0.97 + 0.06 * self.rng.random()))

    def flush_to(self, fh):
        s = "".join(self.cbuf) + "".join(self.gbuf)
        self.cbuf.clear()
        self.gbuf.clear()
        fh.write(s)
        return len(s)


def header_text(rank, world, dist_info_extra=None):
    ranks = list(range(world))
    pg_config = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                  "pg_size": world, "ranks": ranks}]
    if dist_info_extra:
        pg_config += dist_info_extra
    dist = {"backend": "nccl", "rank": rank, "world_size": world, "pg_count": len(pg_config),
            "pg_config": pg_config, "nccl_version": "2.21.5"}
    return ('{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    ' + DEVICE_PROPERTIES + '\n  ],\n'
            f'  "distributedInfo": {json.dumps(dist)},\n'
            '  "displayTimeUnit": "ms",\n'
            f'  "baseTimeNanoseconds": {BASE_TIME_NS},\n'
            '  "traceEvents": [\n')


def metadata_lines(rt: RankTrace, t_true, streams):
    ts = fmt_us(t_true + rt.off)
    p = rt.pid
    out = [
        f'  {{"name": "process_name", "ph": "M", "ts": {ts}, "pid": {p}, "tid": 0, "args": {{"name": "python3"}}}},\n',
        f'  {{"name": "process_labels", "ph": "M", "ts": {ts}, "pid": {p}, "tid": 0, "args": {{"labels": "CPU"}}}},\n',
        f'  {{"name": "thread_name", "ph": "M", "ts": {ts}, "pid": {p}, "tid": {rt.tid}, '
        f'"args": {{"name": "thread {rt.tid} (python3)"}}}},\n',
        f'  {{"name": "process_name", "ph": "M", "ts": {ts}, "pid": 0, "tid": 0, "args": {{"name": "python3"}}}},\n',
        f'  {{"name": "process_labels", "ph": "M", "ts": {ts}, "pid": 0, "tid": 0, "args": {{"labels": "GPU 0"}}}},\n',
    ]
    for s in streams:
        out.append(f'  {{"name": "thread_name", "ph": "M", "ts": {ts}, "pid": 0, "tid": {s}, '
                   f'"args": {{"name": "stream {s} "}}}},\n')
    rt._count("M", len(out))
    return "".join(out)


def footer_text(rt: RankTrace, t_true, trace_name):
    return (f'  {{"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", '
            f'"ts": {fmt_us(t_true + rt.off)}}}\n  ],\n  "traceName": {json.dumps(trace_name)}\n}}\n')


def open_out(path: Path, gz: bool):
    if gz:
        return _gzip.open(path, "wt", encoding="ascii", compresslevel=3)
    return open(path, "w", encoding="ascii", buffering=8 * MIB)


def clock_offsets(world, rng):
    return [r * 137_000 + rng.randrange(0, 20_000) for r in range(world)]


# ====================================================================== data-parallel steps
def _phase_forward_backward(rt: RankTrace, S, layers, ckpt_layers, st):
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
                assert item_s + 20_000 < prev_end + HOST_GAP_NS - LAUNCH_LAT_NS - 3000
                sync_s = item_s + 2000
                sync_e = max(sync_s + 3000, prev_end + 1500)
                x, cid = rt.ids()
                rt.cpu("cpu_op", "aten::item", item_s, sync_e + 2500 - item_s, f'{{"External id": {x}}}')
                x2, _ = rt.ids()
                rt.cpu("cpu_op", "aten::_local_scalar_dense", item_s + 1000, sync_e + 500 - item_s,
                       f'{{"External id": {x2}}}')
                rt.runtime("cudaStreamSynchronize", sync_s, sync_e - sync_s, cid, x2, 131)
                rt.c = sync_e + 3000
                ks, _ = rt.op_kernel(cname, kname, rt.jitter(base),
                                     rt_at=prev_end + HOST_GAP_NS - LAUNCH_LAT_NS)
                assert ks - prev_end == HOST_GAP_NS
                st["host_launch_gap"] = {"ns": HOST_GAP_NS, "start_true_ns": BASE_TIME_NS + prev_end,
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


def launch_comm(rt: RankTrace, comm_args, arrival_at=None, ready=None):
    """record_param_comms cpu_op + cudaLaunchKernel.  Returns (arrival, x, cid).
    The kernel itself is written later by finish_comm once the common end is known."""
    rng = rt.rng
    x, cid = rt.ids()
    pre = 3000
    rtd = 5000
    if arrival_at is None:
        t0 = rt.c
        rtt = t0 + pre
        arrival = max(rtt + LAUNCH_LAT_NS, (rt.g if ready is None else ready) + 1000 + rng.randrange(500))
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


def generate(out_dir, ranks=4, steps=3, seed=0, gzip=False, target_mb=None):
    """Write rank-<r>.json[.gz] + ground_truth.json into out_dir; return the ground truth dict."""
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
    rts = [RankTrace(r, W, offsets[r], random.Random(seed * 1000 + 17 + r)) for r in range(W)]
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
            _phase_forward_backward(rt, S, layers, ckpt_layers, st)
            sts.append(st)
        # (b) all-reduce
        seq = n + 1
        is_strag = (n == STRAGGLER_STEP_INDEX and W > 1)
        arrivals = [None] * W
        launched = [None] * W
        cargs = [_comm_args("allreduce", nelems, W, "0", "default_pg", pg_ranks, r, seq) for r in range(W)]
        order = list(range(W - 1)) + [W - 1]
        for r in order:
            if is_strag and r == W - 1:
                target = max(arrivals[:W - 1]) + STRAGGLER_DELAY_NS
                launched[r] = launch_comm(rts[r], cargs[r], arrival_at=target)
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
                "planted_delay_ns": STRAGGLER_DELAY_NS if is_strag else 0,
                "straggler_rank": (W - 1) if is_strag else None}
        collectives.append(coll)
        if is_strag:
            straggler = {"step": step_no, "step_index": n, "rank": W - 1, "seq": seq,
                         "delay_ns": STRAGGLER_DELAY_NS,
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
        "constants": {"host_launch_gap_ns": HOST_GAP_NS, "dataloader_ns": DATALOADER_NS,
                      "straggler_delay_ns": STRAGGLER_DELAY_NS, "device": DEVICE,
                      "compute_stream": COMPUTE_STREAM, "comm_stream": COMM_STREAM},
        "straggler": straggler,
        "collectives": collectives,
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
    ap.add_argument("--target-mb", type=float, default=None,
                    help="repeat steps (32 layers/step) until every rank file is >= N MiB (uncompressed)")
    a = ap.parse_args(argv)
    gt = generate(a.out_dir, ranks=a.ranks, steps=a.steps, seed=a.seed, gzip=a.gzip, target_mb=a.target_mb)
    print(json.dumps({"out_dir": a.out_dir, "ranks": gt["world_size"], "steps": gt["num_steps"],
                      "bytes": [r["uncompressed_bytes"] for r in gt["ranks"]]}))


if __name__ == "__main__":
    main()
