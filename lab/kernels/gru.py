"""GRU forward (torch.nn.GRU, gates r, z, n): the C++ CPU version, CUDA v1 .. v5, and cuDNN as the baseline; plus
the pieces of the seq2seq decoder step that runs without torch.cat (lab/models/seq2seq.py).

Sources: cuda_src/gru/ (gru.cuh: the header with the napkin math; gates.cu, proj.cu (v3..v6's input projection
for few rows), v3.cu (v3 and v4, built per dtype and rows-per-pass variant), v5.cu (v5, built per dtype), v6.cu
(v6, built like v3.cu), rowstep.cuh (the step v3.cu and v6.cu share), persistent.cuh (what the persistent units
share), decoder.cu: kernels and launchers), cpp_src/gru/gru.cpp (the binding, named checks), cpp_src/gru/cpu.cpp
(the C++ CPU code).

    out, h_n = gru(x, h0, params, version="v3")
    # x: (seq_len, batch, input_size); h0: (num_layers, batch, hidden) or None (zeros);
    # params: 4 tensors per layer in nn.GRU's order (w_ih, w_hh, b_ih, b_hh), e.g. nn.GRU(...)._flat_weights

Versions: 'cpu' (C++, at::parallel_for), 'v1' (per-step GEMMs + fused gates), 'v2' (input projection of all steps
as one GEMM up front), 'v3' (persistent: W_hh in registers across all steps, one grid barrier per step), 'v4' (v3
with four batch rows per pass: more independent FMAs and fewer shuffles a step), 'v5' (v3's loop with h W_hh^T on
tensor cores: mma.sync in fp16/bf16, and in TF32 on float32 tensors: that is the `tf32` precision, compared with
cuDNN with TF32), 'v6' (v3's step, the layers of a stack as a wavefront in
one launch: layer l at step t while the layer below is further on). dtypes: float32, float16, bfloat16 everywhere
(fp32 accumulation, fp32 gates); float64 on 'cpu', 'v1', 'v2'.
Baselines: nn.GRU itself (cuDNN on the GPU) at strict fp32 (torch.backends.cudnn.allow_tf32 = False, the same
precision as the kernels), and, for reference, cuDNN with TF32 (PyTorch's default for fp32 RNNs).
"""
from __future__ import annotations

import contextlib
import math

import torch

from .. import build
from ..registry import Family, Op, Version, register, version_number
from ._common import elem_size, randn, uniform

FAMILY = "gru"
DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
V3_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def ext():
    """The compiled module (built on first use; rebuilt whenever a source changed)."""
    return build.load(FAMILY)


# The default CUDA version by dtype and batch, from the H100's measurements (results/ and notebook 03 hold them):
# v3 where there is little work a step (its pass over a pair of rows is the shortest); v4 from V4_MIN_BATCH (more
# independent FMAs a pass: ahead of v3 from batch 32 in every dtype); for float16/bfloat16, v5 (tensor cores) from
# V5_MIN_BATCH. float32 never defaults to v5: v5 multiplies float32 in TF32, never taken silently. A stack of two
# or more layers takes v6 where v3/v4 would run: its plan runs the layers as a wavefront where that is faster (small
# batch) and layer by layer with v3's or v4's step otherwise (the 2-layer sweep in notebook 03).
V4_MIN_BATCH = 32
V5_MIN_BATCH = 48


def default_version(dtype: torch.dtype, batch: int, cuda: bool = True, layers: int = 1) -> str:
    """The version gru() runs when none is named: 'cpu' for CPU tensors; on the GPU by dtype, batch and layers
    (above)."""
    if not cuda:
        return "cpu"
    if dtype not in V3_DTYPES:
        return "v2"
    if dtype in (torch.float16, torch.bfloat16) and batch >= V5_MIN_BATCH:
        return "v5"
    if layers >= 2:
        return "v6"
    return "v4" if batch >= V4_MIN_BATCH else "v3"


def _default(x: torch.Tensor, layers: int = 1) -> str:
    return default_version(x.dtype, x.shape[1] if x.dim() == 3 else 1, x.is_cuda, layers)


# ---- the wrapper ------------------------------------------------------------------------------------------------
def gru(x: torch.Tensor, h0: torch.Tensor | None, params, out: tuple | None = None,
        version: str | None = None, config: int = -1, grid_sync: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """nn.GRU's forward: returns (out (seq_len, batch, hidden), h_n (num_layers, batch, hidden)).

    params: 4 tensors per layer (w_ih (3H, in), w_hh (3H, H), b_ih (3H,), b_hh (3H,)), like nn.GRU._flat_weights.
    out: optional (out, h_n) tensors to write into. version: 'cpu' | 'v1' .. 'v6' (default: see _default).
    config: v5's warp grid, 0..7, v6's most layers per launch, 1..4, or v3/v4's exchange between steps, 1 (step
    counters) or 2 (tagged h words: the data is its own flag) (-1: the plan's choice; v5_plan / v6_plan say which;
    v3/v4 take the tagged words at one batch row a block; other versions ignore it); grid_sync: v3 .. v6 wait at one
    grid-wide barrier a step (their first design; v6: a wave of its roles) instead of for the blocks they read from
    (v1, v2 and the CPU ignore it).
    """
    params = list(params)
    if out is None:
        # shapes only; every argument is checked, with its name, in cpp_src/gru/gru.cpp
        L = len(params) // 4
        H = params[1].shape[1] if len(params) > 1 and params[1].dim() == 2 else 0
        T, B = (x.shape[0], x.shape[1]) if x.dim() == 3 else (0, 0)
        out = (torch.empty(T, B, H, dtype=x.dtype, device=x.device), torch.empty(L, B, H, dtype=x.dtype,
                                                                                device=x.device))
    o, hn = out
    version = version or _default(x, len(params) // 4)
    return tuple(ext().gru_forward(x, h0, params, o, hn, version_number(version), config, grid_sync))


def input_projection(x: torch.Tensor, w: torch.Tensor, zero: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) @ w (N, K)^T -> (M, N) float32 by cuda_src/gru/proj.cu: the kernel v3..v6 run for their input
    projection when T*B is small (cuBLAS above); float32/float16/bfloat16 operands, fp32 accumulation. `zero`
    (int32, CUDA) is set to 0 in the same launch, as the persistent kernels' step counters are."""
    out = torch.empty(x.shape[0] if x.dim() == 2 else 0, w.shape[0] if w.dim() == 2 else 0, dtype=torch.float32,
                      device=x.device)
    return ext().input_projection(x, w, out, zero)


def v3_plan(batch: int, hidden: int, dtype: torch.dtype = torch.float32, version: str = "v3") -> dict:
    """How v3 (or v4: the same split) divides the work on this GPU: units per block, batch slices, shared memory,
    blocks, whether all blocks fit on the chip at once (status 0), and the exchange between steps gru() runs there by
    default ('tagged' where a block owns one batch row, else 'counters'). The binding names the fields."""
    return dict(ext().v3_plan(batch, hidden, DTYPE_CODE[dtype], version_number(version)))


def v5_plan(batch: int, hidden: int, dtype: torch.dtype = torch.bfloat16, config: int = -1) -> dict:
    """How v5 divides the work on this GPU: its warp grid (config: units_per_block = 8 x warps along units,
    rows_per_chunk = 16 x warps along the batch, k_split = warps along K), the slices, shared memory, blocks, the
    plan's step-time estimate (cost_ns, used only to rank the configurations) and status (0 = fits)."""
    return dict(ext().v5_plan(batch, hidden, DTYPE_CODE[dtype], config))


def v6_plan(batch: int, hidden: int, layers: int, seq_len: int, dtype: torch.dtype = torch.float32,
            config: int = -1) -> dict:
    """How v6 runs a stack of `layers` over `seq_len` steps: layers per launch (a wavefront of 2·layers - 1 roles of
    hidden_slices × batch_slices blocks; config -1 picks it by a step-time estimate, 1..4 caps it), rows per pass
    (2 as v3, 4 as v4), shared memory, blocks, status (0 = fits)."""
    return dict(ext().v6_plan(batch, hidden, layers, seq_len, DTYPE_CODE[dtype], config))


# ---- precision --------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def precision(tf32: bool):
    """cuDNN runs fp32 RNNs in TF32 unless told not to (torch.backends.cudnn.allow_tf32, default True); cuBLAS
    follows torch.backends.cuda.matmul.allow_tf32 (default False). Pin both for a like-for-like comparison."""
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


# ---- reference and baselines ------------------------------------------------------------------------------------
def _dims(x, params):
    return len(params) // 4, params[1].shape[1], x.shape[-1]


def gru_ref(x, h0, params):
    """torch.nn.GRU with the same weights (verify runs it on float64 copies: double on the CPU and on cuDNN)."""
    L, H, I = _dims(x, params)
    m = torch.nn.GRU(I, H, L, dtype=x.dtype, device=x.device)
    with torch.no_grad():
        for name, p in zip(m._flat_weights_names, params):
            getattr(m, name).copy_(p)
        out, hn = m(x, h0)
    return out, hn


def _vf_gru(x, h0, params):
    # What nn.GRU.forward calls (torch/nn/modules/rnn.py): cuDNN on the GPU, aten's own GRU on the CPU. Calling it
    # directly times the op without the module wrapper; make_inputs keeps the weights in cuDNN's packed buffer.
    L, H, _ = _dims(x, params)
    if h0 is None:
        h0 = torch.zeros(L, x.shape[1], H, dtype=x.dtype, device=x.device)
    return tuple(torch._VF.gru(x, h0, list(params), True, L, 0.0, False, False, False))


def gru_torch(x, h0, params):
    """nn.GRU at the kernels' precision (fp32 without TF32)."""
    with precision(tf32=False):
        return _vf_gru(x, h0, params)


def gru_torch_tf32(x, h0, params):
    """nn.GRU as PyTorch runs fp32 by default on the GPU: cuDNN with TF32 matrix products."""
    with precision(tf32=True):
        return _vf_gru(x, h0, params)


# ---- inputs -----------------------------------------------------------------------------------------------------
def make_params(I: int, H: int, L: int, dtype, device, gen: torch.Generator) -> tuple:
    """Random weights as nn.GRU initialises them (uniform(-1/sqrt(H), 1/sqrt(H))), drawn from `gen`.

    On the GPU they live in the one buffer cuDNN wants (what nn.GRU.flatten_parameters makes), so the cuDNN
    baseline does not re-pack them on every call; each tensor is still a contiguous view the kernels read directly.
    """
    k = 1.0 / math.sqrt(H)
    flat = []
    for l in range(L):
        inp = I if l == 0 else H
        for shape in ((3 * H, inp), (3 * H, H), (3 * H,), (3 * H,)):
            flat.append(uniform(shape, -k, k, dtype, "cpu", gen))
    if torch.device(device).type != "cuda":
        return tuple(flat)
    m = torch.nn.GRU(I, H, L, dtype=dtype, device=device)  # its constructor packs the weights (flatten_parameters)
    with torch.no_grad():
        for name, p in zip(m._flat_weights_names, flat):
            getattr(m, name).copy_(p)
    return tuple(w.detach() for w in m._flat_weights)


def make_inputs(shape: dict, dtype, device, gen: torch.Generator):
    T, B, I, H, L = shape["seq"], shape["batch"], shape["input"], shape["hidden"], shape["layers"]
    x = randn((T, B, I), dtype, device, gen)                                   # x: (seq_len, batch, input_size)
    h0 = randn((L, B, H), dtype, device, gen, scale=0.5) if shape["h0"] else None  # h0: (layers, batch, hidden)
    return x, h0, make_params(I, H, L, dtype, device, gen)


def _flops(s, dt):
    H, L = s["hidden"], s["layers"]
    return sum(2 * s["seq"] * s["batch"] * 3 * H * ((s["input"] if l == 0 else H) + H) for l in range(L))


def _nbytes(s, dt):
    T, B, I, H, L = s["seq"], s["batch"], s["input"], s["hidden"], s["layers"]
    weights = sum(3 * H * ((I if l == 0 else H) + H) + 6 * H for l in range(L))
    return elem_size(dt) * (T * B * I + T * B * H + L * B * H * (2 if s["h0"] else 1) + weights)


def _shape(seq, batch, inp, hidden, layers=1, h0=0):
    return {"seq": seq, "batch": batch, "input": inp, "hidden": hidden, "layers": layers, "h0": h0}


CHECK_SHAPES = [
    _shape(1, 1, 1, 1),                   # everything 1
    _shape(1, 3, 77, 200, 1, 1),          # a decoder step: seq_len 1, odd sizes, h0
    _shape(7, 3, 77, 200, 2, 1),          # two layers, odd sizes
    _shape(5, 1, 16, 33, 1, 0),           # hidden not a multiple of anything
    _shape(4, 5, 64, 64, 3, 0),           # three layers, no h0
    _shape(6, 20, 256, 512, 1, 1),        # the model's hidden size; v3 splits the batch over blocks
    _shape(3, 130, 31, 96, 1, 1),         # batch > 128, many batch slices
    _shape(2, 64, 8, 1024, 1, 1),         # v3's largest hidden: 32 lanes per unit, batch in shared-memory chunks
    _shape(2, 3, 5, 1000, 1, 1),          # hidden 1000: large and a multiple of neither 32 nor 64
    _shape(2, 256, 24, 200, 1, 0),        # batch 256: the largest bench batch, no h0
]
BENCH_SHAPES = [_shape(30, b, 256, 512) for b in (1, 8, 32, 64, 128, 256)]   # the seq2seq encoder, T = 30
CPU_BENCH_SHAPES = [_shape(30, b, 256, 512) for b in (1, 8)]
ALL = (torch.float32, torch.bfloat16, torch.float16)


def _kernel(name: str):
    return lambda x, h0, params, out=None: gru(x, h0, params, out=out, version=name)


VERSIONS = [
    Version("cpu", _kernel("cpu"), "cpu", "C++: input projection up front, then per step parallel over hidden units "
                                          "(at::parallel_for)"),
    Version("v1", _kernel("v1"), "cuda", "per step: 2 cuBLAS GEMMs + 1 fused gate kernel", graph=True, ceiling="gemm"),
    Version("v2", _kernel("v2"), "cuda", "input projection of all steps as 1 GEMM; per step 1 GEMM + gates",
            graph=True, ceiling="gemm"),
    Version("v3", _kernel("v3"), "cuda", "persistent: W_hh in registers, 1 grid barrier per step, 1 launch",
            dtypes=V3_DTYPES, graph=True),
    Version("v4", _kernel("v4"), "cuda", "v3 + 4 batch rows per pass (12 FMA chains)",
            dtypes=V3_DTYPES, graph=True),
    Version("v5", _kernel("v5"), "cuda", "v3's persistent loop, h W_hh^T on tensor cores (mma.sync; W_hh slice "
                                         "in shared memory): fp16/bf16, TF32 on float32",
            dtypes=V3_DTYPES, graph=True, precision="tf32", ceiling="gemm"),
    Version("v6", _kernel("v6"), "cuda", "v3's step, the layers of a stack as a wavefront in one launch (layer l at "
                                         "step t while the layer below runs ahead)",
            dtypes=V3_DTYPES, graph=True),
    Version("torch", gru_torch, "any", "nn.GRU (cuDNN on the GPU), fp32 without TF32", baseline=True,
            takes_out=False, check=False, graph=True, ceiling="gemm"),
    Version("torch.tf32", gru_torch_tf32, "cuda", "nn.GRU on cuDNN with TF32 (PyTorch's fp32 default)",
            baseline=True, takes_out=False, check=False, graph=True, precision="tf32", dtypes=(torch.float32,),
            ceiling="gemm"),
]

# The stack: the encoder with two layers (issue 14's wavefront goal is against cuDNN's 2-layer GRU at batch <= 64),
# and awkward stacks for the checks: 2-4 layers, one launch for all of them (small hidden), a stack split into
# launches (hidden 512, 3 layers: 5 roles of 32 blocks do not fit 132 SMs), hidden 1024 (no wavefront fits), batch
# slices (130), shared-memory chunks (256 rows of 512 in one slice), seq 1, with and without h0.
STACK_CHECK_SHAPES = [
    _shape(5, 3, 77, 200, 2, 1), _shape(4, 5, 64, 64, 3, 0), _shape(3, 1, 16, 33, 4, 1), _shape(6, 20, 256, 512, 3, 1),
    _shape(2, 130, 31, 96, 2, 1), _shape(1, 7, 9, 1024, 2, 0), _shape(2, 256, 16, 512, 2, 0),
]
STACK_BENCH_SHAPES = [_shape(30, b, 256, 512, 2) for b in (1, 8, 32, 64, 128)]
FORMULA = "TFLOP/s = 2·T·B·3H·(I+H)·layers / time; bytes = (x + out + h0 + h_n + weights)·sizeof(dtype)"

OPS = [
    Op(FAMILY, "gru", make_inputs, gru_ref, VERSIONS,
       CHECK_SHAPES, BENCH_SHAPES, CPU_BENCH_SHAPES, ALL,
       nbytes=_nbytes, flops=_flops,
       formula=FORMULA,
       compute_ceiling="fma",   # v3/v4's recurrence is FP32 FMAs (fp32 accumulation for every dtype); v1/v2 and
                                # cuDNN run GEMMs (tensor cores at bf16/fp16): held to cuBLAS at their precision
       size_key="batch",
       doc="nn.GRU forward over a sequence; the seq2seq encoder is seq 30, input 256, hidden 512"),
    Op(FAMILY, "gru_stack", make_inputs, gru_ref, VERSIONS,
       STACK_CHECK_SHAPES, STACK_BENCH_SHAPES, [_shape(30, 1, 256, 512, 2)], ALL,
       nbytes=_nbytes, flops=_flops, formula=FORMULA, compute_ceiling="fma", size_key="batch",
       doc="a 2-layer nn.GRU (the encoder with two layers): v6's wavefront against cuDNN's 2-layer GRU"),
]


# The seq2seq benchmarks (decoder_step, greedy_decode) are extras of this family; lab/studies/seq2seq.py attaches them.
register(Family(FAMILY, "GRU: nn.GRU forward (C++ CPU, per-step, hoisted, persistent) and the seq2seq model", OPS,
                notebook="notebooks/03_gru.ipynb"))
