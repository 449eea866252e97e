"""nn.Embedding: the forward (gather rows of a table) and the backward (the dense weight gradient, a scatter-add).

Sources: cuda_src/embedding/ (embedding.cuh: shared device code, the ladder and napkin math; v1.cu; v2.cu),
cpp_src/embedding/embedding.cpp (binding, named checks), cpp_src/embedding/cpu.cpp (the C++ CPU version).

idx: int64 or int32 indices of any shape; weight: (num_embeddings, dim) float32, bfloat16 or float64.

    embedding(idx, weight)                          out[..., :] = weight[idx[...], :]     (idx.shape + (dim,))
    embedding_backward(grad_out, idx, V)            grad_weight[n] = sum of grad_out rows whose index is n
    apply_embedding(idx, weight)                    the autograd.Function: differentiable in weight

padding_idx as nn.Embedding: None (none) or a row in [-V, V) (negative counts from the end); the forward still gathers
that row, only its gradient is zero. Every wrapper takes `version`: 'v1'..'v4' on CUDA, or 'cpu' (the C++ CPU code); `out` is optional. Backward versions: 'v1' adds with atomics (last bits vary run to run), 'v2', 'v3' and 'v4' sort
the indices and sum each row in a fixed order (bit for bit the same every run); `deterministic=True` refuses v1.

Bad indices: by default every index is checked (a ValueError naming it). On CUDA that check is a synchronisation
(the price is measured in notebook 09); check_indices=False skips it, and under CUDA-graph capture it is skipped
(a capture cannot copy to the host): the kernels then write NaN rows for bad indices and never read out of bounds.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import build
from ..registry import Family, Op, Version, register, version_number
from ._common import elem_size, randn

FAMILY = "embedding"


def ext():
    """The compiled module (built on first use; rebuilt whenever a source changed)."""
    return build.load(FAMILY)


def _padding(padding_idx) -> tuple[bool, int]:
    # None -> no padding row; an int is passed as is (the binding resolves a negative one and checks its range)
    if padding_idx is None:
        return False, 0
    if isinstance(padding_idx, bool) or not isinstance(padding_idx, int):
        raise TypeError(f"padding_idx must be an int or None, got {type(padding_idx).__name__}")
    return True, padding_idx


def resolve_padding(padding_idx, num_embeddings: int) -> int | None:
    """padding_idx as a row number in [0, V), or None (torch's rule: a negative one counts from the end)."""
    if padding_idx is None:
        return None
    if not -num_embeddings <= padding_idx < num_embeddings:
        raise ValueError(f"padding_idx must be within num_embeddings: in [{-num_embeddings}, {num_embeddings}), "
                         f"got {padding_idx}")
    return padding_idx + num_embeddings if padding_idx < 0 else padding_idx


# ---- wrappers -----------------------------------------------------------------------------------------------------
def embedding(idx: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None, *, version: str | None = None,
              out: torch.Tensor | None = None, check_indices: bool = True) -> torch.Tensor:
    """weight[idx]: (*idx.shape, dim). check_indices=False skips the range check (on CUDA a reduction and a sync);
    the kernels then write NaN rows for bad indices rather than read out of bounds."""
    version = version or ("v4" if weight.is_cuda else "cpu")
    if out is None:
        out = torch.empty((*idx.shape, weight.shape[-1] if weight.dim() else 0), dtype=weight.dtype,
                          device=weight.device)
    return ext().embedding_forward(idx, weight, out, *_padding(padding_idx), version_number(version), check_indices)


def embedding_backward(grad_out: torch.Tensor, idx: torch.Tensor, num_embeddings: int,
                       padding_idx: int | None = None, *, version: str | None = None,
                       deterministic: bool | None = None, out: torch.Tensor | None = None,
                       check_indices: bool = True) -> torch.Tensor:
    """dL/dweight: (num_embeddings, dim), grad_out rows added into the rows their indices name; padding_idx's row 0.

    version None picks 'cpu' for CPU tensors and 'v4' on CUDA (both deterministic). `deterministic` true (or, when it
    is None, torch.are_deterministic_algorithms_enabled()) refuses 'v1' (atomics)."""
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    if version is None:
        version = "cpu" if not grad_out.is_cuda else "v4"   # deterministic; v1 (atomics) only when asked for
    elif deterministic and version == "v1":
        raise ValueError("embedding_backward: version 'v1' adds with atomics (not deterministic); use 'v2' or 'cpu' "
                         "with deterministic=True")
    if out is None:
        out = torch.empty((num_embeddings, grad_out.shape[-1] if grad_out.dim() else 0), dtype=grad_out.dtype,
                          device=grad_out.device)
    return ext().embedding_backward(grad_out, idx, num_embeddings, *_padding(padding_idx), out,
                                    version_number(version), check_indices)


class EmbeddingFunction(torch.autograd.Function):
    """weight -> weight[idx]; backward: the dense weight gradient (no gradient for the indices)."""

    @staticmethod
    def forward(ctx, idx, weight, padding_idx, version, deterministic):
        ctx.save_for_backward(idx)
        ctx.cfg = (weight.shape[0], padding_idx, version, deterministic)
        fwd_version = None if version is None or (version == "cpu") != (not weight.is_cuda) else version
        return embedding(idx, weight, padding_idx, version=fwd_version)

    @staticmethod
    def backward(ctx, grad):
        (idx,) = ctx.saved_tensors
        num_embeddings, padding_idx, version, deterministic = ctx.cfg
        gw = embedding_backward(grad.contiguous(), idx, num_embeddings, padding_idx, version=version,
                                deterministic=deterministic, check_indices=False)  # checked in the forward
        return None, gw, None, None, None


def apply_embedding(idx: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None,
                    version: str | None = None, deterministic: bool | None = None) -> torch.Tensor:
    """Differentiable in weight, like F.embedding(idx, weight, padding_idx). `version` names the backward's version
    (the forward uses it too where it is a forward version on that device)."""
    return EmbeddingFunction.apply(idx, weight, padding_idx, version, deterministic)


# ---- the reference (plain PyTorch; verify runs it in float64) ----------------------------------------------------
def embedding_ref(idx, weight, padding_idx=None):
    return F.embedding(idx, weight, padding_idx)


def embedding_backward_ref(grad_out, idx, num_embeddings, padding_idx=None):
    """index_add_ of the grad_out rows in float64 (verify hands float64 in), the padding row zeroed: written apart from
    aten's embedding_dense_backward (the baseline)."""
    dim = grad_out.shape[-1]
    gw = torch.zeros(num_embeddings, dim, dtype=grad_out.dtype, device=grad_out.device)   # (V, dim)
    gw.index_add_(0, idx.reshape(-1).long(), grad_out.reshape(-1, dim))
    pad = resolve_padding(padding_idx, num_embeddings)
    if pad is not None:
        gw[pad] = 0
    return gw


# ---- baselines ----------------------------------------------------------------------------------------------------
def embedding_torch(idx, weight, padding_idx=None):
    return F.embedding(idx, weight, padding_idx)


def embedding_backward_torch(grad_out, idx, num_embeddings, padding_idx=None):
    """What autograd runs for F.embedding's backward (dense, scale_grad_by_freq=False)."""
    pad = resolve_padding(padding_idx, num_embeddings)
    return torch.ops.aten.embedding_dense_backward(grad_out, idx, num_embeddings, -1 if pad is None else pad, False)


# ---- ops --------------------------------------------------------------------------------------------------------
def make_shape(tokens, dim, vocab, dist="uniform", padding_idx=None, idx_dtype="int64", idx_shape=None) -> dict:
    """tokens = prod(idx_shape) (idx_shape None: (tokens,)); dist: 'uniform' or 'zipf' (repeated hot tokens)."""
    s = {"tokens": tokens, "dim": dim, "vocab": vocab, "dist": dist, "idx": idx_dtype}
    if padding_idx is not None:
        s["padding_idx"] = padding_idx
    if idx_shape is not None:
        assert int(torch.tensor(idx_shape).prod()) == tokens, (idx_shape, tokens)
        s["idx_shape"] = tuple(idx_shape)
    return s


def make_indices(s: dict, device, g: torch.Generator) -> torch.Tensor:
    """(idx_shape) indices in [0, vocab), drawn on the CPU from g. 'zipf': rank r drawn with probability ~ 1/(r+1)^1.1
    (a few tokens take a large share, as words do), ranks mapped to random rows so hot rows are spread over the table.
    With a padding_idx, every 5th token is the padding row, so its zero gradient is exercised."""
    n, vocab = s["tokens"], s["vocab"]
    if s["dist"] == "zipf":
        p = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64) ** 1.1                  # (vocab,)
        ranks = torch.multinomial(p, n, replacement=True, generator=g)                     # (tokens,)
        idx = torch.randperm(vocab, generator=g)[ranks]
    else:
        idx = torch.randint(0, vocab, (n,), generator=g)                                   # (tokens,)
    if s.get("padding_idx") is not None:
        idx[::5] = resolve_padding(s["padding_idx"], vocab)
    dt = torch.int32 if s["idx"] == "int32" else torch.int64
    return idx.to(dt).reshape(s.get("idx_shape", (n,))).to(device)


def make_forward(s, dt, dev, g):
    # (idx (idx_shape), weight (vocab, dim), padding_idx)
    idx = make_indices(s, dev, g)
    return idx, randn((s["vocab"], s["dim"]), dt, dev, g), s.get("padding_idx")


def make_backward(s, dt, dev, g):
    # (grad_out (*idx_shape, dim), idx (idx_shape), num_embeddings, padding_idx)
    idx = make_indices(s, dev, g)
    return randn((*idx.shape, s["dim"]), dt, dev, g), idx, s["vocab"], s.get("padding_idx")


def _versions(call, ideas: dict[str, str]) -> list[Version]:
    vs = [Version("cpu", lambda *a, out=None: call(*a, out=out, version="cpu"), "cpu", ideas["cpu"])]
    for name, idea in ideas.items():
        if name != "cpu":
            # timed eager and replayed from a graph: eager pays the index check's sync, a graph replay cannot have one
            vs.append(Version(name, (lambda n: lambda *a, out=None: call(*a, out=out, version=n))(name), "cuda", idea,
                              graph=True))
    return vs


IDEAS_FWD = {"cpu": "C++ row memcpy with at::parallel_for",
             "v1": "one thread per output element",
             "v2": "one warp per row, 16-byte vectors",
             "v3": "v2 with the range check fused in (one flag word, no reduction)",
             "v4": "v3 with evict-first (streaming) stores of the output"}
IDEAS_BWD = {"cpu": "C++, vocabulary ranges per thread, token order (deterministic)",
             "v1": "atomicAdd scatter (fp32 accumulation)",
             "v2": "stable sort, one warp per run of equal indices (deterministic)",
             "v3": "row-centric: each row written once (no memset), long runs cut in fixed chunks (deterministic)",
             "v4": "v3 with its own radix sort: 32-bit keys on log2(V) bits, 32-bit positions (deterministic)"}


def _bytes_fwd(s, dt):
    return 2 * s["tokens"] * s["dim"] * elem_size(dt)


def _bytes_bwd(s, dt):
    return (s["tokens"] + s["vocab"]) * s["dim"] * elem_size(dt)


FORMULA_FWD = "GB/s = 2·tokens·dim·sizeof(dtype) / time (read the gathered rows, write out; the indices not counted)"
FORMULA_BWD = ("GB/s = (tokens + vocab)·dim·sizeof(dtype) / time (read grad_out, write grad_weight; the indices and "
               "any zeroing pass not counted)")

CHECK = [
    make_shape(1, 1, 1),                                                   # vocab 1, dim 1
    make_shape(7, 3, 5),
    make_shape(15, 13, 11, idx_dtype="int32", idx_shape=(3, 5)),
    make_shape(37, 64, 1),                                                 # every token the same row
    make_shape(101, 257, 97, "zipf", padding_idx=3),
    make_shape(24, 8, 19, padding_idx=-1, idx_shape=(2, 3, 4)),            # negative padding_idx: row 18
    make_shape(64, 1024, 300, "zipf", padding_idx=0, idx_dtype="int32"),
    make_shape(513, 36, 1000),                                             # bf16 rows of 72 B: scalar path
    make_shape(33, 6, 7, "zipf", idx_dtype="int32"),                       # fp32 rows of 24 B: scalar path
    make_shape(200, 4, 2),                                                 # 100 tokens per row
    make_shape(9, 40, 50, padding_idx=49, idx_shape=(9, 1)),
    make_shape(50, 8, 1_000_000, "zipf"),                                   # the largest vocabulary
    make_shape(9, 4096, 33, padding_idx=2),                                 # and its widest rows
]
CHECK_BWD = CHECK + [make_shape(2000, 5, 3, "zipf", padding_idx=1),     # long runs of equal indices
                     make_shape(3001, 64, 7, "zipf"),                    # v3: runs cut at chunk boundaries, vectors
                     make_shape(5, 16, 100003)]                          # rows no token hits: v3 writes their zeros

VOCAB = 50257  # GPT-2's
BENCH = [make_shape(t, 1024, VOCAB, d) for d in ("uniform", "zipf") for t in (4096, 16384, 65536)]
CPU_BENCH = [make_shape(t, 1024, VOCAB, d) for d in ("uniform", "zipf") for t in (1024, 4096)]
DT = (torch.float32, torch.bfloat16, torch.float64)

OPS = [
    Op(FAMILY, "forward", make_forward, embedding_ref,
       _versions(embedding, IDEAS_FWD)
       + [Version("torch", embedding_torch, "any", "F.embedding", baseline=True, takes_out=False, check=False,
                  graph=True)],
       CHECK, BENCH, CPU_BENCH, DT, nbytes=_bytes_fwd, formula=FORMULA_FWD, size_key="tokens",
       doc="out = weight[idx]"),
    Op(FAMILY, "backward", make_backward, embedding_backward_ref,
       _versions(embedding_backward, IDEAS_BWD)
       + [Version("torch", embedding_backward_torch, "any", "aten.embedding_dense_backward (autograd's)",
                  baseline=True, takes_out=False, check=False, graph=True)],
       CHECK_BWD, BENCH, CPU_BENCH, DT, nbytes=_bytes_bwd, formula=FORMULA_BWD, size_key="tokens",
       doc="dense grad_weight: grad_out rows added into the rows their indices name; padding_idx's row 0"),
]

register(Family(FAMILY, "Embedding: row gather forward, scatter-add and sorted deterministic backward", OPS,
                notebook="notebooks/09_embedding.ipynb"))
