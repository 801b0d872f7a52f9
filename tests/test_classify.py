import pytest

from analysis.classify import classify_kernel


@pytest.mark.parametrize("name,want", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", ("comm", "allreduce")),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", ("comm", "allreduce")),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", ("comm", "sendrecv")),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", ("comm", "sendrecv")),
    ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", ("comm", "nccl_other")),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", ("comm", "broadcast")),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*)", ("comm", "alltoall")),
    ("void nvshmemi_transfer_rma_kernel<...>", ("comm", "nvshmem")),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", ("compute", "gemm")),
    ("Cijk_Alik_Bljk_HHS_BH_MT128x128x32", ("compute", "gemm")),
    ("flash_fwd_kernel", ("compute", "attention")),
    # flash kernels carry cutlass:: in their template arguments: still attention, not gemm
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>"
     "(Flash_fwd_params)", ("compute", "attention")),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", ("compute", "elementwise")),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdam>", ("compute", "optimizer")),
    ("_combined_routing_kernel", ("compute", "other")),  # MoE routing is compute, not comm
])
def test_rules(name, want):
    assert classify_kernel(name) == want
