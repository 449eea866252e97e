"""Kronecker layer: every version against the float64 reference and against the explicit torch.kron product; gradients
by gradcheck and against the torch baseline; every CUDA block configuration and v2 slice width; the backward writes
every output; bad input gives errors that say what is wrong."""
import math

import pytest
import torch

from lab import registry, verify
from lab.kernels import kron as K

from conftest import devices, needs_gpu

FAM = registry.get("kron")
SMALL = ["2x3", "5x7", "3x4x5", "1x6", "9", "2x3x2x5", "13x17", "8x16x32"]


def _inputs(batch, factors, dtype, device, seed=0):
    return K.make_forward_inputs({"batch": batch, "factors": factors}, dtype, torch.device(device),
                                 torch.Generator().manual_seed(seed))


def _versions(device):
    return ["torch", "torch.bmm", "torch.kron"] + (["v1", "v2", "v6"] if device == "cuda" else ["cpu"])


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("op", [o.name for o in FAM.ops])
def test_every_version_matches_reference(op, device):
    verify.assert_op_passes(FAM.op(op), device, seeds=(0, 1))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("factors", SMALL)
def test_convention_is_x_times_kron_of_reversed_factors(factors, device):
    # y = x @ (W_K ⊗ … ⊗ W_1), factors listed as [W_1, …, W_K]: the reference and every version, in float64
    x, *ws = _inputs(3, factors, torch.float64, "cpu", seed=5)
    m = K.kron_full_matrix(ws)
    assert m.shape == (x.shape[1], x.shape[1])
    expect = x @ m
    torch.testing.assert_close(K.kron_ref(x, *ws), expect, rtol=1e-12, atol=1e-12)
    xd, wd = x.to(device), [w.to(device) for w in ws]
    for v in _versions(device):
        verify.assert_close(K.kron(xd, wd, v), expect, torch.float64, what=f"{v} {factors}")


def test_convention_by_hand():
    # two factors, worked by hand: x viewed as (f_2, f_1); y = W_2ᵀ · X · W_1
    g = torch.Generator().manual_seed(1)
    w1, w2 = torch.randn(3, 3, generator=g, dtype=torch.float64), torch.randn(2, 2, generator=g, dtype=torch.float64)
    x = torch.randn(4, 6, generator=g, dtype=torch.float64)
    expect = torch.stack([(w2.T @ xb.view(2, 3) @ w1).flatten() for xb in x])
    torch.testing.assert_close(K.kron(x, [w1, w2], "cpu"), expect, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x @ torch.kron(w2, w1), expect, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("version", ["cpu", "v1", "v2", "v6"])
@pytest.mark.parametrize("factors", ["2x3", "3x2x2", "4x1x3", "2x2x2x2", "5x7"])
def test_gradcheck(version, factors, device):
    if (version == "cpu") != (device == "cpu"):
        pytest.skip(f"{version} does not run on {device}")
    x, *ws = _inputs(2, factors, torch.float64, device, seed=2)
    args = [t.detach().requires_grad_() for t in (x, *ws)]
    assert torch.autograd.gradcheck(lambda x, *w: K.kron(x, w, version), args, eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch,factors", [(4, "32x32"), (3, "8x16x32"), (2, "12x20"), (3, "13x17"), (2, "2x3x2x5")])
def test_gradients_match_torch(batch, factors, dtype, device):
    x, *ws = _inputs(batch, factors, dtype, device, seed=3)
    gy = torch.randn(x.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64).to(dtype).to(device)
    ref = K._train("torch")(x.double(), gy.double(), *[w.double() for w in ws])
    for v in ["cpu"] if device == "cpu" else ["v1", "v2", "v6"]:
        got = K._train(v)(x, gy, *ws)
        for name, a, b in zip(["y", "dx"] + [f"dW{k + 1}" for k in range(len(ws))], got, ref):
            verify.assert_close(a, b, dtype, what=f"{v} {name}")


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("factors", ["3x4x5", "32x32", "1x6", "7"])
def test_backward_writes_every_output(factors, device):
    # outputs poisoned with NaN: an element the backward forgets to write fails
    x, *ws = _inputs(3, factors, torch.float32, device, seed=6)
    version = "cpu" if device == "cpu" else "v1"
    states = [torch.full_like(x, math.nan) for _ in ws[1:]]
    y = K.forward(x, ws, version=version, states=states)
    gy = torch.randn(tuple(y.shape), generator=torch.Generator().manual_seed(16)).to(device)
    dx, dws = K.backward(gy, x, ws, states, torch.full_like(x, math.nan), [torch.full_like(w, math.nan) for w in ws],
                         version=version)
    args = [t.double() for t in (x, gy, *ws)]
    ref = K.train_ref(*args)
    # held to each element's root-sum-square of terms (the op's scale): a 1x1 factor's dW is one sum of B·N products
    # that may cancel (with an unseeded dy it once landed at 2.9e-5 of its own small value, against 2e-5)
    scale = verify.root_sum_square(K.train_ref)(*args)
    for name, a, b, sc in zip(["y", "dx"] + [f"dW{k + 1}" for k in range(len(ws))], [y, dx, *dws], ref, scale):
        verify.assert_close(a, b, torch.float32, what=name, scale=sc)


@pytest.mark.parametrize("device", devices())
def test_states_are_the_intermediate_products(device):
    # states[k-1] = x with W_K, …, W_{k+1} applied (F_k of cuda_src/kron/kron.cuh), in the layout
    # (i_k … i_1, j_K … j_{k+1})
    x, *ws = _inputs(2, "3x4x5", torch.float64, device, seed=7)
    versions = ["cpu"] if device == "cpu" else ["v1", "v2"]
    f1, f2, f3 = 3, 4, 5
    xs = x.cpu().view(2, f3, f2, f1)
    F2 = torch.einsum("bcij,cn->bijn", xs, ws[2].cpu())            # (i2, i1, j3)
    F1 = torch.einsum("bijn,im->bjnm", F2, ws[1].cpu())           # (i1, j3, j2)
    for v in versions:
        states = [torch.full_like(x, math.nan) for _ in range(2)]
        K.forward(x, ws, version=v, states=states)
        torch.testing.assert_close(states[1].cpu(), F2.reshape(2, -1), rtol=1e-12, atol=1e-12, msg=v)
        torch.testing.assert_close(states[0].cpu(), F1.reshape(2, -1), rtol=1e-12, atol=1e-12, msg=v)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch,factors", [(3, "128x128"), (5, "13x17"), (2, "8x16x32"), (4, "32x32"), (3, "3x4x5"),
                                           (1, "64x64x64"), (6, "12x20")])
def test_v2_every_configuration_and_slice_width(batch, factors, dtype):
    x, *ws = _inputs(batch, factors, dtype, "cuda", seed=8)
    ref = K.kron_ref(x.double(), *[w.double() for w in ws])
    fK = K.parse_factors(factors)[-1]
    tried = 0
    for cfg in range(3):
        for cols in sorted({4, 8, 12, 16, 32, 64, (fK + 3) // 4 * 4}):
            if cols > (fK + 3) // 4 * 4:
                continue
            p = K.plan(batch, factors, dtype, "cuda", cfg, cols)
            if not p["fits"]:
                continue
            tried += 1
            states = [torch.full_like(x, math.nan) for _ in ws[1:]]
            out = K.forward(x, ws, out=torch.full_like(x, math.nan), version="v2", states=states, cfg=cfg, cols=cols)
            verify.assert_close(out, ref, dtype, what=f"v2 cfg={cfg} c={cols}")
            if states:  # the saved states must be complete too (every slice writes its columns)
                cpu_states = [torch.empty_like(s, device="cpu") for s in states]
                K.forward(x.cpu(), [w.cpu() for w in ws], version="cpu", states=cpu_states)
                for s, c in zip(states, cpu_states):
                    verify.assert_close(s, c.double(), dtype, what=f"v2 state cfg={cfg} c={cols}")
    if not tried:  # nothing fits in shared memory (fp64 64x64x64: one W_K column slice is too big): v2 runs v1
        assert not K.plan(batch, factors, dtype, "cuda")["fits"]
        assert dtype == torch.float64 and factors == "64x64x64", f"no (cfg, c) fits for {factors} {dtype}"
        verify.assert_close(K.forward(x, ws, out=torch.full_like(x, math.nan), version="v2"), ref, dtype, what="v2")


# v6: two factors in strict fp32. Every slice width it plans, on shapes where it applies (f_1 = 96 and 192: 6 and 12
# warps, not powers of two; f_1 < f_2 and f_1 > f_2; one slice a sample; batches 1 and 300), out and the saved state
# poisoned; and where it does not (K != 2, a factor not a multiple of 4, float64): it runs v2, with the same answer.
@needs_gpu
@pytest.mark.parametrize("batch,factors", [(3, "128x128"), (1, "128x128"), (300, "128x128"), (5, "96x64"),
                                           (2, "64x128"), (4, "192x32"), (7, "32x32"), (3, "16x64")])
def test_v6_every_slice_width(batch, factors):
    x, *ws = _inputs(batch, factors, torch.float32, "cuda", seed=11)
    ref = K.kron_ref(x.double(), *[w.double() for w in ws])
    f1, f2 = K.parse_factors(factors)
    state_ref = torch.einsum("bij,jn->bin", x.double().view(batch, f2, f1).transpose(1, 2), ws[1].double())
    tried = []
    for cfg, tm, parts in ((0, 4, 1), (1, 8, 2), (2, 8, 4)):   # cfg 1, 2: k split among 2 or 4 threads a tile
        for c in (4, 8, 16, 32, 64):
            p = K.plan(batch, factors, torch.float32, "cuda", cfg=cfg, cols=c, version="v6")
            if not p["fits"]:
                continue
            assert (p["cfg"], p["c"], p["slices"], p["TM"]) == (cfg, c, f2 // c, tm)
            assert p["threads"] == f1 * c * parts // (4 * tm)
            tried.append((cfg, c))
            states = [torch.full_like(x, math.nan)]
            out = K.forward(x, ws, out=torch.full_like(x, math.nan), version="v6", states=states, cfg=cfg, cols=c)
            verify.assert_close(out, ref, torch.float32, what=f"v6 {factors} cfg={cfg} c={c}")
            verify.assert_close(states[0], state_ref.reshape(batch, -1), torch.float32, what=f"v6 state c={c}")
    assert tried, f"v6 should take {factors}"
    auto = K.plan(batch, factors, torch.float32, "cuda", version="v6")
    assert auto["fits"] and (auto["cfg"], auto["c"]) in tried


@needs_gpu
@pytest.mark.parametrize("batch,factors,dtype", [(3, "3x4x5", torch.float32), (2, "6x8", torch.float32),
                                                 (3, "128x128", torch.float64), (2, "12x20", torch.float32),
                                                 (1, "8", torch.float32)])
def test_v6_runs_v2_where_it_does_not_apply(batch, factors, dtype):
    assert not K.plan(batch, factors, torch.float32, "cuda", version="v6")["fits"] or dtype == torch.float64
    x, *ws = _inputs(batch, factors, dtype, "cuda", seed=12)
    out = K.forward(x, ws, out=torch.full_like(x, math.nan), version="v6")
    verify.assert_close(out, K.kron_ref(x.double(), *[w.double() for w in ws]), dtype, what=f"v6 -> v2 {factors}")


@needs_gpu
def test_v6_propagates_nan_and_takes_offset_views():
    x, *ws = _inputs(6, "128x128", torch.float32, "cuda", seed=13)
    x[2, 77] = math.nan                                        # one sample's NaN stays in that sample
    ref = K.kron_ref(x.double(), *[w.double() for w in ws])
    out = K.forward(x, ws, out=torch.full_like(x, math.nan), version="v6")
    assert out[2].isnan().all() and not out[[0, 1, 3, 4, 5]].isnan().any()
    keep = [0, 1, 3, 4, 5]
    verify.assert_close(out[keep], ref[keep], torch.float32, what="v6 beside a NaN sample")
    # a view one element into a buffer is not 16-byte aligned: v6 hands it to v2 (element paths)
    buf = torch.full((6 * 16384 + 1,), math.nan, device="cuda")
    odd = buf[1:].view(6, 16384)
    xc = x.clone()
    xc[2, 77] = 0.0
    got = K.forward(xc, ws, out=odd, version="v6")
    verify.assert_close(got, K.kron_ref(xc.double(), *[w.double() for w in ws]), torch.float32, what="v6, offset out")


def test_backward_kernels_names_the_backward_and_checks_the_version():
    assert K.backward_kernels(2, "4x4", device="cpu", version="cpu") == "cpu.cpp"
    with pytest.raises(ValueError, match="version 6 is a CUDA kernel but x is on the CPU"):
        K.backward_kernels(2, "4x4", device="cpu", version="v6")
    with pytest.raises(ValueError, match="sizes must be positive 32-bit integers, got 0"):
        K.ext().backward_kernels(torch.empty(0), 2, [4, 0], 0)


def _v6_backward(batch, factors, seed, g_nan=None):
    """v6's forward (its state saved) then its backward into NaN-poisoned dx and dW, and the float64 reference."""
    x, *ws = _inputs(batch, factors, torch.float32, "cuda", seed=seed)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 100)).to("cuda")
    if g_nan is not None:
        g[g_nan] = math.nan
    states = [torch.full_like(x, math.nan)]
    K.forward(x, ws, out=torch.full_like(x, math.nan), version="v6", states=states)
    dx, dws = K.backward(g, x, ws, states, dx=torch.full_like(x, math.nan),
                         dws=[torch.full_like(w, math.nan) for w in ws], version="v6")
    ref = K.train_ref(x.double(), g.double(), *[w.double() for w in ws])
    return (dx, *dws), ref[1:]


@needs_gpu
@pytest.mark.parametrize("batch,factors", [(1, "128x128"), (3, "128x128"), (32, "128x128"), (100, "128x128"),
                                           (5, "64x128"), (2, "128x64"), (7, "32x160"), (4, "96x64"), (1, "32x32")])
def test_v6_backward_fused_against_float64(batch, factors):
    # where backward_v6.cu applies (two factors, multiples of 32, a small batch): dx, dW_1, dW_2, every element
    # written (outputs poisoned), two seeds
    assert K.backward_kernels(batch, factors, version="v6") == "backward_v6.cu"
    for seed in (0, 1):
        got, ref = _v6_backward(batch, factors, seed)
        for name, a, b in zip(["dx", "dW1", "dW2"], got, ref):
            verify.assert_close(a, b, torch.float32, what=f"v6 backward {name} batch {batch} {factors} seed {seed}")
    # and through autograd, as a training step runs it
    x, gy, *ws = K.make_train_inputs({"batch": batch, "factors": factors}, torch.float32, torch.device("cuda"),
                                     torch.Generator().manual_seed(7))
    ref = K.train_ref(x.double(), gy.double(), *[w.double() for w in ws])
    for name, a, b in zip(["y", "dx", "dW1", "dW2"], K._train("v6")(x, gy, *ws), ref):
        verify.assert_close(a, b, torch.float32, what=f"v6 training step {name} batch {batch} {factors}")


@needs_gpu
@pytest.mark.parametrize("batch,factors", [(2, "48x64"), (3, "64x48"), (2, "256x256"), (600, "128x128"),
                                           (3, "8x16x32"), (2, "12x20")])
def test_v6_backward_runs_v1s_where_its_own_does_not_apply(batch, factors):
    # not multiples of 32, too large for shared memory, a batch past 4 blocks an SM, three factors: v1's kernels
    assert K.backward_kernels(batch, factors, version="v6") == "backward.cu"
    assert K.backward_kernels(batch, factors, torch.float64, version="v6") == "backward.cu"
    x, gy, *ws = K.make_train_inputs({"batch": batch, "factors": factors}, torch.float32, torch.device("cuda"),
                                     torch.Generator().manual_seed(8))
    ref = K.train_ref(x.double(), gy.double(), *[w.double() for w in ws])
    for name, a, b in zip(["y", "dx", "dW1", "dW2", "dW3"], K._train("v6")(x, gy, *ws), ref):
        verify.assert_close(a, b, torch.float32, what=f"v6 -> v1 backward {name} batch {batch} {factors}")


@needs_gpu
def test_v6_backward_propagates_nan_and_takes_offset_views():
    # a NaN in one sample's dy: that sample's dx is all NaN (dx[b] = W_2·G·W_1ᵀ mixes every element), the others
    # are untouched, and the weight gradients (sums over the batch) carry it
    (dx, dw1, dw2), (rdx, _, _) = _v6_backward(6, "128x128", 3, g_nan=(2, 77))
    keep = [0, 1, 3, 4, 5]
    assert dx[2].isnan().all() and not dx[keep].isnan().any()
    verify.assert_close(dx[keep], rdx[keep], torch.float32, what="v6 backward dx beside a NaN sample")
    assert dw1.isnan().any() and dw2.isnan().any()
    # a g one element into a buffer is not 16-byte aligned: v1's kernels take it (element paths), the same answer
    x, *ws = _inputs(4, "128x128", torch.float32, "cuda", seed=4)
    gy = torch.randn(tuple(x.shape), generator=torch.Generator().manual_seed(5)).to("cuda")
    buf = torch.empty(4 * 16384 + 1, device="cuda")
    odd = buf[1:].view(4, 16384)
    odd.copy_(gy)
    states = [torch.empty_like(x)]
    K.forward(x, ws, version="v6", states=states)
    ref = K.train_ref(x.double(), gy.double(), *[w.double() for w in ws])
    for g in (gy, odd):
        dx, dws = K.backward(g, x, ws, states, version="v6")
        for name, a, b in zip(["dx", "dW1", "dW2"], [dx, *dws], ref[1:]):
            verify.assert_close(a, b, torch.float32, what=f"v6 backward {name}, g aligned: {g is gy}")


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch,factors", [(3, "128x128"), (70, "32x32"), (5, "13x17"), (2, "8x16x32"), (3, "5x7")])
def test_v1_every_configuration(batch, factors, dtype):
    x, *ws = _inputs(batch, factors, dtype, "cuda", seed=9)
    ref = K.kron_ref(x.double(), *[w.double() for w in ws])
    for cfg in range(3):
        out = K.forward(x, ws, out=torch.full_like(x, math.nan), version="v1", cfg=cfg)
        verify.assert_close(out, ref, dtype, what=f"v1 cfg={cfg}")


@needs_gpu
@pytest.mark.parametrize("batch", [1, 32, 1024])
def test_large_batches_and_the_backward_against_float64(batch):
    x, *ws = _inputs(batch, "128x128", torch.float32, "cuda", seed=10)
    gy = torch.randn_like(x)
    ref = K.train_ref(x.double(), gy.double(), *[w.double() for w in ws])
    for v in ["v1", "v2", "v6"]:   # v6: its own backward at batch 1 and 32, v1's at 1024
        got = K._train(v)(x, gy, *ws)
        for name, a, b in zip(["y", "dx", "dW1", "dW2"], got, ref):
            verify.assert_close(a, b, torch.float32, what=f"{v} {name} batch {batch}")


@needs_gpu
def test_backward_is_deterministic():
    x, *ws = _inputs(64, "32x16x8", torch.float32, "cuda", seed=11)
    gy = torch.randn_like(x)
    a = K._train("v2")(x, gy, *ws)
    b = K._train("v2")(x, gy, *ws)
    for s, t in zip(a, b):
        assert torch.equal(s, t)


@needs_gpu
def test_v2_falls_back_to_v1_above_the_shared_memory_limit():
    # N / f_K = 10000 floats per state row block: two buffers of 4·10000·4 bytes exceed the 227 KB a block may have
    p = K.plan(1, "100x100x2", torch.float32)
    assert not p["fits"] and p["smem_limit"] > 0
    assert K.plan(32, "128x128", torch.float32)["fits"]
    x, *ws = _inputs(1, "100x100x2", torch.float32, "cuda", seed=12)
    verify.assert_close(K.kron(x, ws, "v2"), K.kron_ref(x.double(), *[w.double() for w in ws]), torch.float32)


@pytest.mark.parametrize("device", devices())
def test_empty_batch_and_non_contiguous_input(device):
    versions = ["cpu"] if device == "cpu" else ["v1", "v2"]
    x, *ws = _inputs(0, "4x6", torch.float32, device)
    for v in versions + ["torch", "torch.bmm"]:
        assert K.kron(x, ws, v).shape == (0, 24)
    base, *ws = _inputs(5, "4x6", torch.float32, device, seed=13)
    xt = torch.cat([base, base], 1)[:, ::2]  # (5, 24), stride 2
    for v in versions:
        verify.assert_close(K.kron(xt, ws, v), K.kron_ref(xt.double(), *[w.double() for w in ws]), torch.float32)


@pytest.mark.parametrize("device", devices())
def test_stacked_layers_train(device):
    torch.manual_seed(0)
    version = "cpu" if device == "cpu" else "v2"
    net = torch.nn.Sequential(K.KronLinear([8, 4], version, device=device), torch.nn.Tanh(),
                              K.KronLinear([8, 4], version, device=device))
    ref = torch.nn.Sequential(K.KronLinear([8, 4], "torch", device=device), torch.nn.Tanh(),
                              K.KronLinear([8, 4], "torch", device=device))
    ref.load_state_dict(net.state_dict())
    x = torch.randn(16, 32, device=device)
    for m in (net, ref):
        m(x).square().mean().backward()
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("device", devices())
def test_autograd_gives_only_the_gradients_asked_for_and_is_differentiable_once(device):
    version = "cpu" if device == "cpu" else "v2"
    x, w1, w2 = _inputs(3, "4x5", torch.float64, device, seed=31)
    g = torch.randn(3, 20, dtype=torch.float64, device=device)
    # x frozen, the factors trained (a layer's weights): dW_k against autograd through the PyTorch reference
    fr = [w1.clone().requires_grad_(), w2.clone().requires_grad_()]
    y = K.kron(x, fr, version)
    assert y.grad_fn is not None and y.requires_grad
    got = torch.autograd.grad(y, fr, g)
    fw = [w.detach().requires_grad_() for w in fr]
    want = torch.autograd.grad(K.kron_ref(x, *fw), fw, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # only W_2 trained
    w2r = w2.clone().requires_grad_()
    y = K.kron(x, [w1, w2r], version)
    (d2,) = torch.autograd.grad(y, [w2r], g)
    fw2 = w2.clone().requires_grad_()
    torch.testing.assert_close(d2, torch.autograd.grad(K.kron_ref(x, w1, fw2), [fw2], g)[0], rtol=1e-12, atol=1e-12)
    # nothing requires grad, or grad mode is off: a plain forward with no graph
    assert K.kron(x, [w1, w2], version).grad_fn is None
    with torch.no_grad():
        assert K.kron(x, [w1, w2r], version).grad_fn is None
    # the compiled backward is differentiable once (as @once_differentiable): create_graph=True gives the right
    # first-order gradients, and a second backward through them raises instead of treating them as constants
    xr, w2r = x.clone().requires_grad_(), w2.clone().requires_grad_()
    dx, dw2 = torch.autograd.grad(K.kron(xr, [w1, w2r], version), [xr, w2r], g, create_graph=True)
    xf, w2f = x.clone().requires_grad_(), w2.clone().requires_grad_()
    for a, b in zip((dx, dw2), torch.autograd.grad(K.kron_ref(xf, w1, w2f), [xf, w2f], g)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert dx.requires_grad and dw2.requires_grad
    with pytest.raises(RuntimeError, match=r"kron: the backward of the compiled versions is not differentiable \(a "
                       r"second backward reached it\); for higher derivatives use version='torch.bmm'"):
        (dx.square().sum() + dw2.sum()).backward()


# ---- bad input -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("version", ["torch", "torch.bmm", "torch.kron", "cpu", "v1", "v2", "v3"])
def test_bad_input_says_what_is_wrong(version, device):
    if (version in ("v1", "v2", "v3")) and device == "cpu":
        pytest.skip("CUDA version")
    if version == "cpu" and device == "cuda":
        pytest.skip("the C++ CPU version takes CPU tensors")
    x = torch.randn(3, 12, device=device)
    w3, w4 = torch.randn(3, 3, device=device), torch.randn(4, 4, device=device)
    with pytest.raises(ValueError, match=r"the factor sizes 3 x 5 multiply to 15, but x has N = 12 columns"):
        K.kron(x, [w3, torch.randn(5, 5, device=device)], version)
    with pytest.raises(ValueError, match=r"factors\[1\] must be square \(f, f\), got \(4, 3\)"):
        K.kron(x, [w3, torch.randn(4, 3, device=device)], version)
    with pytest.raises(TypeError, match=r"factors\[0\] must have the same dtype as x \(Float\), got Double"):
        K.kron(x, [w3.double(), w4], version)
    with pytest.raises(TypeError, match=r"x must be Float, Double or BFloat16 \(versions v3, v4, v5 only\), got Int"):
        K.kron(x.int(), [w3, w4], version)
    with pytest.raises(ValueError, match=r"factors must be a non-empty list of square matrices"):
        K.kron(x, [], version)
    with pytest.raises(ValueError, match=r"x must be 2-D \(batch, N\), got 1-D"):
        K.kron(x[0], [w3, w4], version)
    with pytest.raises(ValueError, match=r"factors\[1\] must be 2-D \(f, f\), got 1-D"):
        K.kron(x, [w3, w4[0]], version)


@pytest.mark.parametrize("device", devices())
def test_version_on_the_wrong_device_says_so(device):
    x, w3, w4 = torch.randn(3, 12, device=device), torch.randn(3, 3, device=device), torch.randn(4, 4, device=device)
    # the C++ boundary's message (lab::check_version), through autograd and through the plain forward
    for v in ["v1", "v2", "v3", "v6"] if device == "cpu" else ["cpu"]:
        msg = (rf"kron: version {v[1:]} is a CUDA kernel but x is on the CPU" if device == "cpu" else
               r"kron: version 0 is the C\+\+ CPU code but x is on cuda:0 \(move to the CPU, or use a CUDA "
               r"version 1..6\)")
        with pytest.raises(ValueError, match=msg):
            K.kron(x, [w3, w4], v)
        with pytest.raises(ValueError, match=msg):
            K.forward(x, [w3, w4], version=v)


@pytest.mark.parametrize("device", devices())
def test_the_cpp_boundary_checks_too(device):
    # the compiled functions, called directly (no Python validation in front): the same messages
    x = torch.randn(3, 12, device=device)
    out = torch.empty_like(x)
    v = 0 if device == "cpu" else 2
    w3, w4 = torch.randn(3, 3, device=device), torch.randn(4, 4, device=device)
    ext = K.ext()
    with pytest.raises(ValueError, match=r"the factor sizes 3 x 5 multiply to 15, but x has N = 12 columns"):
        ext.forward(x, [w3, torch.randn(5, 5, device=device)], out, [], v, -1, 0)
    with pytest.raises(ValueError, match=r"factors\[1\] must be square \(f, f\), got \(4, 3\)"):
        ext.forward(x, [w3, torch.randn(4, 3, device=device)], out, [], v, -1, 0)
    with pytest.raises(TypeError, match=r"factors\[0\] must have the same dtype as x \(Float\), got Double"):
        ext.forward(x, [w3.double(), w4], out, [], v, -1, 0)
    with pytest.raises(ValueError, match=r"out must have shape \(batch, N\) = \(3, 12\), got \(3, 11\)"):
        ext.forward(x, [w3, w4], torch.empty(3, 11, device=device), [], v, -1, 0)
    with pytest.raises(ValueError, match=r"states must be a list of K-1 = 1 tensors"):
        ext.backward(x, x, [w3, w4], [], torch.empty_like(x), [torch.empty_like(w3), torch.empty_like(w4)], v)
    with pytest.raises(ValueError, match=r"dws\[1\] must have shape like factors\[k\] = \(4, 4\), got \(3, 3\)"):
        ext.backward(x, x, [w3, w4], [x], torch.empty_like(x), [torch.empty_like(w3), torch.empty_like(w3)], v)


@pytest.mark.parametrize("device", devices())
def test_outputs_sharing_memory_with_an_input_are_refused(device):
    """A block of the fused versions writes its columns of y[b] while other blocks still read all of x[b], and a
    factor step reads the state it came from: out, a state, dx or a dW that shares memory with an input (or another
    output) is refused by name, for every version, forward and backward."""
    dev = torch.device(device)
    g = torch.Generator().manual_seed(21)
    for v in [v.name for v in FAM.op("forward").versions_for(dev, torch.float32, kernels_only=True)]:
        x = torch.randn(4, 64, generator=g).to(dev)                            # (batch, N), N = 8 x 8
        ws = [torch.randn(8, 8, generator=g).to(dev) for _ in range(2)]      # W_1, W_2
        with pytest.raises(ValueError, match=r"out shares memory with x: the kernel reads x while it writes out"):
            K.forward(x, ws, out=x, version=v)
        with pytest.raises(ValueError, match=r"out shares memory with factors\[1\]"):
            K.forward(x[:1], ws, out=ws[1].view(1, 64), version=v)
        if v in K.TENSOR_CORE:
            continue                                                           # no states, their own backward
        st = torch.empty_like(x)
        with pytest.raises(ValueError, match=r"states\[0\] shares memory with x"):
            K.forward(x, ws, version=v, states=[x])
        with pytest.raises(ValueError, match=r"out shares memory with states\[0\]"):
            K.forward(x, ws, out=st, version=v, states=[st])
        K.forward(x, ws, version=v, states=[st])
        gy = torch.randn(4, 64, generator=g).to(dev)
        dws = [torch.empty_like(w) for w in ws]
        with pytest.raises(ValueError, match=r"dx shares memory with g"):
            K.backward(gy, x, ws, [st], dx=gy, dws=dws, version=v)
        with pytest.raises(ValueError, match=r"dx shares memory with states\[0\]"):
            K.backward(gy, x, ws, [st], dx=st, dws=dws, version=v)
        with pytest.raises(ValueError, match=r"dws\[1\] shares memory with factors\[1\]"):
            K.backward(gy, x, ws, [st], dws=[dws[0], ws[1]], version=v)
        with pytest.raises(ValueError, match=r"dws\[1\] shares memory with dws\[0\]"):
            K.backward(gy, x, ws, [st], dws=[dws[0], dws[0]], version=v)


def test_cuda_version_on_cpu_tensors_is_refused():
    x, *ws = _inputs(2, "2x3", torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"version 2 is a CUDA kernel but x is on the CPU"):  # the C++ boundary
        K.ext().forward(x, ws, torch.empty_like(x), [], 2, -1, 0)
    with pytest.raises(ValueError, match=r"version must be one of"):
        K.kron(x, ws, "v9")


def test_bfloat16_is_for_the_tensor_core_versions_only():
    # the C++ boundary says which versions take bfloat16 (3, 4 and 5; 0-2 are SIMT / CPU code in float32 and float64)
    x, *ws = _inputs(2, "2x3", torch.bfloat16, "cpu")
    for v in (0, 1, 2):
        with pytest.raises(TypeError, match=r"kron: x is BFloat16, which only versions 3, 4 and 5 \(tensor cores\) "
                           r"take"):
            K.ext().forward(x, ws, torch.empty_like(x), [], v, -1, 0)
        with pytest.raises(TypeError, match=r"kron: x is BFloat16, which only versions 3, 4 and 5"):  # backward too
            K.ext().backward(x, x, ws, [], torch.empty_like(x), [torch.empty_like(w) for w in ws], v)
    with pytest.raises(TypeError, match=r"x must be Float or BFloat16, got Double"):  # and v3 no float64
        K.ext().forward(x.double(), [w.double() for w in ws], torch.empty_like(x.double()), [], 3, -1, 0)


# ---- v3: tensor cores ------------------------------------------------------------------------------------------------
# the factorisations beyond 128x128, 1-wide and prime factors, K = 1..8
V3_SHAPES = [(3, "128x128"), (5, "13x17"), (2, "8x16x32"), (4, "32x32"), (3, "3x4x5"), (1, "64x64x64"), (6, "12x20"),
             (2, "2x3x2x5"), (7, "9"), (3, "1x1"), (2, "2x2x2x2x2x2x2x2"), (2, "256x256"), (33, "12x20"),
             (1, "100x100x2")]


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch,factors", V3_SHAPES)
def test_v3_every_configuration_and_slice_width(batch, factors, dtype):
    # against float64 at v3's precision (TF32 on float32, bf16), outputs poisoned with NaN
    x, *ws = _inputs(batch, factors, dtype, "cuda", seed=8)
    ref = K.kron_ref(x.double(), *[w.double() for w in ws])
    prec = "tf32" if dtype == torch.float32 else None
    fK = K.parse_factors(factors)[-1]
    tried = 0
    for cfg in range(2):
        for cols in sorted({8, 16, 32, 64, (fK + 7) // 8 * 8}):
            if cols > (fK + 7) // 8 * 8:
                continue
            p = K.plan(batch, factors, dtype, "cuda", cfg, cols, version="v3")
            if not p["fits"]:
                continue
            assert p["cfg"] == cfg and p["c"] == cols
            tried += 1
            out = K.forward(x, ws, out=torch.full_like(x, math.nan), version="v3", cfg=cfg, cols=cols)
            verify.assert_close(out, ref, dtype, precision=prec, what=f"v3 {dtype} cfg={cfg} c={cols}")
    if not tried:  # no configuration's state fits in shared memory (fp32 64x64x64: two 133 KB buffers): v3 runs v2
        assert not K.plan(batch, factors, dtype, "cuda", version="v3")["fits"]
        out = K.forward(x, ws, out=torch.full_like(x, math.nan), version="v3")
        verify.assert_close(out, ref, dtype, precision=prec, what=f"v3 {dtype} (v2 where nothing fits)")


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_v3_falls_back_where_nothing_fits(dtype):
    # 16384x2: W_K is 2 wide, so the state is (16384, c >= 8): 512 KB in fp32, over any block's shared memory. v3 runs
    # v2 (through float32 copies for bfloat16) and is still right
    x, *ws = _inputs(2, "16384x2", dtype, "cuda", seed=9)
    assert not K.plan(2, "16384x2", dtype, "cuda", version="v3")["fits"]
    ref = K.kron_ref(x.double(), *[w.double() for w in ws])
    out = K.forward(x, ws, out=torch.full_like(x, math.nan), version="v3")
    verify.assert_close(out, ref, dtype, what="v3 fallback")


# v4 and v5: two factors, each a multiple of 64 (192 and 320: not powers of two), every slice width. v5 takes factors
# up to 256 that fit its shared memory; 64x320 goes to v3 (the `tried == 0` branch).
# Batches 300, 135 and 1000 give a block more samples than v5's ring has slots: the slots are reused.
V4_SHAPES = [(3, "128x128"), (2, "64x64"), (1, "256x256"), (5, "64x128"), (2, "128x64"), (3, "192x64"), (1, "64x320"),
             (33, "128x128"), (300, "128x128"), (135, "64x128"), (1000, "128x128"), (7, "256x64"), (4, "64x256"),
             (2, "192x192")]


@needs_gpu
@pytest.mark.parametrize("version", ["v4", "v5"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch,factors", V4_SHAPES)
def test_v4_v5_every_slice_width(batch, factors, dtype, version):
    x, *ws = _inputs(batch, factors, dtype, "cuda", seed=10 + batch)
    ref = K.kron_ref(x.double(), *[w.double() for w in ws])
    prec = "tf32" if dtype == torch.float32 else None
    f2 = K.parse_factors(factors)[-1]
    tried = 0
    for cols in [c for c in (64, 128, 192, 256, 320) if f2 % c == 0]:
        # v5: split, ping-pong and (TF32, f_1 <= 128) split with W_1 in registers
        for cfg in ((0, 1, 2) if version == "v5" else (-1,)):
            p = K.plan(batch, factors, dtype, "cuda", cfg=cfg, cols=cols, version=version)
            if not p["fits"]:
                continue
            assert p["c"] == cols and p["slices"] == f2 // cols and (cfg < 0 or p["cfg"] == cfg)
            tried += 1
            out = K.forward(x, ws, out=torch.full_like(x, math.nan), version=version, cfg=cfg, cols=cols)
            verify.assert_close(out, ref, dtype, precision=prec, what=f"{version} {dtype} c={cols} cfg={cfg}")
    if not tried:  # over shared memory (fp32 256x256: X_bᵀ alone is 256 KB) or the prefetch registers
        assert not K.plan(batch, factors, dtype, "cuda", version=version)["fits"]
    if version == "v5" and factors in ("128x128", "64x64", "64x128") + (("192x64",) if dtype == torch.bfloat16 else ()):
        assert tried, f"v5 should take {dtype} {factors}"  # (TF32 192x64: W_1ᵀ alone is 144 KB)
    if version == "v5":  # cfg 2 is the TF32 build's, for f_1 of 64 or 128 (and f_2 up to 256, as all of v5)
        f1, f2 = K.parse_factors(factors)
        want = dtype == torch.float32 and f1 <= 128 and f2 <= 256
        assert K.plan(batch, factors, dtype, "cuda", cfg=2, version="v5")["fits"] == want
    verify.assert_close(K.forward(x, ws, out=torch.full_like(x, math.nan), version=version), ref, dtype,
                        precision=prec, what=f"{version} (planned)")


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("version", ["v4", "v5"])
@pytest.mark.parametrize("batch,factors", [(3, "13x17"), (2, "8x16x32"), (2, "64x96"), (1, "100x64"), (2, "64x64x64")])
def test_v4_v5_run_v3_where_they_do_not_apply(batch, factors, dtype, version):
    # three factors, or a factor that is not a multiple of 64: the plan does not fit and the result is v3's
    x, *ws = _inputs(batch, factors, dtype, "cuda", seed=11)
    assert not K.plan(batch, factors, dtype, "cuda", version=version)["fits"]
    ref = K.kron_ref(x.double(), *[w.double() for w in ws])
    out = K.forward(x, ws, out=torch.full_like(x, math.nan), version=version)
    verify.assert_close(out, ref, dtype, precision="tf32" if dtype == torch.float32 else None,
                        what=f"{version} -> v3")


@needs_gpu
def test_v5_propagates_nan_and_takes_offset_views():
    # a NaN in one sample reaches that sample's outputs and no other's; an output view 16 B into a larger buffer
    x, *ws = _inputs(6, "128x128", torch.bfloat16, "cuda", seed=12)
    assert K.plan(6, "128x128", torch.bfloat16, "cuda", version="v5")["fits"]
    x[4, 777] = math.nan
    buf = torch.full((6 * 16384 + 8,), math.nan, dtype=torch.bfloat16, device="cuda")
    out = K.forward(x, ws, out=buf[8:].view(6, 16384), version="v5")
    assert torch.isnan(out[4]).any() and torch.isfinite(out[[0, 1, 2, 3, 5]]).all()
    keep = [0, 1, 2, 3, 5]
    verify.assert_close(out[keep], K.kron_ref(x[keep].double(), *[w.double() for w in ws]), torch.bfloat16,
                        what="v5 beside a NaN sample")
    # 2 bytes off the 16-byte alignment TMA needs: the binding sends it to v3, same result
    x[4, 777] = 0.0
    ref = K.kron_ref(x.double(), *[w.double() for w in ws])
    odd = torch.full((6 * 16384 + 1,), math.nan, dtype=torch.bfloat16, device="cuda")[1:].view(6, 16384)
    verify.assert_close(K.forward(x, ws, out=odd, version="v5"), ref, torch.bfloat16, what="v5, misaligned out")


# ---- the tensor-core versions' backward (cuda_src/kron/backward_tc.cu): TF32 on float32, bf16 on bfloat16 ----------
TC_BACKWARD_SHAPES = V3_SHAPES + [(2, "64x128"), (3, "128x64"), (1, "256x128"), (5, "3x1x4")]


def _tc_precision(dtype):
    return "tf32" if dtype == torch.float32 else None  # bfloat16: its own tolerance


def _tc_train_check(x, gy, ws, version, dtype, seeds_label, dx_out=None, dws_out=None):
    """Forward through autograd and the compiled backward into NaN-poisoned outputs, each against float64."""
    inputs = [x.double(), gy.double(), *[w.double() for w in ws]]
    ref, scale = K.train_ref(*inputs), verify.root_sum_square(K.train_ref)(*inputs)
    y = K.forward(x, ws, version=version)
    dx = torch.full_like(x, math.nan) if dx_out is None else dx_out
    dws = [torch.full_like(w, math.nan) for w in ws] if dws_out is None else dws_out
    K.backward(gy, x, ws, [], dx, dws, version=version)
    for name, a, b, sc in zip(["y", "dx"] + [f"dW{k + 1}" for k in range(len(ws))], [y, dx, *dws], ref, scale):
        verify.assert_close(a, b, dtype, precision=_tc_precision(dtype), what=f"{version} {name} {seeds_label}",
                            scale=sc)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch,factors", TC_BACKWARD_SHAPES)
def test_tc_backward_against_float64(batch, factors, dtype):
    # every version's backward is backward_tc.cu; v3 and v5 go through it the same way (one checked per seed)
    for seed, version in [(20, "v3"), (21, "v5")]:
        x, *ws = _inputs(batch, factors, dtype, "cuda", seed=seed)
        gy = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 100)).to(dtype).cuda()
        _tc_train_check(x, gy, ws, version, dtype, f"{factors} batch {batch} seed {seed}")


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 32, 1024])
def test_tc_backward_large_batches(batch, dtype):
    # batch 1024: the 128x128 tiles and a deep split of every dW; batch 1: the 64x64 tiles, one sample
    x, *ws = _inputs(batch, "128x128", dtype, "cuda", seed=22)
    gy = torch.randn(x.shape, generator=torch.Generator().manual_seed(23)).to(dtype).cuda()
    _tc_train_check(x, gy, ws, "v5", dtype, f"batch {batch}")


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [3, 32, 128, 1024])
def test_tc_train_step_replayed_from_a_cuda_graph_matches_eager(batch, dtype):
    # backward_tc's kernels launch programmatically (griddepcontrol) where its grids allow (batch 3, 32 and 1024 at
    # 128x128; not 128): captured in a CUDA graph, where those launches become programmatic edges, a replay must give
    # the eager step's results bit for bit (every kernel of the step is deterministic)
    from lab.timing import capture_graph
    x, gy, *ws = K.make_train_inputs({"batch": batch, "factors": "128x128"}, dtype, torch.device("cuda"),
                                     torch.Generator().manual_seed(26))
    step = K._train("v5")
    want = step(x, gy, *ws)
    got = []
    graph = capture_graph(lambda: got.append(step(x, gy, *ws)))
    outs = got[-1]  # the tensors the captured step writes on every replay
    for t in outs:
        t.fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    for name, a, b in zip(["y", "dx", "dW1", "dW2"], outs, want):
        assert torch.equal(a, b), f"{name}: graph replay differs from eager at batch {batch}, {dtype}"


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tc_backward_element_paths_and_offset_views(dtype):
    # outputs and inputs 1 element off the 16-byte alignment: the kernels' element loads (no vectors) must agree
    x, *ws = _inputs(3, "128x128", dtype, "cuda", seed=24)
    gy = torch.randn(x.shape, generator=torch.Generator().manual_seed(25)).to(dtype).cuda()
    def off(t):
        buf = torch.full((t.numel() + 1,), math.nan, dtype=t.dtype, device="cuda")
        v = buf[1:].view(t.shape)
        v.copy_(t)
        return v
    _tc_train_check(off(x), off(gy), [off(w) for w in ws], "v5", dtype, "offset views",
                    dx_out=off(torch.full_like(x, math.nan)), dws_out=[off(torch.full_like(w, math.nan)) for w in ws])


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tc_backward_is_deterministic_and_propagates_nan(dtype):
    x, *ws = _inputs(64, "32x16x8", dtype, "cuda", seed=26)
    gy = torch.randn(x.shape, generator=torch.Generator().manual_seed(27)).to(dtype).cuda()
    a = K.backward(gy, x, ws, [], version="v3")
    b = K.backward(gy, x, ws, [], version="v3")
    assert torch.equal(a[0], b[0]) and all(torch.equal(s, t) for s, t in zip(a[1], b[1]))
    gy[5, 100] = math.nan  # one sample's gradient: its dx row goes NaN, every other row stays finite; every dW is
    dx, dws = K.backward(gy, x, ws, [], version="v3")  # a sum over the batch, so each goes NaN
    assert torch.isnan(dx[5]).any() and torch.isfinite(dx[torch.arange(64, device="cuda") != 5]).all()
    assert all(torch.isnan(dw).any() for dw in dws)
    with pytest.raises(ValueError, match=r"kron: version 3 \(tensor cores\) saves no states \(its backward "
                       r"recomputes them\); pass states=\[\]"):
        K.forward(x, ws, version="v3", states=[torch.empty_like(x) for _ in ws[1:]])


@needs_gpu
@pytest.mark.parametrize("version", ["v3", "v4", "v5"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tc_versions_train_through_autograd(version, dtype):
    # KronLinear on a tensor-core version: loss.backward() fills every factor's .grad and x.grad at the version's
    # precision, against autograd through the float64 reference
    torch.manual_seed(28)
    layer = K.KronLinear("64x128", version=version, dtype=dtype, device="cuda")
    x = torch.randn(5, 64 * 128, dtype=dtype, device="cuda", requires_grad=True)
    layer(x).square().sum().backward()
    xr = x.detach().double().requires_grad_()
    fr = [w.detach().double().requires_grad_() for w in layer.factors]
    K.kron_ref(xr, *fr).square().sum().backward()
    verify.assert_close(x.grad, xr.grad, dtype, precision=_tc_precision(dtype), what=f"{version} x.grad")
    for k, (w, r) in enumerate(zip(layer.factors, fr)):
        verify.assert_close(w.grad, r.grad, dtype, precision=_tc_precision(dtype), what=f"{version} dW{k + 1}")


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tc_empty_batch_and_non_contiguous_input_train(dtype):
    # batch 0: y and dx empty, every dW exactly zero (an empty sum), no launch with an empty grid
    x, *ws = _inputs(0, "64x128", dtype, "cuda")
    dx, dws = K.backward(torch.empty_like(x), x, ws, [], version="v5")
    assert dx.shape == (0, 64 * 128) and all(torch.equal(dw, torch.zeros_like(dw)) for dw in dws)
    # a strided x through autograd: the C++ Function makes it contiguous for the kernels, the gradient keeps x's shape
    base, *ws = _inputs(4, "12x20", dtype, "cuda", seed=29)
    xt = torch.cat([base, base], 1)[:, ::2].requires_grad_()  # (4, 240), stride 2
    K.kron(xt, ws, "v5").sum().backward()
    xr = xt.detach().double().requires_grad_()
    K.kron_ref(xr, *[w.double() for w in ws]).sum().backward()
    verify.assert_close(xt.grad, xr.grad, dtype, precision=_tc_precision(dtype), what="dx of a strided x")


def test_tc_backward_refuses_states_and_the_cpu():
    # the C++ boundary: v3-v5 save no states (their backward recomputes them), and they are CUDA kernels
    x, *ws = _inputs(2, "4x8", torch.float32, "cpu")
    dws = [torch.empty_like(w) for w in ws]
    with pytest.raises(ValueError, match=r"kron: version 3 \(tensor cores\) saves no states and its backward "
                       r"recomputes them; pass states=\[\]"):
        K.ext().backward(x, x, ws, [x], torch.empty_like(x), dws, 3)
    with pytest.raises(ValueError, match=r"kron: version 5 is a CUDA kernel but x is on the CPU \(use version 0, "
                       r"'cpu' in lab's wrappers: the C\+\+ CPU code\)"):
        K.ext().backward(x, x, ws, [], torch.empty_like(x), dws, 5)
    xd, *wd = _inputs(2, "4x8", torch.float64, "cpu")
    with pytest.raises(TypeError, match=r"x must be Float or BFloat16, got Double"):
        K.ext().backward(xd, xd, wd, [], torch.empty_like(xd), [torch.empty_like(w) for w in wd], 4)


@needs_gpu
def test_mixed_devices_are_refused():
    x = torch.randn(2, 6, device="cuda")
    with pytest.raises(ValueError, match=r"factors\[1\] must be on the same device as x \(cuda:0\), got cpu"):
        K.kron(x, [torch.randn(2, 2, device="cuda"), torch.randn(3, 3)], "v2")


# ---- the default version: the tuning table ---------------------------------------------------------------------------
def test_default_reads_the_tuning_table_by_gpu_build_dtype_factors_and_nearest_batch():
    t = {"H100 | abc": {"float32 128x128": {"32": {"version": "v1"}, "1024": {"version": "v2"}},
                        "bfloat16 128x128": {"1024": {"version": "v4"}}}}
    look = lambda key, dt, b, sizes=(128, 128): K.lookup_default(t, key, dt, sizes, b)  # noqa: E731
    assert [look("H100 | abc", torch.float32, b) for b in (1, 32, 100, 200, 1024, 4096)] == \
        ["v1", "v1", "v1", "v2", "v2", "v2"]                       # nearest tuned batch on a log scale
    assert look("H100 | abc", torch.bfloat16, 8) == "v4"
    assert look("H100 | xyz", torch.float32, 32) == "v2"           # another build (an edited source): the static default
    assert look("H100 | xyz", torch.bfloat16, 32) == "v3"
    assert look("H100 | abc", torch.float32, 32, (64, 64)) == "v2"  # untuned factors
    assert look("H100 | abc", torch.float64, 32) == "v2"           # untuned dtype
    # a float32 call never defaults to a TF32 version, a bfloat16 one never to a strict-fp32 one
    assert set(K.DEFAULT_CANDIDATES[torch.float32]) == {"v1", "v2", "v6"} and \
        set(K.DEFAULT_CANDIDATES[torch.bfloat16]) == {"v3", "v4", "v5"}


def test_the_tuning_table_file_round_trips(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path))
    assert K.tune_path() == tmp_path / "kron_tune.json" and K.load_table() == {}
    K._save_table({"gpu | k": {"float32 8x8": {"4": {"version": "v1"}}}})
    assert K.load_table()["gpu | k"]["float32 8x8"]["4"]["version"] == "v1"
    (tmp_path / "kron_tune.json").write_text("{not json")        # a broken file reads as no table
    import os
    os.utime(tmp_path / "kron_tune.json", (1, 1))
    assert K.load_table() == {}


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tune_default_records_the_fastest_and_the_default_follows(tmp_path, monkeypatch, dtype):
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path))
    rows = K.tune_default([4, 64], "64x64", dtype, budget_ms=5.0)
    assert {r["version"] for r in rows} == set(K.DEFAULT_CANDIDATES[dtype]) and \
        len(rows) == 2 * len(K.DEFAULT_CANDIDATES[dtype])
    for b in (4, 64):
        mine = [r for r in rows if r["batch"] == b]
        chosen = min(mine, key=lambda r: r["median_us"])["version"]
        assert [r["version"] for r in mine if r["chosen"]] == [chosen]
        x, *ws = _inputs(b, "64x64", dtype, "cuda", seed=12)
        assert K.default_version(x, ws) == chosen
        ref = K.kron_ref(x.double(), *[w.double() for w in ws])
        verify.assert_close(K.forward(x, ws), ref, dtype, what=f"default ({chosen})")  # in the dtype's precision


@needs_gpu
@pytest.mark.parametrize("version,dtype", [("v2", torch.float32), ("v5", torch.float32), ("v5", torch.bfloat16)])
def test_tune_rows_share_one_schema_and_mark_the_automatic_choice(version, dtype):
    # every row of K.tune carries the same fields (a script reading r["stages"] of the automatic row once failed), and
    # the configurations it sweeps include the automatic choice: exactly one swept row is marked as it
    rows = K.tune(8, "128x128", dtype, budget_ms=2.0, version=version)
    assert len(rows) >= 2 and len({frozenset(r) for r in rows}) == 1, [sorted(r) for r in rows]
    auto = K.plan(8, "128x128", dtype, "cuda", version=version)
    assert auto["fits"] and rows[-1]["version"] == f"{version} (auto)"
    marked = [r for r in rows[:-1] if r["auto"]]
    assert [(r["version"], r["cfg"], r["c"]) for r in marked] == [(version, auto["cfg"], auto["c"])], rows
    assert all(r["median_us"] > 0 for r in rows)


# ---- the command line ------------------------------------------------------------------------------------------------
def test_command_line_check_agrees(capsys):
    from lab import kron as cli
    assert cli.main(["--dtype", "d", "--device", "cpu", "3", "4", "6", "check"]) == 0
    out = capsys.readouterr().out
    assert "||torch_y|| = " in out and "||cpu_gW|| = " in out
    assert "torch_y == cpu_y: True" in out and "False" not in out


def test_command_line_profile_says_what_cannot_run():
    from lab import kron as cli
    with pytest.raises(SystemExit, match=r"--implementation v9 does not run here; choose from torch, torch.bmm"):
        cli.main(["--device", "cpu", "2", "4", "6", "profile", "--implementation", "v9"])
    with pytest.raises(SystemExit, match=r"--implementation cpu does not take bfloat16"):  # bf16: v3-v5 and torch
        cli.main(["--dtype", "bf16", "--device", "cpu", "2", "4", "6", "profile"])


def test_command_line_parses_factor_lists():
    from lab import kron as cli
    with pytest.raises(SystemExit):
        cli.main(["4", "check"])  # no factor
    with pytest.raises(SystemExit, match=r"factor sizes must be one or more positive integers, got \[4, 0\]"):
        cli.main(["--device", "cpu", "2", "4", "0", "check"])   # the message, not a traceback
    assert K.parse_factors([128, 64]) == (128, 64) and K.parse_factors("8x16x32") == (8, 16, 32)
    with pytest.raises(ValueError, match="factor sizes must look like"):
        K.parse_factors("8 by 16")


def test_the_calling_thread_switch_is_restored_even_on_error():
    # eager_against_graph times a step with autograd's backward on the calling thread; the switch is process-wide,
    # so it must come back to what it was however the block ends
    from lab.studies import kron as study
    assert torch.autograd.is_multithreading_enabled()
    with pytest.raises(KeyError):
        with study.autograd_on_the_calling_thread():
            assert not torch.autograd.is_multithreading_enabled()
            raise KeyError("inside")
    assert torch.autograd.is_multithreading_enabled()
    # and to what it was: off stays off
    torch.autograd.set_multithreading_enabled(False)
    try:
        with study.autograd_on_the_calling_thread():
            pass
        assert not torch.autograd.is_multithreading_enabled()
    finally:
        torch.autograd.set_multithreading_enabled(True)
