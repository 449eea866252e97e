"""RoPE: every version against the float64 rotate_half reference (both layouts, both pairings, odd head_dims, offsets,
several seeds, poisoned outputs); the relative-position property; interleaved = half-split after a permutation of the
features; the autograd.Function (gradcheck in float64, gradients through non-contiguous upstream grads); and bad
input gives errors that name the argument."""
import pytest
import torch

from lab import registry, verify
from lab.kernels import rope as R
from lab.kernels._common import randn

from conftest import devices, needs_gpu

FAM = registry.get("rope")


def _versions(device):
    return ["cpu"] if device == "cpu" else ["v1", "v2", "v3"]


def _rand(shape, dtype, device, seed):
    return randn(shape, dtype, device, torch.Generator().manual_seed(seed))


def _f64(*ts):
    return [t.double() if isinstance(t, torch.Tensor) else t for t in ts]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("op", [o.name for o in FAM.ops])
def test_every_version_matches_reference(op, device):
    verify.assert_op_passes(FAM.op(op), device)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("tables", ["float32", "same"])
def test_arbitrary_tables_in_either_dtype(dtype, tables, device):
    # Tables of random numbers, not rotations: a swapped cos/sin, a wrong sign or a neighbouring table row all show.
    # Tables in float32 or in the tensors' dtype; k with fewer heads than q (grouped-query attention).
    tdt = torch.float32 if tables == "float32" else dtype
    for layout in ("bhsd", "bshd"):
        for interleaved in (False, True):
            for seed, (b, h, kv, s, d, off) in enumerate([(2, 5, 2, 11, 48, 7), (1, 3, 3, 4, 16, 0),
                                                          (3, 4, 1, 6, 10, 2)]):
                dims = (lambda n: (b, n, s, d)) if layout == "bhsd" else (lambda n: (b, s, n, d))
                q, k = _rand(dims(h), dtype, device, seed), _rand(dims(kv), dtype, device, seed + 100)
                cos, sin = _rand((off + s + 2, d // 2), tdt, device, seed + 200), \
                    _rand((off + s + 2, d // 2), tdt, device, seed + 300)
                ref = R.rope_qk_ref(*_f64(q, k, cos, sin), off, layout, interleaved)
                for v in _versions(device):
                    got = R.rope_qk(q, k, cos, sin, off, layout, interleaved, version=v)
                    verify.assert_close(got, ref, dtype, what=f"{v} {layout} interleaved={interleaved} {(b, h, s, d)}")
                    one = R.rope(q, cos, sin, off, layout, interleaved, version=v)
                    verify.assert_close(one, ref[0], dtype, what=f"{v} rope(q)")


@pytest.mark.parametrize("device", devices())
def test_dot_product_depends_only_on_relative_position(device):
    # <rope(q, m), rope(k, n)> = <q, R(theta (n - m)) k>: a function of n - m alone. Float64 end to end, so the spread
    # across absolute positions is rounding (~1e-15), and a wrong angle, sign or pairing would show at 1e-1.
    d = 64
    cos, sin = R.rope_tables(200, d, dtype=torch.float64, device=device)
    q = _rand((1, 1, 1, d), torch.float64, device, 1)
    k = _rand((1, 1, 1, d), torch.float64, device, 2)
    for v in _versions(device):
        for interleaved in (False, True):
            def at(x, p):
                return R.rope(x, cos, sin, offset=p, interleaved=interleaved, version=v)

            by_delta = {}
            for delta in (-9, -1, 0, 1, 5, 40):
                ms = range(max(0, -delta), max(0, -delta) + 150, 13)
                dots = torch.stack([(at(q, m) * at(k, m + delta)).sum() for m in ms])
                spread = float((dots - dots[0]).abs().max())
                assert spread < 1e-12 * max(1.0, float(dots.abs().max())), \
                    f"{v} interleaved={interleaved}: dot products at n - m = {delta} vary by {spread:.2e}"
                by_delta[delta] = float(dots[0])
            # ... and it does depend on n - m (else the test above could not fail)
            vals = sorted(by_delta.values())
            assert min(b - a for a, b in zip(vals, vals[1:])) > 1e-6, by_delta
            # at n = m the rotation cancels: the plain dot product
            assert abs(by_delta[0] - float((q * k).sum())) < 1e-12


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_interleaved_equals_half_split_after_permuting_features(dtype, device):
    # Interleaved pair i is features (2i, 2i+1); half-split pair i is (i, i + D/2). Moving feature 2i to i and 2i+1
    # to i + D/2 (perm) turns one convention into the other: rope_half(x[..., perm]) = rope_interleaved(x)[..., perm].
    d = 40
    perm = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2))).to(device)
    cos, sin = R.rope_tables(50, d, device=device)
    x = _rand((2, 3, 17, d), dtype, device, 3)
    r_half = R.rope_ref(*_f64(x[..., perm], cos, sin), 5)
    r_int = R.rope_ref(*_f64(x, cos, sin), 5, "bhsd", True)
    torch.testing.assert_close(r_half, r_int[..., perm], rtol=1e-14, atol=1e-14)
    for v in _versions(device):
        a = R.rope(x[..., perm].contiguous(), cos, sin, 5, version=v)
        b = R.rope(x, cos, sin, 5, interleaved=True, version=v)[..., perm]
        # the same arithmetic on the same pairs: equal up to how the compiler contracted a*c - b*s into FMAs
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", devices())
def test_backward_undoes_forward(device):
    # rotation by -angle after rotation by +angle is the identity (the backward is the inverse rotation)
    cos, sin = R.rope_tables(70, 96, dtype=torch.float64, device=device)
    x = _rand((2, 9, 4, 96), torch.float64, device, 4)
    for v in _versions(device):
        for interleaved in (False, True):
            y = R.rope(x, cos, sin, 60, "bshd", interleaved, version=v)
            assert (y - x).abs().max() > 0.1
            back = R.rope_backward(y, cos, sin, 60, "bshd", interleaved, version=v)
            torch.testing.assert_close(back, x, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("device", devices())
def test_prefill_equals_decode_steps(device):
    # Rotating a whole sequence at once = rotating token s alone at offset s (decoding with a cache).
    cos, sin = R.rope_tables(40, 32, device=device)
    q = _rand((2, 4, 13, 32), torch.float32, device, 5)
    k = _rand((2, 2, 13, 32), torch.float32, device, 6)
    for v in _versions(device):
        fq, fk = R.rope_qk(q, k, cos, sin, version=v)
        for s in range(13):
            sq, sk = R.rope_qk(q[:, :, s:s + 1].contiguous(), k[:, :, s:s + 1].contiguous(), cos, sin, s, version=v)
            torch.testing.assert_close(sq, fq[:, :, s:s + 1], rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(sk, fk[:, :, s:s + 1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("layout,interleaved", [("bhsd", False), ("bshd", True)])
def test_autograd_function_gradcheck(layout, interleaved, device):
    cos, sin = R.rope_tables(12, 8, dtype=torch.float64, device=device)
    dims = (lambda n: (2, n, 5, 8)) if layout == "bhsd" else (lambda n: (2, 5, n, 8))
    q = _rand(dims(3), torch.float64, device, 7).requires_grad_()
    k = _rand(dims(1), torch.float64, device, 8).requires_grad_()
    for v in _versions(device):
        assert torch.autograd.gradcheck(lambda a, b: R.apply_rope(a, b, cos, sin, 4, layout, interleaved, v), (q, k))
        assert torch.autograd.gradcheck(lambda a: R.apply_rope(a, None, cos, sin, 4, layout, interleaved, v), (q,))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_autograd_gradients_match_float64_autograd(dtype, device):
    # Upstream gradients arrive transposed (non-contiguous); the Function must still rotate them correctly.
    cos, sin = R.rope_tables(30, 64, device=device)
    q0 = _rand((2, 4, 9, 64), dtype, device, 9)
    k0 = _rand((2, 2, 9, 64), dtype, device, 10)
    wq = _rand((2, 9, 4, 64), torch.float32, device, 11)
    wk = _rand((2, 9, 2, 64), torch.float32, device, 12)

    def loss(qr, kr):
        return (qr.transpose(1, 2).float() * wq).sum() + (kr.transpose(1, 2).float() * wk).sum()

    q64, k64 = q0.double().requires_grad_(), k0.double().requires_grad_()
    loss(*R.rope_qk_ref(q64, k64, cos.double(), sin.double(), 3)).backward()
    for v in _versions(device):
        q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
        qr, kr = R.apply_rope(q, k, cos, sin, 3, version=v)
        verify.assert_close((qr, kr), R.rope_qk_ref(*_f64(q0, k0, cos, sin), 3), dtype, what=f"{v} forward")
        loss(qr, kr).backward()
        verify.assert_close((q.grad, k.grad), (q64.grad, k64.grad), dtype, what=f"{v} gradients")


# ---- CUDA only ----------------------------------------------------------------------------------------------------
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_rows_per_thread_on_a_full_grid(dtype):
    # Shapes big enough that the launcher's own choice would be 4 heads per thread; force each choice, with head
    # counts that leave partial chunks (13 and 3 are not multiples of 2, 4 or 8).
    for layout in ("bhsd", "bshd"):
        dims = (lambda n: (4, n, 700, 128)) if layout == "bhsd" else (lambda n: (4, 700, n, 128))
        q, k = _rand(dims(13), dtype, "cuda", 13), _rand(dims(3), dtype, "cuda", 14)
        cos, sin = R.rope_tables(800, 128, device="cuda")
        for interleaved in (False, True):
            ref = R.rope_qk_ref(*_f64(q, k, cos, sin), 77, layout, interleaved)
            for v in ("v2", "v3"):
                for rows in (0, 1, 2, 4, 8):
                    got = R.rope_qk(q, k, cos, sin, 77, layout, interleaved, version=v, rows_per_thread=rows)
                    verify.assert_close(got, ref, dtype, what=f"{v} rows={rows} {layout} interleaved={interleaved}")


@needs_gpu
@pytest.mark.parametrize("version", ["v1", "v2", "v3"])
def test_misaligned_views_take_the_scalar_path(version):
    # Views that start 4 bytes past a 16-byte boundary: v2/v3 must fall back to v1's path, not fault or misread.
    shape, n = (2, 3, 7, 64), 2 * 3 * 7 * 64
    base = _rand((2 * n + 2,), torch.float32, "cuda", 15)
    q, k = base[1:n + 1].view(shape), base[n + 2:].view(shape)
    tbase = _rand((2 * 20 * 32 + 1,), torch.float32, "cuda", 16)
    cos, sin = tbase[1:641].view(20, 32), tbase[641:].view(20, 32)
    outs = (torch.empty(n + 1, device="cuda")[1:].view(shape), torch.empty(n + 1, device="cuda")[1:].view(shape))
    got = R.rope_qk(q, k, cos, sin, 9, out=outs, version=version)
    verify.assert_close(got, R.rope_qk_ref(*_f64(q, k, cos, sin), 9), torch.float32)


@needs_gpu
def test_baselines_compute_the_same_function():
    # the timed baselines must be right too (they are not part of verify.check_op)
    for op, shape in (("rope", R.make_shape(2, 4, 33, 64, 5, "bshd")),
                      ("rope_qk", R.make_shape(2, 4, 9, 32, kv_heads=2)),
                      ("rope_bwd", R.make_shape(1, 3, 17, 64, 2, "bhsd", "interleaved"))):
        o = FAM.op(op)
        inputs = o.make_inputs(shape, torch.bfloat16, "cuda", torch.Generator().manual_seed(17))
        ref = o.reference(*verify.upcast(inputs))
        for name in ("torch", "torch.compile"):
            verify.assert_close(o.version(name).fn(*inputs), ref, torch.bfloat16, what=f"{op} {name}")


# ---- bad input ------------------------------------------------------------------------------------------------
def test_apply_rope_refuses_table_gradients():
    cos, sin = R.rope_tables(8, 8)
    x = torch.randn(1, 1, 8, 8)
    with pytest.raises(ValueError, match=r"cos and sin are treated as constants"):
        R.apply_rope(x, None, cos.requires_grad_(), sin)


@pytest.mark.parametrize("device", devices())
def test_bad_input_names_the_argument(device):
    v = "v3" if device == "cuda" else "cpu"
    x = torch.randn(2, 3, 5, 8, device=device)
    cos, sin = R.rope_tables(5, 8, device=device)
    with pytest.raises(ValueError, match=r"head_dim = x.size\(3\) must be even \(features rotate in pairs\), got 7"):
        R.rope(torch.randn(2, 3, 5, 7, device=device), cos, sin, version=v)
    with pytest.raises(ValueError, match=r"cos/sin have 5 positions \(rows\), but positions 3 .. 7 are needed "
                                         r"\(offset \+ seq = 3 \+ 5 = 8\)"):
        R.rope(x, cos, sin, offset=3, version=v)
    with pytest.raises(ValueError, match=r"cos/sin have 5 positions"):
        R.rope(torch.randn(2, 6, 3, 8, device=device), cos, sin, layout="bshd", offset=0, version=v)  # seq = 6
    with pytest.raises(ValueError, match=r"offset must be >= 0, got -1"):
        R.rope(x[:, :, :4].contiguous(), cos, sin, offset=-1, version=v)
    with pytest.raises(TypeError, match=r"k must have the same dtype as q \(Float\), got BFloat16"):
        R.rope_qk(x, x.bfloat16(), cos, sin, version=v)
    with pytest.raises(TypeError, match=r"cos must be Float or the dtype of x \(BFloat16\), got Half"):
        R.rope(x.bfloat16(), cos.half(), sin.half(), version=v)
    with pytest.raises(TypeError, match=r"sin must have the same dtype as cos \(Float\), got Double"):
        R.rope(x, cos, sin.double(), version=v)
    with pytest.raises(TypeError, match=r"x must be Float or Half or BFloat16 or Double, got Int"):
        R.rope(torch.ones(2, 3, 5, 8, dtype=torch.int32, device=device), cos, sin, version=v)
    with pytest.raises(ValueError, match=r"cos must have shape \(max_pos, head_dim / 2\) with head_dim / 2 = 4, "
                                         r"got \(5, 8\) \(a \(max_pos, head_dim\) rotate_half table"):
        R.rope(x, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1), version=v)
    with pytest.raises(ValueError, match=r"sin must have the same shape as cos = \(5, 4\), got \(4, 4\)"):
        R.rope(x, cos, sin[:4], version=v)
    with pytest.raises(ValueError, match=r"layout must be 'bhsd' \(batch, heads, seq, head_dim\) or 'bshd' "
                                         r"\(batch, seq, heads, head_dim\), got 'bsdh'"):
        R.rope(x, cos, sin, layout="bsdh", version=v)
    with pytest.raises(ValueError, match=r"k must have shape \(batch, kv_heads, seq, head_dim\) with batch = 2, "
                                         r"seq = 5, head_dim = 8 as in q, got \(2, 3, 4, 8\)"):
        R.rope_qk(x, x[:, :, :4].contiguous(), cos, sin, version=v)
    with pytest.raises(ValueError, match=r"x must be 4-D \(batch, heads, seq, head_dim\), got 3-D"):
        R.rope(x[0], cos, sin, version=v)
    with pytest.raises(ValueError, match=r"x must be contiguous"):
        R.rope(torch.randn(2, 5, 3, 8, device=device).transpose(1, 2), cos, sin, version=v)
    with pytest.raises(ValueError, match=r"out must have shape \(batch, heads, seq, head_dim\) = \(2, 3, 5, 8\), "
                                         r"got \(2, 3, 5, 9\)"):
        R.rope(x, cos, sin, out=torch.empty(2, 3, 5, 9, device=device), version=v)
    with pytest.raises(TypeError, match=r"k_out must have the same dtype as the input"):
        R.rope_qk(x, x, cos, sin, out=(torch.empty_like(x), torch.empty_like(x).double()), version=v)
    with pytest.raises(ValueError, match=r"rows_per_thread must be 1, 2, 4, 8 or 0 \(choose\), got 3"):
        R.rope(x, cos, sin, version=v, rows_per_thread=3)
    with pytest.raises(ValueError, match=r"head_dim must be even"):
        R.rope_tables(10, 7)


def test_cuda_version_on_cpu_tensor_is_refused():
    cos, sin = R.rope_tables(5, 8)
    with pytest.raises(ValueError, match=r"version 2 is a CUDA kernel but x is on the CPU"):
        R.rope(torch.randn(1, 1, 5, 8), cos, sin, version="v2")


@needs_gpu
def test_tables_on_another_device_are_refused():
    cos, sin = R.rope_tables(5, 8)
    with pytest.raises(ValueError, match=r"cos must be on the same device as x \(cuda:0\), got cpu"):
        R.rope(torch.randn(1, 1, 5, 8, device="cuda"), cos, sin)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cpu_half_conversions_are_torchs_bit_for_bit(dtype):
    """The CPU unit converts fp16/bf16 without torch headers (cpp_src/lab_half.h). Every 16-bit pattern goes through
    it: x0 * cos - 0 * sin with sin = 0 is one widening, a float multiply and one rounding, which must give the bits
    torch's own conversion gives (NaN only as NaN: payloads may differ)."""
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    x0 = bits.view(dtype)                                            # (65536,) every pattern, NaN and Inf included
    n = x0.numel()
    x = torch.zeros(1, 1, n, 2, dtype=dtype)                          # (batch, heads, seq, head_dim=2): pairs (x0, 0)
    x[..., 0] = x0
    g = torch.Generator().manual_seed(0)
    for cos in (torch.ones(n, 1), torch.rand(n, 1, generator=g) * 2 - 1):   # the round trip, then a rounding
        sin = torch.zeros(n, 1)
        y0 = R.rope(x, cos, sin, version="cpu")[0, 0, :, 0]
        want = (x0.float() * cos[:, 0]).to(dtype)
        nan = want.isnan()
        assert torch.equal(y0.isnan(), nan)
        assert torch.equal(y0[~nan].view(torch.int16), want[~nan].view(torch.int16))


def test_eager_baseline_is_written_as_models_write_it():
    """The eager baseline casts the tables to the activations' dtype first (as Hugging Face's rotary module returns
    them): bf16 arithmetic on bf16 inputs, not fp32 promotion (which timed 14x slower than a user's code)."""
    x = _rand((2, 3, 5, 8), torch.bfloat16, "cpu", 0)
    cos, sin = R.rope_tables(16, 8)
    c = torch.cat((cos[:5], cos[:5]), dim=-1).to(torch.bfloat16)
    s = torch.cat((sin[:5], sin[:5]), dim=-1).to(torch.bfloat16)
    want = x * c + R.rotate_half(x) * s                                  # the usual form, all in bf16
    got = R.rope_torch(x, cos, sin)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


@pytest.mark.parametrize("device", devices())
def test_in_place_is_exact_and_other_sharing_is_refused(device):
    """A thread reads a pair and writes the same pair, so out = x itself (in place, as a KV-cache update does it)
    gives the out-of-place answer, bit for bit; an out that overlaps x without being it, or that overlaps the other
    tensor or a table, is refused by name."""
    cos, sin = R.rope_tables(40, 32, device=device)
    for v in _versions(device):
        for interleaved in (False, True):
            x = _rand((2, 3, 17, 32), torch.bfloat16, device, 7)          # (batch, heads, seq, head_dim)
            want = R.rope(x, cos, sin, 4, interleaved=interleaved, version=v)
            got = R.rope(x, cos, sin, 4, interleaved=interleaved, out=x, version=v)
            assert got.data_ptr() == x.data_ptr()
            assert torch.equal(x, want), (v, interleaved)
        q, k = _rand((2, 4, 13, 32), torch.float32, device, 8), _rand((2, 2, 13, 32), torch.float32, device, 9)
        want_q, want_k = R.rope_qk(q, k, cos, sin, version=v)
        R.rope_qk(q, k, cos, sin, out=(q, k), version=v)
        assert torch.equal(q, want_q) and torch.equal(k, want_k), v
        flat = torch.randn(2 * 3 * 17 * 32 + 1, device=device)
        x, shifted = flat[:-1].view(2, 3, 17, 32), flat[1:].view(2, 3, 17, 32)
        with pytest.raises(ValueError, match=r"out overlaps x without being exactly it"):
            R.rope(x, cos, sin, out=shifted, version=v)
        q1, k1 = q[:1].clone(), k[:1].clone()                               # batch 1: q1[:, :2] is contiguous
        with pytest.raises(ValueError, match=r"k_out shares memory with q"):
            R.rope_qk(q1, k1, cos, sin, out=(torch.empty_like(q1), q1[:, :2]), version=v)
        with pytest.raises(ValueError, match=r"out shares memory with cos"):   # cos: (40, 16), 640 floats
            R.rope(q1[:, :1], cos, sin, out=cos.view(-1)[:13 * 32].view(1, 1, 13, 32), version=v)
