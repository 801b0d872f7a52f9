"""The Kineto rank-file writer shared by the sample generators: constants of a realistic H100 job (kernel
names, streams, latencies), RankTrace (one rank's CPU and GPU events, one per line, with ``ts``/``dur`` and
string literals from ``ninefold.analysis.chrome_trace``, the project's one Chrome-trace text writer), and the header,
metadata and footer of a rank file."""
from __future__ import annotations

import gzip as _gzip
import json
from pathlib import Path

from ninefold.analysis.chrome_trace import fmt_us, json_str as _j

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
        self.gemm_scale = 1.0  # a planted slow-down of every GEMM kernel (the twin of a job for diffs)
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
            f'"ts": {fmt_us(ts)}, "dur": {fmt_us(d)}, "args": {args}}},\n')
        c = self.counts
        c[cat] = c.get(cat, 0) + 1

    def runtime(self, name, t, d, cid, x, cbid):
        ts = t + self.off
        pid, tid = self.pid, self.tid
        tss = fmt_us(ts)
        ext = f', "External id": {x}' if x is not None else ""
        self.cbuf.append(
            f'  {{"ph": "X", "cat": "cuda_runtime", "name": "{name}", "pid": {pid}, "tid": {tid}, '
            f'"ts": {tss}, "dur": {fmt_us(d)}, '
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
        tss = fmt_us(ts)
        self.gbuf.append(
            f'  {{"ph": "X", "cat": "{cat}", "name": {_j(name)}, "pid": {DEVICE}, "tid": {stream}, '
            f'"ts": {tss}, "dur": {fmt_us(d)}, '
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
        if self.gemm_scale != 1.0 and "gemm" in kname:
            kdur = int(round(kdur * self.gemm_scale))
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
