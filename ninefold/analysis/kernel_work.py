"""The work one kernel does, from what the trace records (ninefold.analysis.efficiency's formulas): FLOPs of GEMMs and
attention from the launching op's Input Dims / Input type, bytes moved by memory-bound ops, and nccl-tests' bus
bandwidth factors. Pure functions of an op's recorded arguments; nothing is guessed (None / a reason instead).
"""
from __future__ import annotations

import math

from ninefold.analysis.process_groups import canonical

# ---------------------------------------------------------------- communication (nccl-tests' definitions)
def bus_factor(coll: str, n: int) -> float | None:
    """nccl-tests' busbw / algbw for a collective over N ranks (src/*.cu ``GetBw``); None for an unknown one."""
    c = canonical(coll) or coll
    if c == "allreduce":
        return 2.0 * (n - 1) / n
    if c in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    if c in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    return None


def bus_bandwidth(coll: str, size_bytes: float, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s as nccl-tests prints them: algbw = size / time, busbw = algbw × bus_factor.
    SIZE is nccl-tests' "size" column: the larger of the send and receive buffer of one rank."""
    f = bus_factor(coll, n)
    if f is None:
        raise ValueError(f"no bus bandwidth factor for collective {coll!r}")
    alg = size_bytes / seconds
    return alg, alg * f


# ---------------------------------------------------------------- shapes
# Input type spellings (c10 ScalarType names as Kineto writes them) -> (math kind, element bytes)
_DTYPES = {
    "float": ("fp32", 4), "bfloat16": ("bf16", 2), "half": ("fp16", 2), "double": ("fp64", 8),
    "float8_e4m3fn": ("fp8", 1), "float8_e5m2": ("fp8", 1), "float8_e4m3fnuz": ("fp8", 1),
    "float8_e5m2fnuz": ("fp8", 1), "long int": ("int64", 8), "long": ("int64", 8), "int": ("int32", 4),
    "short int": ("int16", 2), "short": ("int16", 2), "signed char": ("int8", 1), "char": ("int8", 1),
    "unsigned char": ("uint8", 1), "byte": ("uint8", 1), "bool": ("bool", 1), "complex<float>": ("c64", 8),
    "complexfloat": ("c64", 8), "complex<double>": ("c128", 16), "complexdouble": ("c128", 16),
}


def dtype_info(t) -> tuple[str, int] | None:
    """(math kind, element bytes) of an ``Input type`` entry; None for scalars, lists and absent arguments."""
    if not isinstance(t, str):
        return None
    return _DTYPES.get(t.lower().removeprefix("c10::").strip())


def _numel(dims) -> int:
    return math.prod(int(d) for d in dims)


def _mat(dims, types, i, rank):
    """(shape, dtype kind) of tensor argument I when it has RANK dimensions, else None."""
    if i >= len(dims) or i >= len(types):
        return None
    d, t = dims[i], dtype_info(types[i])
    if t is None or not isinstance(d, list) or len(d) != rank or not all(isinstance(x, int) for x in d):
        return None
    return d, t[0]


# aten op -> (index of A, index of B, batched)
GEMM_OPS = {"aten::mm": (0, 1, False), "aten::addmm": (1, 2, False), "aten::_addmm_activation": (1, 2, False),
            "aten::_scaled_mm": (0, 1, False), "aten::bmm": (0, 1, True), "aten::baddbmm": (1, 2, True)}


def gemm_flops(op: str, dims, types) -> tuple[float, str]:
    """(FLOPs, math dtype kind) of a matrix-multiply op from its Input Dims / Input type; ValueError saying why
    when they do not give them."""
    ia, ib, batched = GEMM_OPS[op]
    r = 3 if batched else 2
    a, b = _mat(dims, types, ia, r), _mat(dims, types, ib, r)
    if a is None or b is None:
        raise ValueError(f"{op}: Input Dims do not hold two {r}-D tensor operands")
    (da, ka), (db, _) = a, b
    if da[-1] != db[-2] or (batched and da[0] != db[0]):
        raise ValueError(f"{op}: operand shapes {da} and {db} do not multiply")
    flops = 2.0 * da[-2] * da[-1] * db[-1] * (da[0] if batched else 1)
    return flops, ka


# op -> (q, k, v argument index, layout, causal argument index, causal kind, passes over forward FLOPs)
ATTENTION_OPS = {
    "aten::_flash_attention_forward": (0, 1, 2, "bshd", 8, "bool", 1.0),
    "aten::_flash_attention_backward": (1, 2, 3, "bshd", 11, "bool", 2.5),
    "aten::_scaled_dot_product_flash_attention": (0, 1, 2, "bhsd", 4, "bool", 1.0),
    "aten::_scaled_dot_product_flash_attention_backward": (1, 2, 3, "bhsd", 11, "bool", 2.5),
    "aten::_efficient_attention_forward": (0, 1, 2, "bshd", 9, "mask", 1.0),
    "aten::_efficient_attention_backward": (1, 2, 3, "bshd", 14, "mask", 2.5),
    "aten::_scaled_dot_product_efficient_attention": (0, 1, 2, "bhsd", 6, "bool", 1.0),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, 2, 3, "bhsd", 11, "bool", 2.5),
    "aten::_scaled_dot_product_cudnn_attention": (0, 1, 2, "bhsd", 6, "bool", 1.0),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, 2, 3, "bhsd", 14, "bool", 2.5),
    "flash_attn::_flash_attn_forward": (0, 1, 2, "bshd", 5, "bool", 1.0),
    "flash_attn::_flash_attn_backward": (1, 2, 3, "bshd", 11, "bool", 2.5),
}


def attention_flops(op: str, dims, types, concrete) -> tuple[float, str, bool]:
    """(FLOPs, math dtype kind, causal) of an attention op; ValueError saying why when the trace does not give
    them."""
    iq, ik, iv, layout, ic, ckind, passes = ATTENTION_OPS[op]
    q, k, v = (_mat(dims, types, i, 4) for i in (iq, ik, iv))
    if q is None or k is None or v is None:
        raise ValueError(f"{op}: query/key/value are not 4-D tensors (variable-length batches: per-sequence "
                         "lengths are not recorded)")
    (dq, kind), (dk, _), (dv, _) = q, k, v
    if layout == "bshd":
        b, sq, h, d = dq
        sk, dvh = dk[1], dv[3]
    else:
        b, h, sq, d = dq
        sk, dvh = dk[2], dv[3]
    if dk[0] != b or dk[-1] != d:
        raise ValueError(f"{op}: query {dq} and key {dk} do not match")
    c = concrete[ic] if isinstance(concrete, list) and ic < len(concrete) else None
    if ckind == "bool":
        causal = {"True": True, "False": False, "true": True, "false": False, "1": True, "0": False}.get(str(c))
    else:  # custom_mask_type: 0 none, 1 causal from the top left, 2 from the bottom right
        causal = {"0": False, "1": True, "2": True}.get(str(c))
    if causal is None:
        raise ValueError(f"{op}: is_causal not recorded (no Concrete Inputs)")
    if causal and sq != sk:
        raise ValueError(f"{op}: causal with {sq} queries and {sk} keys: the mask's alignment is not recorded")
    pairs = sq * (sq + 1) / 2 if causal else sq * sk
    return passes * 2.0 * b * h * pairs * (d + dvh), kind, causal


# memory-bound ops by base name (aten:: and a trailing in-place '_' stripped): output of the broadcast shape
ELEMENTWISE = {
    "add", "sub", "rsub", "mul", "div", "neg", "abs", "exp", "log", "log1p", "sqrt", "rsqrt", "pow", "reciprocal",
    "tanh", "sigmoid", "relu", "gelu", "silu", "mish", "hardswish", "leaky_relu", "elu", "sin", "cos",
    "threshold_backward", "gelu_backward", "silu_backward", "sigmoid_backward", "tanh_backward", "where",
    "clamp", "clamp_min", "clamp_max", "masked_fill", "native_dropout", "native_dropout_backward", "_softmax",
    "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "native_layer_norm",
    "native_layer_norm_backward", "_fused_rms_norm", "native_batch_norm", "native_group_norm", "addcmul",
    "addcdiv", "lerp", "erf", "floor", "ceil", "round", "sign", "square", "maximum", "minimum",
}
COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "isnan", "isinf"}
REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "prod", "all", "any", "argmax", "argmin", "norm",
              "linalg_vector_norm", "var", "std", "var_mean", "std_mean", "logsumexp"}
WRITE_ONLY = {"fill", "zero", "normal", "uniform", "bernoulli"}


def _broadcast(shapes):
    out: list[int] = []
    for s in shapes:
        for i, d in enumerate(reversed(s)):
            if i == len(out):
                out.insert(0, d)
            else:
                j = len(out) - 1 - i
                if out[j] == 1:
                    out[j] = d
                elif d not in (1, out[j]):
                    raise ValueError(f"shapes {shapes} do not broadcast")
    return out


def memory_bytes(op: str, dims, types) -> tuple[float, str]:
    """(bytes moved, how they were counted) of a memory-bound op; ValueError saying why when unknown."""
    name = op.removeprefix("aten::")
    inplace = len(name) > 1 and name.endswith("_") and not name.endswith("__")
    base = name[:-1] if inplace else name
    tens = [(d, dtype_info(t)[1]) for d, t in zip(dims, types)
            if dtype_info(t) is not None and isinstance(d, list) and all(isinstance(x, int) for x in d)]
    if not tens:
        raise ValueError(f"{op}: Input Dims hold no plain tensor inputs (tensor lists are not sized)")
    read = float(sum(_numel(d) * e for d, e in tens))
    first = float(_numel(tens[0][0]) * tens[0][1])
    if inplace and base in WRITE_ONLY:
        return first, "self written"
    if base == "copy" and len(tens) >= 2:  # copy_(self, src): src read, self written
        return read, "src read + self written"
    if base == "clone":
        return 2 * first, "self read + written"
    if inplace and (base in ELEMENTWISE or base in COMPARISONS):
        return read + first, "inputs read + self written"
    if base in ELEMENTWISE or base in COMPARISONS:
        n = _numel(_broadcast([d for d, _ in tens]))
        return read + n * (1 if base in COMPARISONS else tens[0][1]), "inputs read + output written"
    if base in REDUCTIONS:
        return read, "inputs read (output not counted: a lower bound)"
    if "conv" in base:
        raise ValueError(f"{op}: convolution FLOPs need stride, padding and dilation (not derived)")
    raise ValueError(f"bytes moved by {op} are not derived from its inputs")
