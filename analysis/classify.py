"""Kernel-name rules as data. Versioned: bump RULES_VERSION whenever a rule changes.

Each rule: (regex on the kernel name, family, class). The first match wins. Families: comm, compute.
Memcpy/memset are known from the activity kind, not the name.
"""
import re

RULES_VERSION = 1

RULES = [
    # NCCL <= 2.18: ncclKernel_AllReduce_RING_LL_Sum_float; >= 2.19: ncclDevKernel_AllReduce_Sum_f32_RING_LL
    (r"^nccl(Dev)?Kernel_SendRecv|^nccl(Dev)?Kernel_(Send|Recv)\b", "comm", "sendrecv"),
    (r"^nccl(Dev)?Kernel_AllReduce", "comm", "allreduce"),
    (r"^nccl(Dev)?Kernel_AllGather", "comm", "allgather"),
    (r"^nccl(Dev)?Kernel_ReduceScatter", "comm", "reducescatter"),
    (r"^nccl(Dev)?Kernel_Broadcast", "comm", "broadcast"),
    (r"^nccl(Dev)?Kernel_Reduce\b|^nccl(Dev)?Kernel_Reduce_", "comm", "reduce"),
    (r"^nccl(Dev)?Kernel_AllToAll|^nccl(Dev)?Kernel_AlltoAll", "comm", "alltoall"),
    (r"^ncclDevKernel_Generic|^nccl(Dev)?Kernel", "comm", "nccl_other"),  # RCCL: ncclDevKernel_Generic
    (r"nvshmem", "comm", "nvshmem"),
    # DeepEP-style expert parallel dispatch/combine: communication that is not NCCL
    (r"deep_ep::|intranode::(dispatch|combine)|internode::(dispatch|combine)|internode_ll::", "comm", "alltoall"),
    # attention before gemm: flash kernels carry cutlass:: in their template arguments
    (r"flash|fmha|attention|attn|sdpa|softmax", "compute", "attention"),
    (r"gemm|matmul|cutlass|cublas|xmma|nvjet|wgmma|_mm_|Cijk_|hipblaslt|sgemm|hgemm", "compute", "gemm"),
    (r"adam|sgd|optimizer|multi_tensor_apply|fused_optim", "compute", "optimizer"),
    (r"reduce|norm|sum_kernel|mean|argmax|welford", "compute", "reduction"),
    (r"elementwise|vectorized|unrolled|triton_|copy_kernel|fill|cat_|index|gelu|silu|relu|add|mul", "compute",
     "elementwise"),
]
_COMPILED = [(re.compile(p, re.IGNORECASE), fam, cls) for p, fam, cls in RULES]


def classify_kernel(name: str) -> tuple[str, str]:
    """(family, class) of a kernel name; unknown kernels are compute/other."""
    n = name or ""
    for rx, fam, cls in _COMPILED:
        if rx.search(n):
            return fam, cls
    return "compute", "other"
