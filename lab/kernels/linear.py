"""nn.Linear's forward, y = x·Wᵀ + b: an SGEMM ladder from the naive loop to Hopper's wgmma, and a batch-1 GEMV.

Sources: cuda_src/linear/ (one unit per version, or per versions sharing a kernel template: v1.cu .. v7.cu, v8_v9.cu,
v10.cu, v11.cu, gemv_v1.cu, fill.cu; linear.cuh holds the ladder's header comment and the shared helpers),
cpp_src/linear/linear.cpp (binding, named checks), cpp_src/linear/cpu.cpp (the C++ CPU version).
`linear(x, weight, bias, version=...)` and `gemv(...)` take nn.Linear's weight, (out_features, in_features), as
stored; x may have any number of leading dims.

Three ops:
  linear  the GEMM ladder on square problems up to 4096³. Versions: 'cpu' (C++), 'v1'..'v9' (SIMT, float32),
          'v10' (mma.sync tensor cores) and 'v11' (Hopper wgmma), each on float32 tensors (multiplying in TF32) or
          bfloat16 tensors: precision is a dimension of a version, picked by the inputs' dtype.
  gemv    the same layer at a few rows, memory-bound: 'v1' (one warp per weight row, float32), beside F.linear.
  fc_out  the seq2seq decoder's output layer, 1280 -> 5893, at batch 1 .. 128: the tiled GEMMs where gemv gives way
          to them (gemv times the same layer at batch 1 .. 8).
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from .. import build
from ..registry import Family, Op, Version, register, version_number
from . import _triton
from ._common import elem_size, randn
from ._common import matmul_tf32, strict_fp32

if _triton.MISSING is None:   # optional: without triton the `triton` versions are listed on no device, with why
    from ._triton import linear as triton_linear

FAMILY = "linear"
FC_OUT = {"K": 1280, "N": 5893}  # the decoder's fc_out: hidden 1280 -> vocabulary 5893

# version -> what it adds over the one before (the header comment of cuda_src/linear/linear.cuh says why)
IDEAS = {
    "v1": "naive: one thread per output, K-loop from global memory",
    "v2": "coalesced: one warp per output, lanes stride K (128-B loads), shuffle reduction",
    "v3": "32x32 shared-memory tiles: each loaded element reused 32 times",
    "v4": "1D register blocking: 64x64 tile, 8 outputs per thread",
    "v5": "2D register blocking: 128x128 tile, 8x8 outputs per thread",
    "v6": "vectorised: 16-B global loads along K, 16-B shared loads",
    "v7": "warp tiling: 8x4 lanes over a 64x32 warp tile, conflict-free LDS.128",
    "v8": "async copies: cp.async into a 4-stage shared-memory ring, no register staging",
    "v9": "bigger thread tile: 8x16 outputs per thread, 6 LDS.128 per 128 FMAs",
    "v10": "tensor cores: mma.sync (TF32 m16n8k8 / bf16 m16n8k16), ldmatrix, 4-stage cp.async",
    "v11": "Hopper wgmma (TF32 64x256x8 / bf16 64x256x16) from TMA-filled swizzled smem, warp-specialised",
    "v12": "v8 with K split over a thread-block cluster, partial tiles summed through distributed shared memory",
}
GEMV_IDEAS = {"v1": "GEMV for small M: one warp per weight row, all its loads in flight, one wave"}
BEST_SIMT = "v8"  # the fastest fp32 SIMT version at 4096^3 on the H100 (see the notebook)


def ext():
    """The compiled module (built on first use; rebuilt whenever a source changed)."""
    return build.load(FAMILY)


# up to this many rows of float32 x the default is the gemv op's v1 (see fastest): at fc_out's size on the H100 it was
# ahead of cuBLAS and of v12 at 8 rows (results/, linear.gemv and linear.fc_out)
GEMV_ROWS = 8


@functools.lru_cache(maxsize=None)
def _sm_info(index: int) -> tuple[int, int]:
    p = torch.cuda.get_device_properties(index)
    return p.multi_processor_count, p.major


def fastest(x: torch.Tensor, out_features: int | None = None) -> tuple[str, str]:
    """(op, version): the fastest code for this input at its precision: the GEMV (op gemv) for a few float32 rows;
    where v8's 128x128 output tiles are fewer than the GPU's SMs (the decoder's fc_out at batch <= 128) v12, which
    splits K over a cluster (Hopper); else the best tiled kernel of the ladder (strict fp32 stays SIMT, TF32 is opt-in
    by version)."""
    if not x.is_cuda:
        return "linear", "cpu"
    if x.dtype == torch.bfloat16:
        return "linear", "v11" if torch.cuda.get_device_capability(x.device)[0] == 9 else "v10"
    m = math.prod(x.shape[:-1])
    if m <= GEMV_ROWS:
        return "gemv", "v1"
    if out_features is not None:
        sms, major = _sm_info(x.device.index if x.device.index is not None else torch.cuda.current_device())
        if major >= 9 and -(-m // 128) * -(-out_features // 128) < sms:
            return "linear", "v12"
    return "linear", BEST_SIMT


# ---- wrappers ---------------------------------------------------------------------------------------------------
def _out(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    lead = tuple(x.shape[:-1]) if x.dim() >= 1 else ()
    n = weight.shape[0] if weight.dim() == 2 else 0
    return torch.empty(*lead, n, dtype=x.dtype, device=x.device)   # (..., out_features)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
           version: str | None = None) -> torch.Tensor:
    """y = x @ weight.T + bias. x: (..., in_features), weight: (out_features, in_features), bias: (out_features,).

    version: a rung of the GEMM ladder ('cpu', 'v1'..'v11'); None: the fastest for the input (`fastest`), which
    for a few float32 rows is the gemv op's kernel."""
    out = _out(x, weight) if out is None else out
    if version is None:
        op, version = fastest(x, weight.shape[0] if weight.dim() == 2 else None)
        if op == "gemv":
            return ext().gemv(x, weight, bias, out, version_number(version))
    return ext().linear(x, weight, bias, out, version_number(version))


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
         version: str | None = None) -> torch.Tensor:
    """The gemv op: y = x @ weight.T + bias for a few rows of x (any number works; it is made for M <= 4).
    version: 'v1' (CUDA, float32; the default on CUDA) or 'cpu' (the C++ code linear's op runs too)."""
    out = _out(x, weight) if out is None else out
    return ext().gemv(x, weight, bias, out, version_number(version or ("v1" if x.is_cuda else "cpu")))


# ---- reference and baselines ------------------------------------------------------------------------------------
def linear_ref(x, weight, bias=None):
    return F.linear(x, weight, bias)


def linear_torch(x, weight, bias=None):
    with strict_fp32():
        return F.linear(x, weight, bias)


def linear_torch_tf32(x, weight, bias=None):
    with matmul_tf32(True):
        return F.linear(x, weight, bias)


def linear_triton(x, weight, bias=None, out=None):
    return triton_linear.linear(x, weight, bias, out=out)


def linear_triton_tf32(x, weight, bias=None, out=None):
    return triton_linear.linear(x, weight, bias, out=out, tf32=True)


# ---- ops --------------------------------------------------------------------------------------------------------
F32, F32_BF16 = (torch.float32,), (torch.float32, torch.bfloat16)
PRECISION = {"v10": "tf32", "v11": "tf32"}   # on float32 tensors (Version.precision_at); bf16 on bfloat16 ones
DTYPES = {"v10": F32_BF16, "v11": F32_BF16}
CPU_IDEA = "C++: 2x4 micro-tiles, lane-wise partial sums, 64x64 tiles in parallel"


def _version(name: str, graph: bool = False) -> Version:
    fn = lambda *a, out=None: linear(*a, out=out, version=name)  # noqa: E731
    if name == "cpu":
        return Version("cpu", fn, "cpu", CPU_IDEA, dtypes=F32)
    return Version(name, fn, "cuda", IDEAS[name], precision=PRECISION.get(name), dtypes=DTYPES.get(name, F32),
                   graph=graph)


def _gemv_version(name: str) -> Version:
    fn = lambda *a, out=None: gemv(*a, out=out, version=name)  # noqa: E731
    if name == "cpu":
        return Version("cpu", fn, "cpu", CPU_IDEA + " (the linear op's C++ code)", dtypes=F32)
    return Version(name, fn, "cuda", GEMV_IDEAS[name], dtypes=F32, graph=True)


def _baselines(graph: bool = False) -> list[Version]:
    """graph: also time torch replayed from a CUDA graph (the decoder-size ops, where a launch is a fair part)."""
    return [Version("torch", linear_torch, "any", "F.linear: cuBLAS (TF32 off) / CPU BLAS", baseline=True,
                    takes_out=False, check=False, graph=graph),
            Version("torch.tf32", linear_torch_tf32, "cuda", "F.linear with TF32 on (cuBLAS TF32)", baseline=True,
                    takes_out=False, check=False, precision="tf32", dtypes=F32)]


def _triton_versions() -> list[Version]:
    """Triton's tiled GEMM (lab/kernels/_triton/linear.py), named like the torch baselines: `triton` computes in the
    dtype (strict FP32 on float32, beside v1..v9; bf16 on bfloat16, beside v10/v11), `triton.tf32` in TF32."""
    idea = "Triton: autotuned tiled GEMM, bias fused, tl.dot"
    return [_triton.version(linear_triton, f"{idea} (strict FP32 / bf16)", dtypes=F32_BF16),
            _triton.version(linear_triton_tf32, f"{idea} in TF32", name="triton.tf32", precision="tf32",
                            dtypes=F32)]


def _inputs(s: dict, dt: torch.dtype, dev, g: torch.Generator) -> tuple:
    # x: (M, K); weight: (N, K) as nn.Linear stores it, scaled by K^-1/2 like its init so y and bias are both O(1)
    # (a dropped bias must show in the error); bias: (N,), or None where the shape says bias=0.
    x = randn((s["M"], s["K"]), dt, dev, g)
    w = randn((s["N"], s["K"]), dt, dev, g, scale=max(s["K"], 1) ** -0.5)
    b = randn((s["N"],), dt, dev, g) if s.get("bias", 1) else None
    return x, w, b


def _nbytes(s: dict, dt: torch.dtype) -> float:
    return (s["M"] * s["K"] + s["N"] * s["K"] + s["M"] * s["N"] + s["N"] * s.get("bias", 1)) * elem_size(dt)


def _flops(s: dict, dt: torch.dtype) -> float:
    return 2 * s["M"] * s["N"] * s["K"]


def _shape(m: int, n: int, k: int, bias: int = 1) -> dict:
    return {"M": m, "N": n, "K": k, "bias": bias}


# Small and awkward: 1, primes, non-multiples of every tile (32, 64, 128, 256), K not a multiple of 4 or 8 (scalar and
# mma.sync fallbacks) and K a multiple of 8 (16-B loads, cp.async, TMA), no bias. Small enough for compute-sanitizer's
# racecheck, which instruments every shared-memory access (`python -m lab check` runs these under it).
CHECK = [_shape(*s) for s in [
    (1, 1, 1), (1, 7, 5), (2, 3, 8, 0), (3, 5, 7), (33, 65, 17), (100, 51, 77, 0), (128, 128, 128),
    (127, 129, 132), (257, 131, 72), (64, 300, 3), (131, 257, 40, 0)]]
# Larger odd sizes, checked by the tests: the 1000x777x513 (M x K x N), a long K without bias, and a shape with
# more 128x256 tiles than an H100 has SMs (1100x3900: 144), so the wgmma kernels' 256-wide tile is checked too.
CHECK_LARGE = [_shape(*s) for s in [(1000, 513, 777), (300, 520, 1024, 0), (1100, 3900, 40)]]
FC_CHECK = [_shape(*s) for s in [(1, 5893, 1280), (1, 37, 1283, 0), (3, 300, 64), (5, 129, 1281), (1, 1, 4)]]

LADDER = [f"v{i}" for i in range(1, 13)]
GEMV_ROWS_TIMED = (1, 2, 4, 8)  # the gemv op's batch sweep at fc_out's size (it is the default up to GEMV_ROWS)
OPS = [
    Op(FAMILY, "linear", _inputs, linear_ref,
       # v8, v9 (the SIMT goal's rungs) and torch also replayed from a CUDA graph, so that goal's ratio is in both
       # modes (at 4096^3 a call is milliseconds and the modes should agree; at 256^3 the launch is a fair part)
       [_version("cpu")] + [_version(v, graph=v in ("v8", "v9")) for v in LADDER] + _baselines(graph=True)
       + _triton_versions(),
       CHECK, [_shape(n, n, n) for n in (256, 512, 1024, 2048, 4096)],
       [_shape(n, n, n) for n in (64, 128, 256, 512)], (torch.float32, torch.bfloat16),
       nbytes=_nbytes, flops=_flops,
       formula="TFLOP/s = 2·M·N·K / time; bytes = (MK + NK + MN + N)·sizeof(dtype); y = x·Wᵀ + b, M = N = K",
       size_key="M", compute_ceiling="gemm", doc="the SGEMM ladder on square problems, bias fused"),
    Op(FAMILY, "gemv", _inputs, linear_ref, [_gemv_version("cpu"), _gemv_version("v1"), _baselines(graph=True)[0]],
       FC_CHECK, [_shape(m, FC_OUT["N"], FC_OUT["K"]) for m in GEMV_ROWS_TIMED],
       [_shape(m, FC_OUT["N"], FC_OUT["K"]) for m in (1, 4)], (torch.float32,),
       nbytes=_nbytes, flops=_flops,
       formula="GB/s = (MK + NK + MN + N)·4 B / time (at M = 1 the weight is 99.9% of it); TFLOP/s = 2·M·N·K / time",
       size_key="M", compute_ceiling=None,
       doc="GEMV: the decoder's output layer 1280 -> 5893 at batch 1 .. 8, memory-bound (against F.linear)"),
    Op(FAMILY, "fc_out", _inputs, linear_ref,
       # v12 (the split-K rung for these shapes) and torch also replayed from a graph: ~40 us calls, where a launch
       # counts
       [_version("cpu")] + [_version(v, graph=v == "v12") for v in ("v8", "v9", "v10", "v11", "v12")]
       + _baselines(graph=True) + _triton_versions(),
       FC_CHECK, [_shape(m, FC_OUT["N"], FC_OUT["K"]) for m in (1, 2, 4, 8, 16, 32, 64, 128)],
       [_shape(m, FC_OUT["N"], FC_OUT["K"]) for m in (1, 8, 32)], (torch.float32,),
       nbytes=_nbytes, flops=_flops,
       formula="GB/s = (MK + NK + MN + N)·4 B / time (at M = 1 the weight is 99.9% of it); TFLOP/s = 2·M·N·K / time",
       size_key="M", compute_ceiling="gemm",
       doc="the decoder's output layer 1280 -> 5893 at batch M: the tiled GEMMs, from where the GEMV (op gemv) "
           "gives way to them"),
]

register(Family(FAMILY, "Linear: SGEMM ladder v1..v9, tensor cores v10..v11 (TF32/bf16: mma.sync, wgmma), split-K "
                "over a cluster v12; GEMV op",
                OPS, notebook="notebooks/02_matmul_to_linear.ipynb"))


# The compiler's report per version (registers, spills, SASS counts) is a study: lab/studies/linear.py.
