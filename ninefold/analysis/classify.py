"""Where a kernel name becomes a class: a table of rules, first match wins.

A rule is (pattern, family, class, source): a Python regular expression searched (case-insensitive unless the
pattern says ``(?-i:…)``) in the name as the trace prints it, the family (``comm``, ``compute`` or ``copy``),
the class, and where the names come from (library and file, or the trace they were seen in; the names
themselves are the test cases of tests/test_classify.py). Families: ``comm`` kernels are charged as
communication and their class is the collective they run (allreduce, allgather, reducescatter, alltoall,
sendrecv, broadcast, reduce, barrier; ``nccl_other`` where the name does not say which, as for NCCL's Generic
kernel; ``nvshmem`` for one-sided transfers); ``compute`` classes are gemm, gemm_grouped (grouped / MoE /
batched expert GEMMs, a kind of gemm: see ``classes_of``), attention, elementwise, reduction (norms, softmax,
reductions), optimizer and other; ``copy`` is memcpy / memset, from the activity kind or a runtime's copy
kernels. Unknown names are compute/other.

Order matters and is tested: communication first (an all-reduce called ``…reduce…`` is communication), then
copies, then torch.compile's ``triton_<kind>_`` prefix (its fused names list every ATen op they touch), MoE
routing and DeepEP's local bookkeeping, then attention before GEMM (flash kernels carry ``cutlass::`` in their
template arguments), GEMM families (grouped first) before norms and the quantize/cast kernels that feed them
(a norm fused with a quantize is a norm), and the generic word lists last. Reference: the kernel-name families with
their sources in the project's reference notes (kernels.md).

Versioned: bump RULES_VERSION whenever a rule changes (it keys the stored kernel_classes rows and the recorded
reference ledgers).
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

RULES_VERSION = 2


class Rule(NamedTuple):
    pattern: str
    family: str
    kclass: str
    source: str


_NCCL = r"\bnccl(?:Dev|SymkDev)?Kernel_"
_DEEPEP = r"\b(?:deep_ep|dpsk::ep)::(?:legacy::)?(?:intranode|internode|internode_ll)::"

RULES = [
    # ---- communication --------------------------------------------------------------------------------------
    # NCCL <= 2.18 ncclKernel_<Coll>_<Algo>_<Proto>_<Op>_<type>;
    # >= 2.19 ncclDevKernel_<Coll>[_<Op>_<ty>]_<ALGO>_<PROTO>;
    # 2.27+ symmetric ncclSymkDevKernel_<Coll>_<Algo>…
    Rule(_NCCL + r"(?:SendRecv|Send|Recv)(?![a-z])", "comm", "sendrecv",
         "NVIDIA/nccl src/device/generate.py; v2.18.6 src/include/collectives.h (all-to-all also runs as SendRecv)"),
    Rule(_NCCL + r"AllReduce", "comm", "allreduce", "NVIDIA/nccl src/device/generate.py, symmetric/generate.py"),
    Rule(_NCCL + r"AllGather", "comm", "allgather", "NVIDIA/nccl src/device/generate.py (AllGatherV since 2.29)"),
    Rule(_NCCL + r"ReduceScatter", "comm", "reducescatter", "NVIDIA/nccl src/device/generate.py"),
    Rule(_NCCL + r"Broadcast", "comm", "broadcast", "NVIDIA/nccl src/device/generate.py"),
    Rule(_NCCL + r"Reduce(?![a-z])", "comm", "reduce", "NVIDIA/nccl src/device/generate.py"),
    Rule(_NCCL + r"All_?to_?All", "comm", "alltoall", "NVIDIA/nccl (older trees)"),
    Rule(r"\bnccl(?:Dev)?Kernel|\brcclGenericKernel\b|\bmscclKernel_", "comm", "nccl_other",
         "ncclDevKernel_Generic (NCCL fallback, RCCL), ROCm/rccl src/device/msccl_kernel_impl.h: "
         "no collective in the name"),
    # PyTorch symmetric memory: reduce_scatter_out launches two_shot_all_reduce_kernel<T, align, ws, true, …>
    Rule(r"\btwo_shot_all_reduce_kernel(?:_inplace)?<(?:[^<>,]*,\s*){3}true\b", "comm", "reducescatter",
         "pytorch torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryOps.cu (reduce_scatter_out)"),
    Rule(r"\b(?:multimem_(?:one_shot_)?all_reduce|one_shot_all_reduce|two_shot_all_reduce)_kernel", "comm",
         "allreduce", "pytorch c10d/symm_mem/CUDASymmetricMemoryOps.cu (NVLS multimem, one-/two-shot)"),
    Rule(r"\bmultimem_all_gather_kernel", "comm", "allgather", "pytorch c10d/symm_mem/CUDASymmetricMemoryOps.cu"),
    Rule(r"\b(?:allToAllV(?:_2d|Push)?|exchangeSplitAndOffset(?:_2d)?)\b", "comm", "alltoall",
         "pytorch c10d/symm_mem/nvshmem_extension.cu (MoE token shuffle)"),
    # inference-engine custom all-reduce (vLLM / SGLang / aiter, FlashInfer / TensorRT-LLM)
    Rule(r"cross_device_reduce_[12]stage|allreduce_fusion_kernel|lamport_style_one_shot_all_reduce"
         r"|one_?shot_?all_?reduce|two_?shot_?all_?reduce"
         r"|\bfused_(?:allreduce_allgather|reducescatter_allreduce)_kernel",
         "comm", "allreduce", "vllm custom_all_reduce.cuh; flashinfer include/flashinfer/comm/trtllm_allreduce*.cuh"),
    Rule(r"\ballgather_kernel\b", "comm", "allgather", "flashinfer include/flashinfer/comm/"),
    Rule(r"\breducescatter_kernel\b", "comm", "reducescatter", "flashinfer include/flashinfer/comm/"),
    Rule(r"\bmoeA2A\w*Kernel\b|\b(?:moe|helix)AllToAll\w*Kernel\b|\ballToAllMetadataDevice\b", "comm", "alltoall",
         "flashinfer csrc/nv_internal/tensorrt_llm/kernels/communicationKernels/moeAlltoAllKernels.cu"),
    # MSCCL++
    Rule(r"\ballreduce(?:AllPairs|Fullmesh|Packet|Nvls\w*|RsAg\w*|\d|_LL_\w+)\b", "comm", "allreduce",
         "microsoft/mscclpp src/ext/collectives/allreduce/*.cu"),
    Rule(r"\ballgatherFullmesh2?\b", "comm", "allgather", "microsoft/mscclpp src/ext/collectives/allgather/"),
    Rule(r"\bmscclpp\w*::\w*executionKernel\b|^(?:void )?executionKernel\b", "comm", "nccl_other",
         "microsoft/mscclpp src/core/include/execution_kernel.hpp (DSL plans: no collective in the name)"),
    # DeepEP expert-parallel dispatch / combine and their notify (count exchange + barrier) kernels; the
    # namespace is what tells them from other libraries' bare dispatch/combine
    Rule(_DEEPEP + r"(?:notify_dispatch|cached_notify(?:_dispatch|_combine)?|dispatch|combine)\b", "comm", "alltoall",
         "deepseek-ai/DeepEP csrc/kernels/{intranode,internode,internode_ll}.cu; dpsk::ep in DeepSeek profile-data"),
    Rule(r"\bdeep_ep::elastic::(?:hybrid_)?(?:dispatch|combine)_impl\b", "comm", "alltoall",
         "deepseek-ai/DeepEP deep_ep/include/deep_ep/impls/ (EPv2)"),
    Rule(_DEEPEP + r"barrier\b|\bdeep_ep::elastic::barrier_impl\b", "comm", "barrier",
         "deepseek-ai/DeepEP intranode.cu barrier<kNumRanks>, impls/barrier"),
    Rule(r"\bdeep_ep::elastic::pp_(?:send|recv)_impl\b", "comm", "sendrecv",
         "deepseek-ai/DeepEP impls/pp_send, pp_recv"),
    Rule(r"\bflashinfer::comm::\S*Barrier", "comm", "barrier",
         "flashinfer include/flashinfer/comm/ (Ulysses PCIe barrier)"),
    Rule(r"\bnvshmem", "comm", "nvshmem", "NVSHMEM device transfers"),
    # ---- copies named as kernels (ROCm 7.1) and synthesized copy names ----------------------------------------
    Rule(r"^(?:Memcpy \w+ \(|\[CUDA memcpy|MEMORY_COPY_\w+(?:\.kd)?$|__amd_rocclr_copyBuffer)", "copy", "memcpy",
         "kineto libkineto/src/CuptiActivity.h memcpyName; nsys stats; TraceLens PR #613 (ROCm 7.1)"),
    Rule(r"^(?:Memset \(|\[CUDA memset|__amd_rocclr_fillBuffer)", "copy", "memset",
         "kineto CuptiActivity.h; TraceLens PR #861 (hipMemsetAsync)"),
    # ---- torch.compile (Inductor) kernels: the class is the triton_<kind>_ prefix, whatever op names follow ----
    Rule(r"^triton_tem_fused_flex_(?:attention|decoding)", "compute", "attention",
         "pytorch torch/_inductor/kernel/flex_attention.py (ROCm/triton #953)"),
    Rule(r"^triton_tem_", "compute", "gemm",
         "pytorch torch/_inductor/codegen/triton.py: template kernels (mm, addmm, bmm)"),
    Rule(r"^triton_(?:red|per|spl)_", "compute", "reduction",
         "pytorch torch/_inductor/codegen/triton.py: reduction, persistent_reduction, split_scan"),
    Rule(r"^triton_(?:poi|for)_", "compute", "elementwise",
         "pytorch torch/_inductor/codegen/triton.py: pointwise, foreach"),
    # ---- DeepEP / MoE bookkeeping: local, no transfer -----------------------------------------------------------
    Rule(r"\b(?:deep_ep|dpsk::ep)::\S*(?:get_dispatch_layout|clean_low_latency_buffer"
         r"|(?:query|update|clean)_mask_buffer)\b"
         r"|\btopkGatingSoftmax|\bmoe_align_block_size|_combined_routing_kernel|\bgatherTopK\b|RadixSort", "compute",
         "other", "DeepEP layout.cu / internode_ll.cu; vllm moe_align_block_size, topk_softmax; ATen sbtopk, cub sort"),
    # ---- attention (library names, never the bare word) ---------------------------------------------------------
    Rule(r"\bflash_(?:fwd|bwd)_\w*kernel\b|\bpytorch_flash::|\bflash::(?:FlashAttn\w+|prepare_varlen_num_blocks_kernel"
         r"|compute_attn\w*)|(?:FlashAttention|Attn)\w*?(?:Forward|Backward)Sm\d+", "compute", "attention",
         "Dao-AILab/flash-attention csrc/flash_attn/src, hopper/ (FA2, FA3), flash_attn/cute (FA4); "
         "deepseek-ai/FlashMLA"),
    Rule(r"fmha|cudnn_generated_fort_native_sdpa_|\bsparse_attn_fwd_kernel|\bget_mla_metadata_kernel"
         r"|\bmla_decode\w*|\baiter::(?:mla|pa)_|_ZN5aiter\d+(?:mla_|pa_)", "compute", "attention",
         "pytorch mem_eff_attention (fmha_cutlassF/B); cuDNN SDPA; TRT-LLM fmhaSm100*; ck_tile Fmha*Kernel; aiter asm"),
    Rule(r"\b(?:Batch|Single)(?:Prefill|Decode)With\w*KVCacheKernel|\bBatchMLAPage\w*Kernel|\bMergeState\w*Kernel"
         r"|AttentionSumKernel|paged_attention|unified_attention|\b_?attn_(?:fwd|bwd)\b|\bbwd_kernel_dk_dv\b"
         r"|\bbwd_kernel_dq\b|_mqa_logits|gated_delta_rule", "compute", "attention",
         "flashinfer include/flashinfer/attention/; vllm paged/unified attention; ROCm/aotriton; DeepGEMM "
         "mqa_logits; FLA"),
    # ---- GEMM: grouped / MoE / batched expert GEMMs first --------------------------------------------------------
    Rule(r"\bdpsk::grouped_gemm::\S*utils::", "compute", "elementwise",
         "DeepSeek profile-data train.json: grouped-GEMM helpers (transpose, fill_tensormaps)"),
    Rule(r"grouped_gemm|gemm_?grouped|GroupProblemShape|GemmType\)\s*[12356]\b|_mega_moe_impl|\bfused_moe_kernel\b"
         r"|fmoe_|\bkernel_moe_(?:mx)?gemm|MoeGemm|MoeFlatmm|\bmfma_moe\d|marlin_moe|_matmul_ogs_"
         r"|^(?:void )?bmm_(?:bfloat16|fp16|fp32|e4m3|e2m1|mxe4m3|mxe2m1)_"
         r"|\bBatchedGemmKernel_|\bMoE_Proj(?:Up|Down)_", "compute", "gemm_grouped",
         "CUTLASS GemmGrouped / GroupProblemShape; DeepGEMM GemmType; TRT-LLM trtllmGen bmm_ (MXFP4/NVFP4/FP8) and "
         "blockScaleMoe; vllm fused_moe; aiter/CK fmoe, moe_gemm; triton_kernels matmul_ogs; dpsk::grouped_gemm"),
    Rule(r"\bsm\d+_xmma_|\bnvjet_"
         r"|\b(?:ampere|volta|turing|maxwell|pascal|kepler|hopper|blackwell|sm\d+)_\w*?[sdhcz]?gemm"
         r"|\bcutlass(?:3x)?_(?:sm)?\d+_\w*gemm|GemmUniversal|cutlass::gemm::|ImplicitGemm|\bgemv\w*_kernel|\bgemvx"
         r"|\bgemmSN_\w+_kernel|\bgemmk1_kernel|splitKreduce_kernel|ReduceSplitK|\bdeep_gemm::|\bfp8_gemm_kernel"
         r"|\bGemm(?:GatedAct)?Kernel|(?-i:^(?:void )?(?:Custom_)?Cijk_|\bC[a-z]{3}_A[a-z]{3}_B[a-z]{3}_)"
         r"|kernel_gemm_xdl|GridwiseGemm|\bwvSplitK|_gemm_a\d+w\d+|_gemm_a16_w16|\bmarlin::Marlin|\bmatmul_kernel\b"
         r"|_ZN5aiter\d+(?:f4gemm|fp8gemm|bf16gemm)", "compute", "gemm",
         "cuBLAS/cuBLASLt sm90_xmma_*, nvjet_*, sm100_*; CUTLASS; DeepGEMM; TRT-LLM GemmKernel_*; hipBLASLt/Tensile "
         "Cijk_*; CK xdl; vllm marlin, wvSplitK; splitKreduce is the split-K epilogue"),
    # convolutions (cuDNN implicit GEMM, winograd, cuDNN engines): no class of their own, counted as GEMM work
    Rule(r"scudnn|implicit_convolve|convolve_\w*gemm|winograd|\bconv\w*_(?:fwd|bwd|dgrad|wgrad)|dgrad_engine|wgrad_alg"
         r"|xmma_(?:fprop|dgrad|wgrad)|_s\d+(?:fprop|dgrad|wgrad)_", "compute", "gemm",
         "cuDNN convolution kernels (HTA #122); kernels.md G7"),
    # ---- norms (also fused with a quantize: the norm is the work) -------------------------------------------------
    Rule(r"layer_?norm|rms_?norm|\bln_(?:fwd|bwd)\w*_kernel|RowwiseMoments|GammaBetaBackward|group_?norm|batch_?norm"
         r"|\bbn_(?:fw|bw)_", "compute", "reduction",
         "pytorch layer_norm_kernel.cu; TE common/normalization/; apex layer_norm; vllm rms_norm; aiter "
         "add_rmsnorm_quant; ck_tile Rmsnorm2d; cuDNN bn_*"),
    # ---- quantize / cast / KV-cache writes: elementwise, whatever dtype or GEMM words they hold -----------------
    Rule(r"quantiz|_quant(?:_|\b)|\bquant_|fp4_quant|\bcast_|_cast_|_cast\b|cast_transpose|reshape_and_cache"
         r"|AppendPagedKVCache", "compute", "elementwise",
         "TRT-LLM fp4Quantize quantize_with_block_size; TE cast_transpose; DeepSeek per_token_cast_to_fp8; vllm "
         "reshape_and_cache_flash_kernel; flashinfer page.cuh"),
    # ---- optimizer ---------------------------------------------------------------------------------------------
    Rule(r"LpNormFunctor|L2NormFunctor|lpnorm_cleanup", "compute", "reduction",
         "pytorch ForeachReduceOp.cu (grad-norm, clip_grad_norm_)"),
    Rule(r"multi_tensor_apply|Fused(?:Adam|AdamW|Sgd|Adagrad)\w*Functor|AdamFunctor|LAMBStage\dFunctor|adagrad|\badam"
         r"|_adam_|\bsgd|lamb_|optimizer|fused_optim", "compute", "optimizer",
         "pytorch fused_adam_utils.cuh, MultiTensorApply.cuh; apex / TE / DeepSpeed multi_tensor_adam.cu; "
         "FBGEMM rowwise adagrad"),
    # ---- ATen elementwise (before the word lists: a scatter with a ReduceAdd functor is still elementwise) -----
    Rule(r"\b(?:vectorized_|unrolled_)?elementwise_kernel|index_elementwise_kernel|CatArrayBatchedCopy"
         r"|_scatter_gather_elementwise_kernel|distribution_elementwise", "compute", "elementwise",
         "pytorch aten/src/ATen/native/cuda/CUDALoops.cuh, Loops.cuh"),
    # ---- norms, softmax, reductions ------------------------------------------------------------------------------
    Rule(r"softmax|cunn_SoftMax|reduce|welford|sum_kernel|\bmean|argmax|argmin|embedding_backward"
         r"|cross_entropy|nll_loss", "compute", "reduction",
         "pytorch SoftMax.cu, Reduce.cuh, Embedding.cu, Loss.cu; cub DeviceReduce"),
    # ---- generic elementwise words --------------------------------------------------------------------------------
    Rule(r"elementwise|vectorized|unrolled|copy_kernel|_copy_|fill|cat_|index|gelu|silu|relu|swiglu|act_and_mul"
         r"|rotary|rope|transpose|add|mul|dropout", "compute", "elementwise", "common ATen / fused-kernel words"),
    # ---- a GEMM the families above do not know ---------------------------------------------------------------
    Rule(r"gemm|matmul|cublas", "compute", "gemm", "fallback: the word"),
]
_COMPILED = [(re.compile(r.pattern, re.IGNORECASE), r) for r in RULES]

# classes that are a kind of another: a consumer asking for gemm also gets the grouped GEMMs
PARENT = {"gemm_grouped": "gemm"}


def rule_of(name: str) -> Rule | None:
    """The first rule NAME meets (None: compute/other)."""
    n = name or ""
    for rx, r in _COMPILED:
        if rx.search(n):
            return r
    return None


@lru_cache(maxsize=1 << 16)
def classify_kernel(name: str) -> tuple[str, str]:
    """(family, class) of a kernel name; unknown kernels are compute/other."""
    r = rule_of(name)
    return ("compute", "other") if r is None else (r.family, r.kclass)


def classes_of(wanted: str) -> list[str]:
    """WANTED and the classes that are a kind of it (gemm: gemm, gemm_grouped)."""
    return [wanted] + sorted(k for k, v in PARENT.items() if v == wanted)


def is_comm(name: str) -> bool:
    """NAME is a communication kernel."""
    return classify_kernel(name)[0] == "comm"
