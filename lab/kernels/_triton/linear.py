"""linear in Triton: y = x·Wᵀ + b, one tiled GEMM kernel with the bias fused, W (N, K) read as stored (K-contiguous).

One kernel, three precisions, picked by a constexpr at launch: float32 multiplied in strict FP32 (input_precision
"ieee": FMAs on the CUDA cores, beside the SIMT ladder v1..v9), float32 in TF32 ("tf32": tensor cores, beside v10/v11
at TF32) and bfloat16 (tensor cores, fp32 accumulation, beside v10/v11 at bf16).

What Triton does for free: the shared-memory staging and the multi-stage async-copy pipeline (num_stages; cp.async
on Ampere, TMA/wgmma on Hopper where its pipeliner chooses), the swizzled layouts that the hand-written v7..v11 spend
most of their lines on, and the tensor-core instructions themselves (tl.dot). What it leaves to us: the tile shape
(autotuned over the few configs below), the program order (grouped by GROUP_M for L2 reuse of W's columns), masking of
the edges, the bias epilogue.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import check_device, interpreting

# A few configs, kept small: 128x128 and 128x256 tiles for the large square problems, 64-row tiles for small M.
CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=4, num_stages=4),
]


# The interpreter cannot time configs (no CUDA events), and one is enough to check, so it gets one, picked when the
# kernel is decorated (when TRITON_INTERPRET is read). Pruning to one at launch is not enough: Triton 3.6's autotuner
# still times a lone survivor (3.8's does not), running the interpreted kernel over and over where there is a GPU and
# failing for want of a driver where there is none.
@triton.autotune(configs=CONFIGS[:1] if interpreting() else CONFIGS, key=["M", "N", "K", "PRECISION"])
@triton.jit
def linear_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                  HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, K_STATIC: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # Grouped order: GROUP_M row tiles sweep the column tiles together, so a W tile is read from L2 by GROUP_M
    # programs in a row instead of from DRAM by each.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * tiles_n
    first_m = (pid // in_group) * GROUP_M
    group_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_m
    pid_n = (pid % in_group) // group_m

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)          # rows of x and y
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)          # rows of W = columns of y
    rk = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :]     # (BLOCK_M, BLOCK_K) of x
    w_ptrs = w_ptr + rn[None, :].to(tl.int64) * stride_wn + rk[:, None]     # (BLOCK_K, BLOCK_N) of Wᵀ: W as stored
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # K_STATIC: K as a Python int, under the interpreter only (see linear()); on the GPU it is None and the loop runs
    # to the runtime K, so one compile serves every K.
    for k0 in range(0, K if K_STATIC is None else K_STATIC, BLOCK_K):
        k_ok = rk < K - k0                                 # K's tail; rows past M / N read zeros, never stored
        a = tl.load(x_ptrs, mask=(rm[:, None] < M) & k_ok[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=(rn[None, :] < N) & k_ok[:, None], other=0.0)
        if UPCAST:   # the interpreter only (see linear()): bf16 products are exact in fp32, so the sums match
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rm[:, None].to(tl.int64) * stride_ym + rn[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
           tf32: bool = False) -> torch.Tensor:
    """y = x @ weight.T + bias. x: (..., K), weight: (N, K), bias: (N,) or None; float32 or bfloat16, contiguous.
    tf32: float32 inputs multiply in TF32 on the tensor cores (else strict FP32); bfloat16 ignores it."""
    if x.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"x must be float32 or bfloat16, got {x.dtype}")
    if weight.dim() != 2 or x.dim() < 1 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"weight must have shape (N, K) with K = x.size(-1) = {x.shape[-1] if x.dim() else '?'}, "
                         f"got {tuple(weight.shape)}")
    n, k = weight.shape
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias must have shape (N,) = ({n},), got {tuple(bias.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != x.dtype:
            raise TypeError(f"{name} must have x's dtype {x.dtype}, got {t.dtype}")
    lead = tuple(x.shape[:-1])
    out = torch.empty(*lead, n, dtype=x.dtype, device=x.device) if out is None else out
    if tuple(out.shape) != lead + (n,) or out.dtype != x.dtype:
        raise ValueError(f"out must have shape {lead + (n,)} and dtype {x.dtype}, got {tuple(out.shape)} {out.dtype}")
    for name, t in (("x", x), ("weight", weight), ("bias", bias), ("out", out)):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    check_device(x=x, weight=weight, bias=bias, out=out)
    m = math.prod(lead)
    if m == 0 or n == 0:
        return out
    x2, y2 = x.view(m, k), out.view(m, n)                 # x: (M, K), y: (M, N)
    precision = "tf32" if tf32 and x.dtype == torch.float32 else "ieee"
    # UPCAST: Triton 3.8's interpreter multiplies bfloat16 tiles in tl.dot as their uint16 bit patterns (numpy has no
    # bf16), so under the interpreter the bf16 tiles go to fp32 first; on the GPU tl.dot takes them as they are. (The
    # interpreter also ignores "tf32": it multiplies in fp32, so the TF32 rounding is only checked on the GPU.)
    # K_STATIC: Triton 3.6's interpreter cannot range() over a runtime scalar (it holds one as a 1-element array, and
    # its int() of that is an error from NumPy 2.4 on; 3.8 squeezes it first), so the interpreter loops to K passed as
    # a constexpr; the interpreter compiles nothing, so that costs nothing. Not a while loop: on the GPU Triton
    # pipelines (num_stages) only for loops.

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    linear_kernel[grid](x2, weight, bias if bias is not None else out, y2, m, n, k,
                        x2.stride(0), weight.stride(0), y2.stride(0),
                        HAS_BIAS=bias is not None, PRECISION=precision,
                        UPCAST=interpreting() and x.dtype == torch.bfloat16, K_STATIC=k if interpreting() else None)
    return out
