"""The Kronecker-factored linear layer: y = x · (W_K ⊗ … ⊗ W_1), one factor at a time, forward and backward.

factors = [W_1, …, W_K], W_k of shape (f_k, f_k); x of shape (batch, N) with N = f_1·…·f_K. Read one sample of x as
the (f_K, …, f_1) array (row-major: f_1 is the fastest axis); then

    y[j_K … j_1] = Σ_{i_K … i_1} x[i_K … i_1] · W_K[i_K, j_K] ⋯ W_1[i_1, j_1],

which is `x @ torch.kron(W_K, torch.kron(…, W_1))` (the tests check exactly that) without the N×N matrix: each factor
multiplies along its own axis, N·f_k FMAs per sample instead of N².

Sources: cuda_src/kron/ (kron.cuh: the algebra of the steps and what the units share; v1.cu, v2.cu (the fused
kernel), v2_plan.cu (its planner and launch), backward.cu), cpp_src/kron/ (kron.cpp: bindings and checks; cpu.cpp: the
C++ CPU version). Versions (ours):
  cpu         C++ with at::parallel_for (the same steps as the CUDA code)
  v1          CUDA: one tiled kernel per factor; backward: per-factor R-step and split-K dW kernels
  v2          CUDA: one fused kernel for all factors, each sample's state in shared memory (v1 where it does not fit)
  v3          CUDA: v2's fusion on tensor cores (mma.sync): TF32 on float32 tensors, bf16 on bfloat16 ones (where no
              configuration fits: v2, on float32 copies for bfloat16)
  v4          CUDA: two factors (multiples of 64) on wgmma, operands staged K-major in the 128-byte swizzle; v3
              elsewhere
  v5          CUDA: v4's two wgmma steps fed by TMA, a ring of x in flight, y out by TMA store (bfloat16: x and the
              factors MN-major as they lie in memory; float32: TF32 with x through registers, W_2 staged once and
              W_1 held in registers); v3 elsewhere
  v6          CUDA: v2 for two factors in strict fp32, every operand of a block (x[b], W_2's slice, W_1) in flight
              from its start instead of a 2-stage pipeline; v2 elsewhere (float64 included); backward
              (backward_v6.cu): one kernel for both factors' dx, dW_1 and dW_2 shares at small batch (multiples of
              32), then a reduce; v2's elsewhere
  backward of v3-v5: backward_tc.cu, at their precision: the states recomputed (their forwards save none), then
              per factor an R-step and a split-K dW GEMM on mma.sync, one reduce launch
Baselines (PyTorch, named for what they run):
  torch       what one writes first: per factor reshape / matmul / movedim (every reshape of the moved view copies)
  torch.bmm   one strided-batched GEMM (torch.bmm) per factor, the axis move folded into the operand layout (no
              copies); the baseline speedups are measured against (strict fp32 on float32, bf16 on bfloat16)
  torch.bmm.tf32  the same with TF32 on: v3's baseline on float32 tensors
  torch.kron  builds the N×N matrix with torch.kron, then x @ M (what the factorisation avoids)

`kron(x, factors, version)` is differentiable (a C++ autograd Function for the compiled versions, KronAutograd in
cpp_src/kron/kron.cpp; PyTorch autograd for the baselines); the tensor-core versions' gradients are computed at their
precision (TF32 / bf16).
"""
from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path
from typing import Sequence

import torch

from .. import build, env, verify
from ..registry import Family, Op, Version, register, version_number
from ..timing import time_cuda
from ._common import elem_size, matmul_tf32, randn, strict_fp32

FAMILY = "kron"
MAX_FACTORS = 16  # as in cuda_src/kron/kron.cuh
KERNELS = ("cpu", "v1", "v2", "v3", "v4", "v5", "v6")
TORCH_VERSIONS = ("torch", "torch.bmm", "torch.bmm.tf32", "torch.kron")  # baselines
TENSOR_CORE = ("v3", "v4", "v5")  # TF32 on float32 tensors, bf16 on bfloat16 ones; backward: backward_tc.cu


def ext():
    """The compiled module (built on first use; rebuilt whenever a source changed)."""
    return build.load(FAMILY)


# ---- inputs -------------------------------------------------------------------------------------------------------
def parse_factors(spec: str | Sequence[int]) -> tuple[int, ...]:
    """'128x128' or [128, 128] -> (128, 128): the factor sizes f_1, …, f_K."""
    if isinstance(spec, str):
        try:
            sizes = tuple(int(s) for s in spec.lower().split("x"))
        except ValueError:
            raise ValueError(f"factor sizes must look like '128x128' or '8x16x32', got {spec!r}") from None
    else:
        sizes = tuple(int(s) for s in spec)
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"factor sizes must be one or more positive integers, got {spec!r}")
    return sizes


def factors_label(sizes: Sequence[int]) -> str:
    return "x".join(str(s) for s in sizes)


_TNAME = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
          torch.int32: "Int", torch.int64: "Long"}


def _tname(dt: torch.dtype) -> str:
    return _TNAME.get(dt, str(dt).replace("torch.", ""))


def _shape(t: torch.Tensor) -> str:
    s = tuple(t.shape)
    return "(" + ", ".join(map(str, s)) + ("," if len(s) == 1 else "") + ")"


def check_inputs(x: torch.Tensor, factors: Sequence[torch.Tensor]) -> tuple[int, ...]:
    """Validate x (batch, N) and the factors; the same errors (and messages) as the C++ boundary, for every version.

    Returns the factor sizes. dtype problems raise TypeError, shapes and devices ValueError.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a tensor, got {type(x).__name__}")
    if isinstance(factors, torch.Tensor):
        raise TypeError("factors must be a list of square matrices [W_1, …, W_K], got a single tensor")
    factors = list(factors)
    if x.dtype not in (torch.float32, torch.float64, torch.bfloat16):
        raise TypeError(f"x must be Float, Double or BFloat16 (versions v3, v4, v5 only), got {_tname(x.dtype)}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (batch, N), got {x.dim()}-D tensor of shape {_shape(x)}")
    if not factors:
        raise ValueError("factors must be a non-empty list of square matrices, got an empty list")
    if len(factors) > MAX_FACTORS:
        raise ValueError(f"at most {MAX_FACTORS} factors are supported, got {len(factors)}")
    for i, w in enumerate(factors):
        name = f"factors[{i}]"
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(w).__name__}")
        if w.dtype != x.dtype:
            raise TypeError(f"{name} must have the same dtype as x ({_tname(x.dtype)}), got {_tname(w.dtype)}")
        if w.device != x.device:
            raise ValueError(f"{name} must be on the same device as x ({x.device}), got {w.device}")
        if w.dim() != 2:
            raise ValueError(f"{name} must be 2-D (f, f), got {w.dim()}-D tensor of shape {_shape(w)}")
        if w.shape[0] != w.shape[1]:
            raise ValueError(f"{name} must be square (f, f), got {_shape(w)}")
        if w.shape[0] < 1:
            raise ValueError(f"{name} must not be empty, got {_shape(w)}")
    sizes = tuple(int(w.shape[0]) for w in factors)
    if math.prod(sizes) != x.shape[1]:
        raise ValueError(f"the factor sizes {' x '.join(map(str, sizes))} multiply to {math.prod(sizes)}, but x has "
                         f"N = {x.shape[1]} columns; x must be (batch, f_1·…·f_K)")
    return sizes


# ---- the reference (plain PyTorch; verify runs it in float64) -----------------------------------------------------
def kron_ref(x: torch.Tensor, *factors: torch.Tensor) -> torch.Tensor:
    """y = x · (W_K ⊗ … ⊗ W_1), factor by factor with tensordot, each new axis put back where its old one was.

    An independent formulation (no axis cycling): the tests hold it to x @ torch.kron(...) in float64.
    """
    B, K = x.shape[0], len(factors)
    sizes = [w.shape[0] for w in factors]
    t = x.reshape(B, *reversed(sizes))  # axes: (b, i_K, …, i_1); W_k's axis sits at position K - k + 1
    for k, w in enumerate(factors):     # k = 0 is W_1, at axis K
        t = torch.tensordot(t, w, dims=([K - k], [0])).movedim(-1, K - k)
    return t.reshape(B, math.prod(sizes))


def kron_full_matrix(factors: Sequence[torch.Tensor]) -> torch.Tensor:
    """M = W_K ⊗ … ⊗ W_1, (N, N). Only for small N: 4·N² bytes (N = 16384: 1 GiB)."""
    return functools.reduce(torch.kron, list(factors)[::-1])


# ---- the baselines: PyTorch -----------------------------------------------------------------------------------------
def kron_torch(x: torch.Tensor, factors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Naive: per factor, multiply the last axis, then move the new axis to the front (W_1 first).

    (b, …, i_k) @ W_k -> (b, …, j_k) -> movedim -> (b, j_k, …); the next reshape copies the moved view.
    """
    B, N = x.shape
    with strict_fp32():
        for w in factors:
            f = w.shape[0]
            x = torch.matmul(x.reshape(B, N // f, f), w)  # (B, N/f, f): contract the fastest axis
            x = torch.movedim(x, -1, 1)                     # (B, f, N/f): the new axis goes first (a view)
        return x.reshape(B, N)


def kron_bmm(x: torch.Tensor, factors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One strided-batched GEMM per factor, W_K first: y_b (P, f) = x_b (f, P)ᵀ · W, written row-major.

    x_b's transpose is a view cuBLAS reads as a transposed operand, W is broadcast with batch stride 0, and the GEMM's
    row-major output is already the next factor's input: no copies between the K GEMMs (the order of
    cuda_src/kron/v1.cu).
    """
    B, N = x.shape
    with strict_fp32():
        for w in reversed(factors):
            f = w.shape[0]
            xt = x.view(B, f, N // f).transpose(1, 2)      # (B, P, f), a view
            x = torch.bmm(xt, w.expand(B, f, f))           # (B, P, f), contiguous
        return x.reshape(B, N)


def kron_bmm_tf32(x: torch.Tensor, factors: Sequence[torch.Tensor]) -> torch.Tensor:
    """kron_bmm with TF32 on: cuBLAS-factorwise at v3's precision on float32 tensors."""
    with matmul_tf32(True):
        B, N = x.shape
        for w in reversed(factors):
            f = w.shape[0]
            x = torch.bmm(x.view(B, f, N // f).transpose(1, 2), w.expand(B, f, f))
        return x.reshape(B, N)


def kron_full(x: torch.Tensor, factors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The baseline the factorisation avoids: build M = W_K ⊗ … ⊗ W_1 (N×N) and multiply."""
    with strict_fp32():
        return x @ kron_full_matrix(factors)


PYTORCH = {"torch": kron_torch, "torch.bmm": kron_bmm, "torch.bmm.tf32": kron_bmm_tf32, "torch.kron": kron_full}


# ---- cpu, v1, v2: the compiled code ---------------------------------------------------------------------------------
def _backward_default(x: torch.Tensor) -> str:
    # the backward of v1, v2 (and v6 where its own, backward_v6.cu, does not apply) is one set of kernels
    # (backward.cu), that of v3-v5 another (backward_tc.cu)
    if not x.is_cuda:
        return "cpu"
    return "v5" if x.dtype == torch.bfloat16 else "v2"


# ---- the default version: the fastest, from a tuning table kron.tune_default writes ---------------------------------
# The table lives beside the build cache (env.cache_dir() / kron_tune.json), keyed by the GPU's name and the hash of
# the family's CUDA build (every source, header and flag: an edit makes the old entries invisible), then by dtype and
# factor sizes, then by batch. A batch not in the table takes the entry of the nearest tuned batch (log scale). The
# candidates keep the dtype's precision: float32 chooses among v1/v2/v6 and float64 among v1/v2 (strict fp32/fp64: the
# default never switches a float32 call to TF32), bfloat16 among v3/v4/v5. Without an entry: v2, and v3 for bfloat16.
DEFAULT_CANDIDATES = {torch.float32: ("v1", "v2", "v6"), torch.float64: ("v1", "v2"),
                      torch.bfloat16: ("v3", "v4", "v5")}
STATIC_DEFAULT = {torch.bfloat16: "v3"}  # else v2
TUNE_FILE = "kron_tune.json"
_table_cache: dict[Path, tuple[float, dict]] = {}


def tune_path() -> Path:
    return env.cache_dir() / TUNE_FILE


@functools.lru_cache(maxsize=None)
def _build_key() -> str:
    """The hash of the CUDA build's sources, headers and flags (computed once per process)."""
    return build.spec(FAMILY, "cuda").key


def table_key(device) -> str:
    return f"{torch.cuda.get_device_name(torch.device(device))} | {_build_key()}"


def _case(dtype: torch.dtype, sizes: Sequence[int]) -> str:
    return f"{str(dtype).replace('torch.', '')} {factors_label(sizes)}"


def load_table() -> dict:
    """The tuning table ({} when there is none); re-read only when the file changed."""
    path = tune_path()
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return {}
    hit = _table_cache.get(path)
    if hit and hit[0] == mtime:
        return hit[1]
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    _table_cache[path] = (mtime, table)
    return table


def _save_table(table: dict) -> None:
    path = tune_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
    os.replace(tmp, path)   # atomic: a reader sees the old table or the new one


def default_version(x: torch.Tensor, factors: Sequence[torch.Tensor] | None = None) -> str:
    """The version a call without `version=` runs: "cpu" on the CPU; on CUDA the fastest tuned candidate for this
    GPU, build, dtype, factor sizes and (nearest) batch, else the static default."""
    if not x.is_cuda:
        return "cpu"
    if factors is None or x.dim() != 2:
        return STATIC_DEFAULT.get(x.dtype, "v2")
    table = load_table()
    key = table_key(x.device) if table else ""
    return lookup_default(table, key, x.dtype, [int(w.shape[0]) for w in factors], int(x.shape[0]))


def lookup_default(table: dict, key: str, dtype: torch.dtype, sizes: Sequence[int], batch: int) -> str:
    """The table's choice for (GPU and build `key`, dtype, factor sizes) at the tuned batch nearest `batch` (log scale;
    a tie goes to the smaller), else the static default."""
    entries = table.get(key, {}).get(_case(dtype, sizes))
    if not entries:
        return STATIC_DEFAULT.get(dtype, "v2")
    b = max(batch, 1)
    near = min(entries, key=lambda k: (abs(math.log(max(int(k), 1) / b)), int(k)))
    return entries[near]["version"]


def tune_default(batches: Sequence[int], sizes: Sequence[int] | str, dtype: torch.dtype = torch.float32,
                 device="cuda", budget_ms: float = 40.0) -> list[dict]:
    """Time the default's candidates (DEFAULT_CANDIDATES[dtype], each with its automatic plan) at each batch, record
    the fastest in the tuning table and return rows (batch, version, median_us, chosen)."""
    sizes = parse_factors(sizes)
    if dtype not in DEFAULT_CANDIDATES:
        raise ValueError(f"tune_default: dtype must be one of {', '.join(map(str, DEFAULT_CANDIDATES))}, got {dtype}")
    dev = torch.device(device)
    g = torch.Generator().manual_seed(0)
    rows = []
    table = dict(load_table())
    cases = table.setdefault(table_key(dev), {})
    entries = cases.setdefault(_case(dtype, sizes), {})
    for b in batches:
        x, *fs = make_forward_inputs({"batch": int(b), "factors": factors_label(sizes)}, dtype, dev, g)
        out = torch.empty_like(x)
        times = {}
        for v in DEFAULT_CANDIDATES[dtype]:
            with build.frozen():
                times[v] = time_cuda(lambda v=v: ext().forward(x, fs, out, [], version_number(v), -1, 0),
                                     budget_ms=budget_ms).median_us
        best = min(times, key=times.get)
        entries[str(int(b))] = {"version": best, "median_us": {v: round(t, 3) for v, t in times.items()}}
        rows += [{"batch": int(b), "version": v, "median_us": t, "chosen": v == best} for v, t in times.items()]
    _save_table(table)
    return rows


def forward(x: torch.Tensor, factors: Sequence[torch.Tensor], out: torch.Tensor | None = None,
            version: str | None = None, states: Sequence[torch.Tensor] | None = None, cfg: int = -1,
            cols: int = 0) -> torch.Tensor:
    """y = x · (W_K ⊗ … ⊗ W_1) into `out` with the compiled code, no autograd. x: (batch, N).

    states: None, or K-1 tensors (batch, N) that receive the intermediate states F_1 … F_{K-1} (for `backward`;
    not v3-v5). cfg, cols: force the CUDA block configuration (v1/v2: 0..2, v3: 0..1, v5: 0 split, 1 ping-pong, 2 split
    with W_1 in registers, TF32 only; v6: 0 4x4 outputs a thread, 1 and 2 8x4 with k split in two or four) and the
    fused kernels' slice width (kron.tune); -1 / 0 = automatic.
    """
    check_inputs(x, factors)
    out = torch.empty_like(x) if out is None else out
    version = version or default_version(x, factors)
    return ext().forward(x, list(factors), out, list(states or []), version_number(version), cfg, cols)


def backward(g: torch.Tensor, x: torch.Tensor, factors: Sequence[torch.Tensor], states: Sequence[torch.Tensor],
             dx: torch.Tensor | None = None, dws: Sequence[torch.Tensor] | None = None,
             version: str | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Gradients of y = x · (W_K ⊗ … ⊗ W_1) for dL/dy = g: (dx, [dW_1, …, dW_K]); states from `forward` (cpu, v1,
    v2, v6; [] for the tensor-core versions v3-v5, whose backward recomputes them at its precision)."""
    check_inputs(x, factors)
    dx = torch.empty_like(x) if dx is None else dx
    dws = [torch.empty_like(w) for w in factors] if dws is None else list(dws)
    ext().backward(g, x, list(factors), list(states), dx, dws, version_number(version or _backward_default(x)))
    return dx, dws


def kron(x: torch.Tensor, factors: Sequence[torch.Tensor], version: str | None = None, *, cfg: int = -1,
         cols: int = 0) -> torch.Tensor:
    """y = x · (W_K ⊗ … ⊗ W_1), differentiable in x and every factor.

    x: (batch, N); factors: [W_1, …, W_K], W_k (f_k, f_k), N = f_1·…·f_K, W_1 on the fastest axis of x.
    version: 'cpu', 'v1' .. 'v6' (compiled; default: cpu on the CPU, on CUDA the fastest of the dtype's precision from
    the tuning table tune_default writes, else v2, v3 for bfloat16) or a PyTorch baseline: 'torch', 'torch.bmm',
    'torch.bmm.tf32', 'torch.kron'. cpu/v1/v2/v6 take float32/float64, v3/v4/v5 float32 (TF32) and bfloat16,
    their gradients at the same precision. The compiled versions are differentiable once (as @once_differentiable:
    with create_graph=True their gradients come back, and a second backward through them raises; the PyTorch
    baselines are differentiable twice).
    """
    check_inputs(x, factors)
    version = version or default_version(x, factors)
    if version in PYTORCH:
        return PYTORCH[version](x, list(factors))
    if version not in KERNELS:
        raise ValueError(f"version must be one of {', '.join(TORCH_VERSIONS + KERNELS)}, got {version!r}")
    # a C++ autograd Function (cpp_src/kron/kron.cpp, KronAutograd): cpu/v1/v2/v6 save the K-1 intermediate states for
    # backward.cu / cpu.cpp, v3-v5 save none (backward_tc.cu recomputes them); its backward runs without the GIL
    return ext().apply(x, list(factors), version_number(version), cfg, cols)


class KronLinear(torch.nn.Module):
    """A linear layer N -> N whose weight is W_K ⊗ … ⊗ W_1 (Σ f_k² parameters instead of N²)."""

    def __init__(self, sizes: Sequence[int], version: str | None = None, dtype=None, device=None):
        super().__init__()
        self.sizes, self.version = parse_factors(sizes), version
        # each factor ~ N(0, 1/f): the product keeps unit variance through every step
        self.factors = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(f, f, dtype=dtype, device=device) / math.sqrt(f)) for f in self.sizes])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kron(x, list(self.factors), self.version)

    def extra_repr(self) -> str:
        return f"factors={factors_label(self.sizes)}, N={math.prod(self.sizes)}, version={self.version}"


# ---- v2's launch choice, and timing the alternatives ---------------------------------------------------------------
def plan(batch: int, sizes: Sequence[int] | str, dtype: torch.dtype = torch.float32, device="cuda", cfg: int = -1,
         cols: int = 0, version: str = "v2") -> dict:
    """What v2 (or v3 .. v6) launches for this batch and factorisation: block configuration, slice width c (columns of
    W_K per block), slices per sample, shared memory per block, resident blocks per SM; fits=0 means v2 runs v1 (v3
    runs v2; v4, v5 run v3; v6 runs v2). For v3, TM and TN are the warp tile. The field names come from the binding
    (cuda_src/kron/plan_info.h)."""
    like = torch.empty(0, dtype=dtype, device=device)
    return dict(ext().fused_plan(like, int(batch), list(parse_factors(sizes)), cfg, cols, version_number(version)))


def backward_kernels(batch: int, sizes: Sequence[int] | str, dtype: torch.dtype = torch.float32, device="cuda",
                     version: str = "v2") -> str:
    """Which kernels `version`'s backward runs for this batch and factorisation (16-byte aligned tensors): the
    source file, 'backward.cu' (v1's per-factor kernels: v1, v2, and v6 where its own does not apply),
    'backward_v6.cu' (v6: float32, two factors, multiples of 32, small batches), 'backward_tc.cu' (v3-v5) or
    'cpu.cpp'."""
    like = torch.empty(0, dtype=dtype, device=device)
    return ext().backward_kernels(like, int(batch), list(parse_factors(sizes)), version_number(version))


def tune(batch: int, sizes: Sequence[int] | str, dtype: torch.dtype = torch.float32, device="cuda",
         budget_ms: float = 40.0, version: str = "v2") -> list[dict]:
    """Time every (configuration, slice width) of a fused version that fits, against its automatic choice: rows
    (version, cfg, c, slices, blocks_per_sm, smem_bytes, median_us, auto). version "v2" (float32/float64) also times
    v1 in every configuration; "v3" (float32 in TF32, bfloat16) its two configurations; "v4" its slice widths and "v5"
    its schedules (cfg 0-2) at each slice width (where they do not apply, nothing but the automatic row, which then
    times v3)."""
    sizes = parse_factors(sizes)
    g = torch.Generator().manual_seed(0)
    x, *fs = make_forward_inputs({"batch": batch, "factors": factors_label(sizes)}, dtype, torch.device(device), g)
    out = torch.empty_like(x)
    auto = plan(batch, sizes, dtype, device, version=version)
    rows = []

    def timed(v, cfg, cols):
        with build.frozen():
            return time_cuda(lambda: ext().forward(x, fs, out, [], version_number(v), cfg, cols),
                             budget_ms=budget_ms).median_us

    fK = sizes[-1]
    q = 8 if version == "v3" else 4  # slice widths are multiples of this
    cs = sorted({(-(-fK // n) + q - 1) // q * q for n in (1, 2, 4, 8, 16, 32) if -(-fK // n) >= 1}, reverse=True)
    if version in ("v4", "v5"):  # multiples of 64 that divide f_K
        cs = [c for c in range(fK, 63, -64) if fK % c == 0]
    for cfg in range({"v3": 2, "v4": 1, "v5": 3, "v6": 3}.get(version, 3)):
        for c in cs:
            p = plan(batch, sizes, dtype, device, cfg, c, version=version)
            if not p["fits"] or p["c"] != c:
                continue
            rows.append({"version": version, "cfg": cfg, "c": p["c"], "slices": p["slices"],
                         "blocks_per_sm": p["blocks_per_sm"], "smem_bytes": p["smem_bytes"], "stages": p["stages"],
                         "median_us": timed(version, cfg, c),
                         "auto": bool(auto["fits"] and auto["cfg"] == cfg and auto["c"] == p["c"])})
    if version == "v2":
        for cfg in range(3):
            rows.append({"version": "v1", "cfg": cfg, "c": None, "slices": None, "blocks_per_sm": None,
                         "smem_bytes": None, "stages": None, "median_us": timed("v1", cfg, 0),
                         "auto": False})
    rows.append({"version": f"{version} (auto)", "cfg": auto["cfg"], "c": auto["c"], "slices": auto["slices"],
                 "blocks_per_sm": auto["blocks_per_sm"], "smem_bytes": auto["smem_bytes"], "stages": auto["stages"],
                 "median_us": timed(version, -1, 0), "auto": True})
    return rows


# ---- ops ----------------------------------------------------------------------------------------------------------
def _sizes(shape: dict) -> tuple[int, ...]:
    return parse_factors(shape["factors"])


def make_forward_inputs(shape, dtype, device, gen):
    """(x, W_1, …, W_K): x ~ N(0, 1), W_k ~ N(0, 1/f_k), so every step keeps unit variance."""
    sizes = _sizes(shape)
    x = randn((shape["batch"], math.prod(sizes)), dtype, device, gen)
    return (x, *[randn((f, f), dtype, device, gen, scale=1 / math.sqrt(f)) for f in sizes])


def make_train_inputs(shape, dtype, device, gen):
    """(x, g, W_1, …, W_K): g = dL/dy."""
    x, *fs = make_forward_inputs(shape, dtype, device, gen)
    return (x, randn(tuple(x.shape), dtype, device, gen), *fs)


def train_ref(x, g, *factors):
    """(y, dx, dW_1, …, dW_K) of kron_ref, by autograd."""
    with torch.enable_grad():
        xr = x.detach().requires_grad_()
        fr = [w.detach().requires_grad_() for w in factors]
        y = kron_ref(xr, *fr)
        grads = torch.autograd.grad(y, [xr, *fr], g)
    return (y.detach(), *grads)


def train_precision(version: str):
    """The cuBLAS setting a training step of `version` runs under: autograd calls the baselines' backward outside their
    forward's TF32 switch, so the whole step takes it (TF32 for torch.bmm.tf32, strict fp32 otherwise; the compiled
    versions do not read it)."""
    return matmul_tf32(True) if version == "torch.bmm.tf32" else strict_fp32()


def _train(version: str):
    """Forward + backward through kron(): what a training step of this layer costs."""
    def run(x, g, *factors):
        with torch.enable_grad(), train_precision(version):
            xr = x.detach().requires_grad_()
            fr = [w.detach().requires_grad_() for w in factors]
            y = kron(xr, fr, version)
            grads = torch.autograd.grad(y, [xr, *fr], g)
        return (y.detach(), *grads)
    return run


def _fwd_kernel(version: str):
    return lambda x, *fs, out=None: forward(x, fs, out=out, version=version)


def _fwd_torch(version: str):
    return lambda x, *fs: PYTORCH[version](x, fs)


def _flops(shape, dt):
    s = _sizes(shape)
    return 2.0 * shape["batch"] * math.prod(s) * sum(s)


def _bytes(shape, dt):
    s = _sizes(shape)
    return (2.0 * shape["batch"] * math.prod(s) + sum(f * f for f in s)) * elem_size(dt)


def state_size(sizes: Sequence[int]) -> int:
    return math.prod(parse_factors(sizes))


def intensity(batch: int, sizes: Sequence[int] | str, dtype=torch.float32) -> float:
    """Arithmetic intensity of the forward: FLOP per byte of the fewest bytes moved."""
    shape = {"batch": batch, "factors": factors_label(parse_factors(sizes))}
    return _flops(shape, dtype) / _bytes(shape, dtype)


IDEAS = {
    "cpu": "C++ with at::parallel_for: the same F-steps, 64-row blocks of y kept in cache",
    "v1": "CUDA: one tiled kernel per factor (cp.async 2-stage pipeline, 8x8 or 4x4 register tiles)",
    "v2": "CUDA: one fused kernel, the sample's state in shared memory from W_K to W_1",
    "v3": "CUDA: v2's fusion on tensor cores (mma.sync TF32 / bf16, ldmatrix), the state stored in the next A layout",
    "v4": "CUDA: two factors on wgmma: x, W staged transposed into swizzled K-major tiles, the state kept on chip",
    "v5": ("CUDA: v4's wgmma steps fed by TMA: x in flight in a ring, y out by TMA store (bf16: operands MN-major as "
           "in memory; TF32: x and W_1 through registers)"),
    "v6": ("CUDA: v2 for two factors in strict fp32, all of a block's operands in flight from its start (no "
           "2-stage pipeline); 4x4 outputs a thread, or 8x4 with k split among two or four threads; backward: one "
           "kernel a (sample, slice) for dx and both dW shares, then a reduce (small batches)"),
    "torch": "PyTorch as one writes it: reshape / matmul / movedim per factor (a copy per factor)",
    "torch.bmm": "PyTorch: one strided-batched GEMM per factor, axis move folded into the operand layout",
    "torch.bmm.tf32": "torch.bmm with TF32 on (cuBLAS TF32): v3's baseline on float32 tensors",
    "torch.kron": "torch.kron builds the N×N matrix, then x @ M",
}

F32_F64, F32_BF16, F32 = (torch.float32, torch.float64), (torch.float32, torch.bfloat16), (torch.float32,)
DT = (torch.float32, torch.float64, torch.bfloat16)  # bfloat16: v3-v5 and the torch baselines only
DT_TRAIN = DT  # bfloat16: v3-v5 and the torch baselines
# 1-wide and prime factors, K = 1..4, a batch that splits into many blocks, 128x128, one shape over v2's
# shared-memory limit (it falls back to v1), two that v6 takes besides 32x32 and 128x128 (f_1 = 96: 6 warps;
# f_1 < f_2), and issue 15's shapes beyond 128x128: (2,)·8, 256x256, 64x64x64
CHECK = [{"batch": b, "factors": f} for b, f in [
    (3, "2x3"), (1, "5x7"), (5, "1x4x5"), (4, "13x17"), (3, "32x32"), (2, "8x16x32"), (3, "128x128"),
    (2, "2x3x2x5"), (7, "9"), (33, "12x20"), (1, "100x100x2"), (5, "96x64"), (2, "64x128"),
    (2, "2x2x2x2x2x2x2x2"), (2, "256x256"), (1, "64x64x64")]]   # eight 2-wide factors; two past 128 × 128
BATCHES = (1, 8, 32, 128, 512, 1024, 4096)
BENCH = [{"batch": b, "factors": "128x128"} for b in BATCHES]
BENCH_CPU = [{"batch": b, "factors": "64x64"} for b in (1, 8, 32, 128)]
FACTORIZATIONS = ["32x32", "8x16x32", "64x64", "128x128", "256x256", "16x16x16x16", "64x64x64",
                  "2x2x2x2x2x2x2x2"]
FORMULA = "FLOP = 2·B·N·Σf_k; bytes = (2·B·N + Σf_k²)·sizeof(dtype) (read x and the factors, write y)"
FORMULA_TRAIN = ("FLOP = 6·B·N·Σf_k (forward + dx + dW); bytes = (4·B·N + 2·Σf_k²)·sizeof(dtype) "
                 "(read x, dy, factors; write y, dx, dW)")


def _versions(train: bool, full: bool = True) -> list[Version]:
    vs = []
    for name in KERNELS:
        dev = "cpu" if name == "cpu" else "cuda"
        if train:
            if name in TENSOR_CORE:  # the forward and backward_tc.cu at TF32 / bf16
                vs.append(Version(name, _train(name), dev, IDEAS[name], takes_out=False, graph=True,
                                  precision="tf32", dtypes=F32_BF16, ceiling="gemm"))
                continue
            vs.append(Version(name, _train(name), dev, IDEAS[name], takes_out=False, graph=name != "cpu",
                              dtypes=F32_F64))
        elif name in TENSOR_CORE:
            # TF32 on float32, bf16 on bfloat16; %peak against cuBLAS at that precision
            vs.append(Version(name, _fwd_kernel(name), dev, IDEAS[name], graph=True, precision="tf32",
                              dtypes=F32_BF16, ceiling="gemm"))
        else:
            vs.append(Version(name, _fwd_kernel(name), dev, IDEAS[name], graph=name in ("v1", "v2", "v6"),
                              dtypes=F32_F64))
    for name in TORCH_VERSIONS:
        if name == "torch.kron" and not full:   # (training too: the full-matrix layer a user could write, N×N grads)
            continue
        fn = _train(name) if train else _fwd_torch(name)
        # torch.kron is checked by the tests on small N only (its N×N matrix is 4·N² bytes)
        # the cuBLAS baselines are held against cuBLAS's own GEMM rate at their precision (bf16 runs on tensor cores)
        extra = dict(precision="tf32", dtypes=F32, ceiling="gemm") if name == "torch.bmm.tf32" else \
            dict(dtypes=F32_F64) if name == "torch.kron" else dict(ceiling="gemm")
        vs.append(Version(name, fn, "any" if name != "torch.bmm.tf32" else "cuda", IDEAS[name], baseline=True,
                          takes_out=False, check=name not in ("torch.kron", "torch.bmm.tf32"),
                          graph=name != "torch.kron", **extra))
    return vs


OPS = [
    Op(FAMILY, "forward", make_forward_inputs, kron_ref, _versions(False), CHECK, BENCH, BENCH_CPU, DT,
       nbytes=_bytes, flops=_flops, formula=FORMULA, size_key="batch", baseline="torch.bmm", compute_ceiling="fma",
       scale=verify.root_sum_square(kron_ref), doc="y = x · (W_K ⊗ … ⊗ W_1); batch sweep at factors 128×128"),
    Op(FAMILY, "forward_backward", make_train_inputs, train_ref, _versions(True), CHECK, BENCH, BENCH_CPU, DT_TRAIN,
       nbytes=lambda s, dt: (4.0 * s["batch"] * math.prod(_sizes(s)) + 2 * sum(f * f for f in _sizes(s)))
       * elem_size(dt),
       flops=lambda s, dt: 3 * _flops(s, dt), formula=FORMULA_TRAIN, size_key="batch", baseline="torch.bmm",
       compute_ceiling="fma", scale=verify.root_sum_square(train_ref),
       doc="forward + backward (y, dx, every dW) through autograd"),
    Op(FAMILY, "factorizations", make_forward_inputs, kron_ref, _versions(False, full=False),
       [{"batch": 2, "factors": "4x6x8"}, {"batch": 3, "factors": "16x16x16x16"}],
       [{"batch": 256, "factors": f} for f in FACTORIZATIONS],
       [{"batch": 16, "factors": f} for f in ("32x32", "8x16x32", "64x64", "16x16x16")], DT,
       nbytes=_bytes, flops=_flops, formula=FORMULA, size_key=None, baseline="torch.bmm", compute_ceiling="fma",
       scale=verify.root_sum_square(kron_ref), doc="forward across factorisations at batch 256"),
]

register(Family(FAMILY, "Kronecker-factored linear layer y = x·(W_K ⊗ … ⊗ W_1): forward and backward", OPS,
                notebook="notebooks/05_kronecker_layer.ipynb"))
