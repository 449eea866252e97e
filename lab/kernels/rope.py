"""Rotary position embedding (RoPE): rotate pairs of query/key features by position-dependent angles.

Sources: cuda_src/rope/ (rope.cuh: shared device code and the v1 kernel, the ladder and napkin math; v1.cu; v2.cu:
v2 and v3, built once per (tensor, table) dtype pair and pairing), cpp_src/rope/rope.cpp (binding, named checks),
cpp_src/rope/cpu.cpp (the C++ CPU version).

A tensor of rows of head_dim = D features, laid out 'bhsd' (batch, heads, seq, D) or 'bshd' (batch, seq, heads, D);
the row at sequence index s is at position offset + s (offset > 0: decoding with a cache). Pair i of a row turns by
the angle position * theta_i, tabulated by the caller as cos[p, i], sin[p, i]: (max_pos, D/2) tables, float32 or the
tensor's dtype (`rope_tables` builds the standard ones). Pairs are half-split (x[i], x[i + D/2]) — the rotate_half
convention of GPT-NeoX / HF Llama — or interleaved (x[2i], x[2i+1]) — GPT-J / Meta's Llama, RoFormer's paper.

    rope(x, cos, sin)            one tensor               rope_backward(grad, cos, sin)   rotation by -angle
    rope_qk(q, k, cos, sin)      queries and keys (k may have fewer heads), one launch from v3 on
    apply_rope(q, k, cos, sin)   the autograd.Function: differentiable in q and k

Every wrapper takes `version`: 'v1', 'v2', 'v3' (CUDA) or 'cpu' (the C++ CPU code); `out` is optional.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .. import build
from ..registry import Family, Op, Version, register, version_number
from . import _triton
from ._common import elem_size, randn

if _triton.MISSING is None:   # optional: without triton the `triton` version is listed on no device, with why
    from ._triton import rope as triton_rope

FAMILY = "rope"
LAYOUTS = {"bhsd": 0, "bshd": 1}
LAYOUT_AXES = {"bhsd": "(batch, heads, seq, head_dim)", "bshd": "(batch, seq, heads, head_dim)"}


def ext():
    """The compiled module (built on first use; rebuilt whenever a source changed)."""
    return build.load(FAMILY)


def _default(x: torch.Tensor) -> str:
    return "v3" if x.is_cuda else "cpu"


def _layout(layout: str) -> int:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'bhsd' {LAYOUT_AXES['bhsd']} or 'bshd' {LAYOUT_AXES['bshd']}, "
                         f"got {layout!r}")
    return LAYOUTS[layout]


def seq_len(x: torch.Tensor, layout: str = "bhsd") -> int:
    return x.shape[2] if _layout(layout) == 0 else x.shape[1]


# ---- tables -------------------------------------------------------------------------------------------------------
def rope_tables(max_pos: int, head_dim: int, base: float = 10000.0, dtype: torch.dtype = torch.float32,
                device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: (max_pos, head_dim // 2) tables of angle[p, i] = p * base^(-2i / head_dim), made in float64.

    The half-width form the kernels read. The rotate_half code in HF models keeps (max_pos, head_dim) tables whose
    second half repeats the first: cos_full[:, :head_dim // 2] is this table.
    """
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (features rotate in pairs), got {head_dim}")
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)   # (head_dim/2,)
    angle = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]       # (max_pos, head_dim/2)
    return angle.cos().to(dtype).to(device), angle.sin().to(dtype).to(device)


# ---- wrappers -----------------------------------------------------------------------------------------------------
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, offset: int = 0, layout: str = "bhsd",
         interleaved: bool = False, *, out: torch.Tensor | None = None, version: str | None = None,
         rows_per_thread: int = 0, inverse: bool = False) -> torch.Tensor:
    """x rotated: out[..., pair i of row at seq s] turned by the angle of position offset + s. x: 'bhsd' or 'bshd'."""
    out = torch.empty_like(x) if out is None else out
    return ext().rope(x, cos, sin, out, offset, _layout(layout), interleaved, inverse,
                      version_number(version or _default(x)), rows_per_thread)


def rope_backward(grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, offset: int = 0, layout: str = "bhsd",
                  interleaved: bool = False, *, out: torch.Tensor | None = None, version: str | None = None,
                  rows_per_thread: int = 0) -> torch.Tensor:
    """dL/dx from dL/dy: the rotation's Jacobian is the rotation, so this is grad rotated by -angle."""
    return rope(grad, cos, sin, offset, layout, interleaved, out=out, version=version,
                rows_per_thread=rows_per_thread, inverse=True)


def rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, offset: int = 0,
            layout: str = "bhsd", interleaved: bool = False, *, out: tuple | None = None, version: str | None = None,
            rows_per_thread: int = 0, inverse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k) rotated. k has q's batch, seq and head_dim; its heads may be fewer (grouped-query attention).
    v1, v2: one launch per tensor; v3 (the default on CUDA): one launch for both."""
    q_out, k_out = (torch.empty_like(q), torch.empty_like(k)) if out is None else out
    q_out, k_out = ext().rope_qk(q, k, cos, sin, q_out, k_out, offset, _layout(layout), interleaved, inverse,
                                 version_number(version or _default(q)), rows_per_thread)
    return q_out, k_out


class RopeFunction(torch.autograd.Function):
    """q (and k) -> rotated q (and k). Backward: the incoming gradients rotated by -angle, one launch for both.

    cos/sin are constants (a model's buffers): no gradient flows to them.
    """

    @staticmethod
    def forward(ctx, q, k, cos, sin, offset, layout, interleaved, version):
        ctx.save_for_backward(cos, sin)
        ctx.cfg = (offset, layout, interleaved, version)
        if k is None:
            return rope(q, cos, sin, offset, layout, interleaved, version=version)
        return rope_qk(q, k, cos, sin, offset, layout, interleaved, version=version)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        cos, sin = ctx.saved_tensors
        offset, layout, interleaved, version = ctx.cfg
        gs = [g.contiguous() for g in grads]  # autograd may hand us expanded or transposed gradients
        if len(gs) == 1:
            dq, dk = rope(gs[0], cos, sin, offset, layout, interleaved, version=version, inverse=True), None
        else:
            dq, dk = rope_qk(gs[0], gs[1], cos, sin, offset, layout, interleaved, version=version, inverse=True)
        return dq, dk, None, None, None, None, None, None


def apply_rope(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, offset: int = 0,
               layout: str = "bhsd", interleaved: bool = False, version: str | None = None):
    """Differentiable RoPE of q and k (or of q alone when k is None): returns (q_rot, k_rot) or q_rot."""
    if cos.requires_grad or sin.requires_grad:
        raise ValueError("cos and sin are treated as constants (no gradient is computed for them); pass "
                         "cos.detach(), sin.detach()")
    return RopeFunction.apply(q, k, cos, sin, offset, layout, interleaved, version)


# ---- the reference (plain PyTorch; verify runs it in float64) ----------------------------------------------------
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dim: the half-split pairs turned by 90 degrees."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...): the interleaved pairs turned by 90 degrees."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def widen_tables(cos, sin, offset: int, seq: int, layout: str = "bhsd", interleaved: bool = False):
    """Rows offset .. offset+seq of the (max_pos, D/2) tables, widened to D the way each pairing reads them
    (half-split: c0..c_{D/2-1} c0..c_{D/2-1}; interleaved: c0 c0 c1 c1 ...), shaped to broadcast against x."""
    c, s = cos[offset:offset + seq], sin[offset:offset + seq]                       # (seq, D/2)
    if interleaved:
        c, s = c.repeat_interleave(2, dim=-1), s.repeat_interleave(2, dim=-1)       # (seq, D)
    else:
        c, s = torch.cat((c, c), dim=-1), torch.cat((s, s), dim=-1)                 # (seq, D)
    if _layout(layout) == 1:
        c, s = c[:, None, :], s[:, None, :]                                         # (seq, 1, D) vs (b, s, h, D)
    return c, s


def _rope_core(x, c, s, interleaved: bool):
    # x * cos + rotate_half(x) * sin; with float32 tables and a 16-bit x, type promotion computes in float32
    rot = rotate_pairs if interleaved else rotate_half
    return (x * c + rot(x) * s).to(x.dtype)


def rope_ref(x, cos, sin, offset: int = 0, layout: str = "bhsd", interleaved: bool = False):
    """The rotate_half form: x * cos + rotate_half(x) * sin (rotate_pairs for interleaved pairs)."""
    c, s = widen_tables(cos, sin, offset, seq_len(x, layout), layout, interleaved)
    return _rope_core(x, c, s, interleaved)


def rope_qk_ref(q, k, cos, sin, offset: int = 0, layout: str = "bhsd", interleaved: bool = False):
    return rope_ref(q, cos, sin, offset, layout, interleaved), rope_ref(k, cos, sin, offset, layout, interleaved)


def rope_backward_ref(grad, x, cos, sin, offset: int = 0, layout: str = "bhsd", interleaved: bool = False):
    """dL/dx by autograd through rope_ref (independent of the claim that it is the rotation by -angle)."""
    with torch.enable_grad():
        xr = x.detach().requires_grad_(True)
        return torch.autograd.grad(rope_ref(xr, cos, sin, offset, layout, interleaved), xr, grad)[0]


# ---- baselines: eager rotate_half and torch.compile of it ----------------------------------------------------------
_wide_cache: dict[tuple, tuple] = {}


def _wide_cached(cos, sin, offset, seq, layout, interleaved, dtype):
    """widen_tables, cast to the activations' dtype, done once per table and call pattern — as a model's rotary
    module does once per forward for all its layers (Hugging Face's returns cos/sin `.to(x.dtype)`) — so the
    baselines time the rotation as users write it, not the table prep (and not fp32 arithmetic on bf16 inputs)."""
    key = (cos.data_ptr(), sin.data_ptr(), cos._version, sin._version, tuple(cos.shape), cos.dtype, cos.device,
           offset, seq, layout, interleaved, dtype)
    if key not in _wide_cache:
        if len(_wide_cache) > 16:
            _wide_cache.clear()
        c, s = widen_tables(cos, sin, offset, seq, layout, interleaved)
        _wide_cache[key] = (c.to(dtype), s.to(dtype))
    return _wide_cache[key]


def clear_table_cache() -> None:
    """Forget the cast tables of the baselines (a timing of their first call starts without them)."""
    _wide_cache.clear()


def _qk_core(q, k, c, s, interleaved: bool):
    return _rope_core(q, c, s, interleaved), _rope_core(k, c, s, interleaved)


_compiled: dict[str, object] = {}


def compiled(name: str):
    """torch.compile of the baseline cores (static shapes; compiled on first call per shape and dtype).

    Dynamo keeps compiled variants per code object and gives up after `recompile_limit` (8) of them, silently
    falling back to eager; a benchmark sweeps more shapes than that, so the limit is raised here.
    """
    if name not in _compiled:
        import torch._dynamo
        for knob in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), 256))
        _compiled[name] = torch.compile({"rope": _rope_core, "qk": _qk_core}[name], dynamic=False)
    return _compiled[name]


def rope_torch(x, cos, sin, offset=0, layout="bhsd", interleaved=False):
    c, s = _wide_cached(cos, sin, offset, seq_len(x, layout), layout, interleaved, x.dtype)
    return _rope_core(x, c, s, interleaved)


def rope_torch_compile(x, cos, sin, offset=0, layout="bhsd", interleaved=False):
    c, s = _wide_cached(cos, sin, offset, seq_len(x, layout), layout, interleaved, x.dtype)
    return compiled("rope")(x, c, s, interleaved)


def rope_qk_torch(q, k, cos, sin, offset=0, layout="bhsd", interleaved=False):
    c, s = _wide_cached(cos, sin, offset, seq_len(q, layout), layout, interleaved, q.dtype)
    return _qk_core(q, k, c, s, interleaved)


def rope_qk_torch_compile(q, k, cos, sin, offset=0, layout="bhsd", interleaved=False):
    c, s = _wide_cached(cos, sin, offset, seq_len(q, layout), layout, interleaved, q.dtype)
    return compiled("qk")(q, k, c, s, interleaved)


def rope_triton(x, cos, sin, offset=0, layout="bhsd", interleaved=False, out=None):
    return triton_rope.rope(x, cos, sin, offset, layout, interleaved, out=out)


class BackwardOf:
    """Times a backward pass alone: the forward graph of `core` is built once per input set and kept; each call runs
    autograd.grad(y, x, grad, retain_graph=True) through it — what a training step pays for RoPE's backward."""

    def __init__(self, core_name: str | None):
        self.core_name, self._key, self._graph = core_name, None, None

    def __call__(self, grad, x, cos, sin, offset=0, layout="bhsd", interleaved=False):
        key = (grad.data_ptr(), x.data_ptr(), tuple(x.shape), x.dtype, cos.data_ptr(), offset, layout, interleaved)
        if key != self._key:
            self._graph = None  # free the old graph first
            c, s = _wide_cached(cos, sin, offset, seq_len(x, layout), layout, interleaved, x.dtype)
            core = compiled(self.core_name) if self.core_name else _rope_core
            with torch.enable_grad():
                xr = x.detach().requires_grad_(True)
                self._graph, self._key = (xr, core(xr, c, s, interleaved)), key
        xr, y = self._graph
        return torch.autograd.grad(y, xr, grad, retain_graph=True)[0]


# ---- ops --------------------------------------------------------------------------------------------------------
def make_shape(batch, heads, seq, head_dim, offset=0, layout="bhsd", pairs="half", kv_heads=None) -> dict:
    s = {"batch": batch, "heads": heads}
    if kv_heads is not None:
        s["kv_heads"] = kv_heads
    s.update(seq=seq, head_dim=head_dim, offset=offset, layout=layout, pairs=pairs)
    return s


def _dims(s: dict, heads: int) -> tuple:
    if s["layout"] == "bshd":
        return (s["batch"], s["seq"], heads, s["head_dim"])
    return (s["batch"], heads, s["seq"], s["head_dim"])


def _tables(s: dict, device) -> tuple:
    # 3 spare positions: the kernels must not rely on the tables ending at the last position used
    return rope_tables(s["offset"] + s["seq"] + 3, s["head_dim"], device=device)


def _common(s: dict) -> tuple:
    return s["offset"], s["layout"], s["pairs"] == "interleaved"


def make_rope(s, dt, dev, g):
    # (x, cos, sin, offset, layout, interleaved)
    return (randn(_dims(s, s["heads"]), dt, dev, g), *_tables(s, dev), *_common(s))


def make_qk(s, dt, dev, g):
    # (q, k, cos, sin, offset, layout, interleaved)
    return (randn(_dims(s, s["heads"]), dt, dev, g), randn(_dims(s, s["kv_heads"]), dt, dev, g), *_tables(s, dev),
            *_common(s))


def make_bwd(s, dt, dev, g):
    # (grad_out, x, cos, sin, offset, layout, interleaved); x only builds the baselines' autograd graphs
    return (randn(_dims(s, s["heads"]), dt, dev, g), randn(_dims(s, s["heads"]), dt, dev, g), *_tables(s, dev),
            *_common(s))


def _kernel_versions(call, ideas: dict[str, str], graph: bool = False) -> list[Version]:
    vs = [Version("cpu", lambda *a, out=None: call(*a, out=out, version="cpu"), "cpu", "C++ with at::parallel_for")]
    for name, idea in ideas.items():
        vs.append(Version(name, (lambda n: lambda *a, out=None: call(*a, out=out, version=n))(name), "cuda", idea,
                          graph=graph))
    return vs


IDEAS = {"v1": "one thread per pair, scalar loads, cos/sin from the tables",
         "v2": "16-byte vectors; cos/sin loaded once for 2 heads"}
IDEAS_QK = {**IDEAS, "v3": "q and k in one launch"}


def _baselines(eager, compiled_fn, what: str, graph: bool = False) -> list[Version]:
    return [Version("torch", eager, "any", f"eager {what}", baseline=True, takes_out=False, check=False, graph=graph),
            Version("torch.compile", compiled_fn, "cuda", f"torch.compile of {what}", baseline=True,
                    takes_out=False, check=False, graph=graph)]


def _numel(s, heads):
    return s["batch"] * heads * s["seq"] * s["head_dim"]


def _table_bytes(s):
    return 2 * s["seq"] * (s["head_dim"] // 2) * 4  # the cos and sin rows used, float32


def _bytes_one(s, dt):
    return 2 * _numel(s, s["heads"]) * elem_size(dt) + _table_bytes(s)


def _bytes_qk(s, dt):
    return 2 * (_numel(s, s["heads"]) + _numel(s, s["kv_heads"])) * elem_size(dt) + _table_bytes(s)


FORMULA = "GB/s = (2·numel·sizeof(dtype) + 2·seq·(head_dim/2)·4) / time (read x, write y, the cos/sin rows once)"
FORMULA_QK = "GB/s = (2·(numel_q + numel_k)·sizeof(dtype) + cos/sin rows) / time; FLOP = 3 per element"

CHECK_ONE = [
    make_shape(1, 1, 1, 2),
    make_shape(2, 3, 5, 6),                                 # head_dim/2 = 3: no 16-byte vectors -> v1's path
    make_shape(1, 2, 7, 10, 4, "bshd", "interleaved"),
    make_shape(3, 5, 17, 64, 11, "bshd"),
    make_shape(2, 4, 33, 128, 100),
    make_shape(1, 3, 9, 96, 3, "bshd", "interleaved"),
    make_shape(2, 2, 13, 80, 0, "bhsd", "interleaved"),     # 5 lanes of 16 bytes per bf16 half row
    make_shape(1, 1, 31, 256),
    make_shape(1, 7, 1, 128, 2047, "bshd"),                 # one decoding step deep into the cache
    make_shape(2, 6, 19, 18, 5, "bhsd", "interleaved"),
    make_shape(1, 9, 3, 8, 0, "bshd"),
    make_shape(4, 5, 2, 16, 1),
]
CHECK_QK = [
    make_shape(1, 1, 1, 2, kv_heads=1),
    make_shape(2, 8, 5, 64, kv_heads=2),
    make_shape(1, 4, 7, 32, 3, "bshd", "interleaved", kv_heads=1),
    make_shape(3, 5, 9, 6, 1, "bshd", kv_heads=5),
    make_shape(2, 6, 17, 128, 40, "bhsd", "interleaved", kv_heads=3),
    make_shape(1, 32, 3, 128, 1000, "bshd", kv_heads=8),
    make_shape(2, 3, 33, 80, kv_heads=1),
]
CHECK_DECODE = [make_shape(b, h, 1, d, off, "bshd", pairs, kv_heads=kv) for b, h, kv, d, off, pairs in
                [(1, 4, 1, 64, 0, "half"), (3, 8, 2, 128, 517, "half"), (2, 6, 6, 34, 9, "interleaved"),
                 (5, 32, 8, 128, 4095, "interleaved")]]

SEQS = (128, 256, 512, 1024, 2048, 4096)
BENCH_ONE = [make_shape(8, 32, s, 128) for s in SEQS]                    # the shape at seq 2048
BENCH_QK = [make_shape(8, 32, s, 128, kv_heads=32) for s in (512, 2048, 4096)]
BENCH_BWD = [make_shape(8, 32, s, 128) for s in (512, 2048, 4096)]
BENCH_DECODE = [make_shape(b, 32, 1, 128, 4095, "bshd", kv_heads=8) for b in (1, 8, 32, 128)]   # Llama-3-8B heads
DT = (torch.float32, torch.float16, torch.bfloat16)

OPS = [
    Op(FAMILY, "rope", make_rope, rope_ref,
       _kernel_versions(rope, IDEAS)
       + _baselines(rope_torch, rope_torch_compile, "x·cos + rotate_half(x)·sin (float32 tables)")
       + [_triton.version(rope_triton, "Triton: rows x (pair, member) blocks, tl.split/tl.join; both layouts and "
                                       "pairings (lab/kernels/_triton/rope.py)")],
       CHECK_ONE, BENCH_ONE, [make_shape(2, 8, s, 128) for s in (128, 512)], DT,
       nbytes=_bytes_one, flops=lambda s, dt: 3 * _numel(s, s["heads"]), formula=FORMULA, size_key="seq",
       doc="one tensor, forward"),
    Op(FAMILY, "rope_qk", make_qk, rope_qk_ref,
       _kernel_versions(rope_qk, IDEAS_QK)
       + _baselines(rope_qk_torch, rope_qk_torch_compile, "rotate_half on q and k"),
       CHECK_QK, BENCH_QK, [make_shape(2, 8, s, 128, kv_heads=8) for s in (128, 512)], DT,
       nbytes=_bytes_qk, flops=lambda s, dt: 3 * (_numel(s, s["heads"]) + _numel(s, s["kv_heads"])),
       formula=FORMULA_QK, size_key="seq", doc="queries and keys, forward"),
    Op(FAMILY, "rope_bwd", make_bwd, rope_backward_ref,
       _kernel_versions(lambda g, x, *a, out=None, version=None: rope_backward(g, *a, out=out, version=version),
                        IDEAS)
       + _baselines(BackwardOf(None), BackwardOf("rope"), "autograd backward of rotate_half"),
       CHECK_ONE[:6], BENCH_BWD, [make_shape(2, 8, s, 128) for s in (128, 512)], DT,
       nbytes=_bytes_one, flops=lambda s, dt: 3 * _numel(s, s["heads"]),
       formula=FORMULA.replace("read x, write y", "read dL/dy, write dL/dx"), size_key="seq",
       doc="one tensor, backward: dL/dx = dL/dy rotated by -angle"),
    Op(FAMILY, "rope_decode", make_qk, rope_qk_ref,
       _kernel_versions(rope_qk, IDEAS_QK, graph=True)
       + _baselines(rope_qk_torch, rope_qk_torch_compile, "rotate_half on q and k", graph=True),
       CHECK_DECODE, BENCH_DECODE, [make_shape(b, 32, 1, 128, 4095, "bshd", kv_heads=8) for b in (1, 8)], DT,
       nbytes=_bytes_qk, flops=lambda s, dt: 3 * (_numel(s, s["heads"]) + _numel(s, s["kv_heads"])),
       formula=FORMULA_QK, size_key="batch",
       doc="one decoding step: q, k of one new token per sequence at position 4095, (batch, 1, heads, 128)"),
]


# What torch.compile costs before its first run (the extra compile_time) is a study: lab/studies/rope.py.
register(Family(FAMILY, "Rotary position embedding: fused forward and backward, q and k in one launch", OPS,
                notebook="notebooks/07_rope.ipynb"))
