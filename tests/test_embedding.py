"""Embedding: every version against the float64 reference (F.embedding; index_add_ for the backward) over odd sizes,
repeated indices, padding_idx and int32/int64 indices, poisoned outputs; the deterministic backward's bits across two
runs; the autograd.Function against F.embedding's gradients; and bad input gives errors that name it."""
import pytest
import torch
import torch.nn.functional as F

from lab import registry, verify
from lab.kernels import embedding as E
from lab.kernels._common import randn

from conftest import devices, needs_gpu

FAM = registry.get("embedding")


def _fwd_versions(device):
    return ["cpu"] if device == "cpu" else ["v1", "v2", "v3", "v4"]


_bwd_versions = _fwd_versions


def _rand(shape, dtype, device, seed):
    return randn(shape, dtype, device, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("op", [o.name for o in FAM.ops])
def test_every_version_matches_reference(op, device):
    verify.assert_op_passes(FAM.op(op), device)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("padding_idx", [None, 0, 4, -2])
def test_forward_is_an_exact_gather_and_keeps_the_padding_row(idx_dtype, padding_idx, device):
    # A gather moves bits: equal to F.embedding exactly, in every dtype; the padding row is gathered like any other.
    idx = torch.tensor([[4, 0, 4], [5, 1, 4]], dtype=idx_dtype, device=device)           # (2, 3)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        w = _rand((6, 10), dtype, device, 1)                                               # (V=6, dim=10)
        for v in _fwd_versions(device):
            got = E.embedding(idx, w, padding_idx, version=v)
            assert got.shape == (2, 3, 10)
            assert torch.equal(got, F.embedding(idx.long(), w, padding_idx)), (v, dtype)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
def test_backward_repeated_indices_and_padding(idx_dtype, device):
    # Row 2 is hit 4 times, row 0 (the padding row) twice, row 3 never: its gradient must be an exact 0 (the output is
    # poisoned with NaN first), and so must the padding row's.
    idx = torch.tensor([2, 0, 2, 1, 2, 0, 2], dtype=idx_dtype, device=device)            # (7,)
    g = _rand((7, 5), torch.float64, device, 2)                                            # (7, dim=5)
    want = E.embedding_backward_ref(g, idx, 4, 0)
    for v in _bwd_versions(device):
        out = torch.full((4, 5), float("nan"), dtype=torch.float64, device=device)
        got = E.embedding_backward(g, idx, 4, 0, version=v, out=out)
        assert got.data_ptr() == out.data_ptr()
        torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-14)
        assert torch.equal(got[0], torch.zeros(5, dtype=torch.float64, device=device))
        assert torch.equal(got[3], torch.zeros(5, dtype=torch.float64, device=device))
        # padding_idx=None: row 0 gets its two rows
        torch.testing.assert_close(E.embedding_backward(g, idx, 4, version=v), E.embedding_backward_ref(g, idx, 4),
                                   rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("device", devices())
def test_backward_in_token_order_is_exact_in_float32(device):
    # The CPU (and CUDA v2) add each row's terms in token order in fp32: the same bits as a Python loop doing so.
    idx = torch.tensor([1, 0, 1, 1, 0, 1], device=device)
    g = _rand((6, 3), torch.float32, device, 3)
    want = torch.zeros(2, 3, dtype=torch.float32)
    for t in range(6):
        want[int(idx[t])] += g[t].cpu()
    for v in (["cpu"] if device == "cpu" else ["v2"]):
        assert torch.equal(E.embedding_backward(g, idx, 2, version=v).cpu(), want), v


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_empty_indices(dtype, device):
    w = _rand((5, 4), dtype, device, 4)
    idx = torch.empty(0, 3, dtype=torch.int64, device=device)
    for v in _fwd_versions(device):
        assert E.embedding(idx, w, version=v).shape == (0, 3, 4)
    for v in _bwd_versions(device):
        gw = E.embedding_backward(torch.empty(0, 3, 4, dtype=dtype, device=device), idx, 5, version=v,
                                  out=torch.full((5, 4), float("nan"), dtype=dtype, device=device))
        assert torch.equal(gw, torch.zeros(5, 4, dtype=dtype, device=device)), v
        # an empty vocabulary too (v1's bf16 path once refused its empty fp32 buffer: cudaErrorInvalidValue)
        gw = E.embedding_backward(torch.empty(0, 3, 4, dtype=dtype, device=device), idx, 0, version=v)
        assert gw.shape == (0, 4), v


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_autograd_function_matches_f_embedding(dtype, device):
    idx = torch.tensor([[3, 1, 3, 0], [2, 3, 3, 1]], device=device)                        # (2, 4)
    w0 = _rand((5, 16), dtype, device, 5)
    wgt = _rand((2, 4, 16), torch.float32, device, 6)
    w64 = w0.double().requires_grad_()
    (F.embedding(idx, w64, 1).float() * wgt).sum().backward()
    for v in _bwd_versions(device):
        w = w0.clone().requires_grad_()
        y = E.apply_embedding(idx, w, 1, version=v)
        assert torch.equal(y.detach(), F.embedding(idx, w0, 1))
        (y.float() * wgt).sum().backward()
        verify.assert_close(w.grad, w64.grad, dtype, what=f"{v} grad_weight")


def test_deterministic_refuses_the_atomic_version():
    with pytest.raises(ValueError, match=r"version 'v1' adds with atomics \(not deterministic\)"):
        E.embedding_backward(torch.ones(2, 3), torch.tensor([0, 1]), 2, version="v1", deterministic=True)


# ---- CUDA only ----------------------------------------------------------------------------------------------------
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deterministic_backward_is_bit_for_bit_repeatable(dtype):
    # Zipf-like indices: hot rows get thousands of terms, where atomics' order shows in the last bits. v2 and v3 must
    # give the same bits on every run (and match the reference); the default under torch's deterministic mode is v3.
    s = E.make_shape(65536, 256, 5000, "zipf", padding_idx=7)
    grad, idx, V, pad = E.make_backward(s, dtype, "cuda", torch.Generator().manual_seed(8))
    bits = (lambda t: t.view(torch.int16)) if dtype == torch.bfloat16 else (lambda t: t.view(torch.int32))
    want = E.embedding_backward_ref(grad.double(), idx, V, pad)
    for v in ("v2", "v3", "v4"):
        a = E.embedding_backward(grad, idx, V, pad, version=v)
        for _ in range(3):
            b = E.embedding_backward(grad, idx, V, pad, version=v if v == "v2" else None, deterministic=True)
            assert torch.equal(bits(a), bits(b)), v
        verify.assert_close(a, want, dtype, what=v)


@needs_gpu
def test_forward_misaligned_views_take_the_scalar_path():
    # weight and out starting 4 bytes past a 16-byte boundary: v2 must not use 16-byte vectors on them
    base = _rand((50 * 64 + 1,), torch.float32, "cuda", 9)
    w = base[1:].view(50, 64)
    idx = torch.randint(0, 50, (33,), device="cuda")
    out = torch.empty(33 * 64 + 1, device="cuda")[1:].view(33, 64)
    got = E.embedding(idx, w, version="v2", out=out)
    assert torch.equal(got, F.embedding(idx, w))


@needs_gpu
def test_kernels_never_read_out_of_bounds_without_the_check():
    # check_indices=False: a bad index gives a NaN row (forward) or is skipped (backward), never a fault
    w = _rand((4, 8), torch.float32, "cuda", 10)
    idx = torch.tensor([0, 9, -3, 2], device="cuda")
    for v in ("v1", "v2", "v3", "v4"):
        y = E.embedding(idx, w, version=v, check_indices=False)
        torch.cuda.synchronize()
        assert y[1].isnan().all() and y[2].isnan().all() and torch.equal(y[0], w[0]) and torch.equal(y[3], w[2])
        gw = E.embedding_backward(torch.ones(4, 8, device="cuda"), idx, 4, version=v, check_indices=False)
        torch.cuda.synchronize()
        assert torch.equal(gw.sum(1).cpu(), torch.tensor([8.0, 0, 8, 0]))


@needs_gpu
def test_v3_names_the_first_bad_position_and_checks_nothing_under_capture():
    # forward v3 finds bad indices inside the gather: the error names the first bad token position and its value
    w = _rand((6, 8), torch.float32, "cuda", 12)
    idx = torch.tensor([[1, 2, 3], [4, 7, -1]], device="cuda")                          # (2, 3): flat 4 and 5 bad
    for v in ("v3", "v4"):
        with pytest.raises(ValueError, match=r"embedding: index out of range: idx.flatten\(\)\[4\] = 7, but "
                                             r"indices must be in \[0, num_embeddings\) = \[0, 6\)"):
            E.embedding(idx, w, version=v)
    for v in ("v3", "v4"):
        with pytest.raises(ValueError, match=r"embedding_backward: index out of range: idx contains -1 \(its "
                                             r"smallest\)"):
            E.embedding_backward(torch.ones(2, 3, 8, device="cuda"), idx, 6, version=v)
    with pytest.raises(ValueError, match=r"embedding_backward: index out of range: idx contains 7 \(its largest\)"):
        E.embedding_backward(torch.ones(2, 3, 8, device="cuda"), idx.clamp(min=0), 6, version="v4")
    # a capture cannot copy to the host: the check is skipped there, and the replay writes NaN rows for bad indices
    good = torch.tensor([[1, 2, 3], [4, 5, 0]], device="cuda")
    out = torch.empty(2, 3, 8, device="cuda")
    for _ in range(2):  # warm-up: build, allocator
        E.embedding(good, w, version="v3", out=out)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        E.embedding(good, w, version="v3", out=out)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, F.embedding(good, w))
    good.copy_(idx)
    g.replay()
    torch.cuda.synchronize()
    assert out[1, 1].isnan().all() and out[1, 2].isnan().all() and torch.equal(out[0], F.embedding(idx[0], w))


@needs_gpu
@pytest.mark.parametrize("v", ["v3", "v4"])
def test_v3_v4_backward_long_runs_and_wide_rows(v):
    # runs far longer than v3's chunk (64 tokens), starting off chunk boundaries, a padding row inside a long run's
    # chunk, odd dims (scalar path) and a dim that needs two column tiles of vectors
    g = torch.Generator().manual_seed(13)
    for tokens, dim, vocab, pad in ((1000, 33, 3, None), (4099, 1028, 9, 2), (130, 8, 2, 0), (64, 4, 1, None)):
        idx = torch.randint(0, vocab, (tokens,), generator=g)
        idx[: tokens // 3] = vocab - 1                                                       # one run of ~tokens/3
        idx = idx[torch.randperm(tokens, generator=g)].cuda()
        grad = randn((tokens, dim), torch.float32, "cuda", g)                                # (tokens, dim)
        got = E.embedding_backward(grad, idx, vocab, pad, version=v,
                                   out=torch.full((vocab, dim), float("nan"), device="cuda"))
        verify.assert_close(got, E.embedding_backward_ref(grad.double(), idx, vocab, pad), torch.float32,
                            what=f"{v} tokens={tokens} dim={dim} vocab={vocab}")


@needs_gpu
def test_baselines_compute_the_same_function():
    for op in ("forward", "backward"):
        o = FAM.op(op)
        inputs = o.make_inputs(E.make_shape(101, 40, 97, "zipf", padding_idx=3), torch.bfloat16, "cuda",
                               torch.Generator().manual_seed(11))
        verify.assert_close(o.version("torch").fn(*inputs), o.reference(*verify.upcast(inputs)), torch.bfloat16,
                            what=op)


@needs_gpu
def test_mismatched_devices_are_refused():
    w = torch.randn(5, 4, device="cuda")
    with pytest.raises(ValueError, match=r"idx must be on the same device as weight \(cuda:0\), got cpu"):
        E.embedding(torch.tensor([0, 1]), w)
    with pytest.raises(ValueError, match=r"idx must be on the same device as grad_out \(cuda:0\), got cpu"):
        E.embedding_backward(torch.ones(2, 4, device="cuda"), torch.tensor([0, 1]), 5)


# ---- bad input ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", devices())
def test_bad_input_names_the_argument(device):
    v = "v2" if device == "cuda" else "cpu"
    w = torch.randn(5, 4, device=device)
    idx = torch.tensor([0, 3, 1], device=device)
    g = torch.randn(3, 4, device=device)
    oor = r"index out of range: idx.flatten\(\)\[1\] = 5, but" if device == "cpu" else r"index out of range: idx contains 5"
    with pytest.raises(ValueError, match=oor + r".*indices must be in \[0, num_embeddings\) = \[0, 5\)"):
        E.embedding(torch.tensor([0, 5, 1], device=device), w, version=v)
    with pytest.raises(ValueError, match=r"embedding_backward: index out of range"):
        E.embedding_backward(g, torch.tensor([0, 5, 1], device=device), 5, version=v)
    with pytest.raises(ValueError, match=r"index out of range: .*-1.*a negative index does not count from the end"):
        E.embedding(torch.tensor([0, -1, 1], device=device), w, version=v)
    with pytest.raises(ValueError, match=r"index out of range: .*-2"):
        E.embedding_backward(g, torch.tensor([-2, 1, 1], dtype=torch.int32, device=device), 5, version=v)
    with pytest.raises(TypeError, match=r"idx must be an integer tensor \(Long or Int\), got Float"):
        E.embedding(idx.float(), w, version=v)
    with pytest.raises(TypeError, match=r"idx must be an integer tensor \(Long or Int\), got Short"):
        E.embedding_backward(g, idx.short(), 5, version=v)
    with pytest.raises(ValueError, match=r"weight must be 2-D \(num_embeddings, dim\), got 1-D tensor of shape \(5,\)"):
        E.embedding(idx, torch.randn(5, device=device), version=v)
    with pytest.raises(TypeError, match=r"weight must be Float or BFloat16 or Double, got Half"):
        E.embedding(idx, w.half(), version=v)
    with pytest.raises(ValueError, match=r"weight must be contiguous"):
        E.embedding(idx, torch.randn(4, 5, device=device).t(), version=v)
    with pytest.raises(ValueError, match=r"padding_idx must be within num_embeddings: in \[-5, 5\), got 5"):
        E.embedding(idx, w, 5, version=v)
    with pytest.raises(ValueError, match=r"padding_idx must be within num_embeddings: in \[-5, 5\), got -6"):
        E.embedding_backward(g, idx, 5, -6, version=v)
    with pytest.raises(TypeError, match=r"padding_idx must be an int or None, got float"):
        E.embedding(idx, w, 1.0, version=v)
    with pytest.raises(ValueError, match=r"out must have shape idx.shape \+ \(dim,\) = \(3, 4\), got \(3, 5\)"):
        E.embedding(idx, w, version=v, out=torch.empty(3, 5, device=device))
    with pytest.raises(ValueError, match=r"grad_out must have shape idx.shape \+ \(dim,\) with idx.shape = \(3,\), "
                                         r"got \(4, 4\)"):
        E.embedding_backward(torch.randn(4, 4, device=device), idx, 5, version=v)
    with pytest.raises(ValueError, match=r"grad_weight must have shape \(num_embeddings, dim\) = \(5, 4\), got \(6, 4\)"):
        E.embedding_backward(g, idx, 5, version=v, out=torch.empty(6, 4, device=device))
    with pytest.raises(TypeError, match=r"grad_weight must have the same dtype as the input \(Float\), got Double"):
        E.embedding_backward(g, idx, 5, version=v, out=torch.empty(5, 4, dtype=torch.float64, device=device))
    with pytest.raises(ValueError, match=r"embedding: weight requires grad, but this kernel has no backward.*apply_embedding"):
        E.embedding(idx, w.clone().requires_grad_(), version=v)


def test_mismatched_devices_on_cpu_build_are_named():
    # without a GPU: a "meta" idx beside a CPU weight still gets the device check, not a crash
    w = torch.randn(5, 4)
    with pytest.raises(ValueError, match=r"idx must be on the same device as weight \(cpu\), got meta"):
        E.embedding(torch.empty(3, dtype=torch.int64, device="meta"), w, version="cpu")


def test_cuda_version_on_cpu_tensor_is_refused():
    with pytest.raises(ValueError, match=r"version 2 is a CUDA kernel but weight is on the CPU"):
        E.embedding(torch.tensor([0]), torch.randn(2, 3), version="v2")


@pytest.mark.parametrize("device", devices())
def test_out_sharing_memory_with_an_input_is_refused(device):
    """The forward's out must not be rows of the weight it gathers from, nor the backward's gradient the grad_out it
    adds up: refused by name, for every version (an aliased gather reads rows it has already overwritten)."""
    w = _rand((6, 8), torch.float32, device, 13)                                 # (num_embeddings, dim)
    idx = torch.tensor([5, 0, 3, 3, 1], device=device)                           # (tokens,)
    for v in _fwd_versions(device):
        with pytest.raises(ValueError, match=r"out shares memory with weight: the kernel reads weight while it"):
            E.embedding(idx, w, version=v, out=w[:5])
    buf = _rand((6 * 8,), torch.float32, device, 14)
    for v in _bwd_versions(device):
        with pytest.raises(ValueError, match=r"grad_weight shares memory with grad_out"):
            E.embedding_backward(buf[:40].view(5, 8), idx, 6, version=v, out=buf.view(6, 8))
