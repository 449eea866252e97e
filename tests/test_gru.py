"""GRU family: every version against nn.GRU (float64, same weights) on odd sizes, several seeds and layers, with and
without h0, seq_len 1; float64 to ~1e-12; CUDA graphs and determinism of the persistent kernel; the decoder-step
pieces (gates, argmax + gathers); bad input gives an error that names the argument."""
import math
import subprocess
import sys

import pytest
import torch

from lab import env, registry, verify
from lab.kernels import gru as kgru

from conftest import devices, needs_gpu

OP = registry.get("gru").op("gru")


def _inputs(T, B, I, H, L=1, h0=True, dtype=torch.float32, device="cpu", seed=0):
    return kgru.make_inputs({"seq": T, "batch": B, "input": I, "hidden": H, "layers": L, "h0": int(h0)}, dtype,
                            device, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", OP.dtypes, ids=str)
def test_every_version_matches_nn_gru(device, dtype):
    # CPU (CI, 2 cores): two seeds; the float64 nn.GRU reference dominates the time
    rs = verify.check_op(OP, device, dtypes=[dtype], seeds=(0, 1) if device == "cpu" else (0, 1, 2))
    assert rs, "no version ran"
    assert {r.version for r in rs} == ({"cpu"} if device == "cpu" else {"v1", "v2", "v3", "v4", "v5", "v6"})
    bad = [r.details() for r in rs if not r.passed]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1), (5, 3, 77, 200, 2), (3, 4, 9, 17, 3)])
def test_float64_matches_nn_gru_to_rounding(device, shape):
    # in float64 the only difference from nn.GRU is summation order: ~1e-15, so any indexing slip shows
    x, h0, params = _inputs(*shape, dtype=torch.float64, device=device, seed=4)
    ref = kgru.gru_ref(x, h0, params)
    for v in (["cpu"] if device == "cpu" else ["v1", "v2"]):
        verify.assert_close(kgru.gru(x, h0, params, version=v), ref, torch.float64, what=v)


@pytest.mark.parametrize("device", devices())
def test_no_h0_is_zeros(device):
    x, _, params = _inputs(4, 3, 5, 7, L=2, device=device)
    zeros = torch.zeros(2, 3, 7, device=device)
    for v in (["cpu"] if device == "cpu" else ["v1", "v2", "v3", "v4", "v5", "v6"]):
        a, b = kgru.gru(x, None, params, version=v), kgru.gru(x, zeros, params, version=v)
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert torch.equal(a[1][-1], a[0][-1]), "h_n of the last layer must be the last output step"


@needs_gpu
@pytest.mark.parametrize("B", [1, 8, 128, 256])
def test_encoder_shape_all_versions_within_fp32(B):
    # the seq2seq encoder: seq 30, input 256, hidden 512 (v3/v4: 32 hidden slices x up to 4 batch slices)
    x, h0, params = _inputs(30, B, 256, 512, h0=False, device="cuda", seed=B)
    ref = kgru.gru_ref(*verify.upcast((x, h0, params)))
    for v in ("v1", "v2", "v3", "v4"):
        verify.assert_close(kgru.gru(x, h0, params, version=v), ref, torch.float32, what=v)


@needs_gpu
def test_v3_plan_splits_hidden_512_over_the_chip():
    for B in (1, 8, 64, 128, 256):
        p = kgru.v3_plan(B, 512)
        assert p["status"] == 0, p
        assert p["units_per_block"] * p["hidden_slices"] >= 512
        assert p["blocks"] <= p["max_coresident"]
        assert p["batch_slices"] * p["rows_per_block"] >= B
    assert kgru.v3_plan(1, 2048)["status"] == 1
    assert kgru.v3_plan(128, 512, version="v4") == kgru.v3_plan(128, 512)
    # the default exchange: the tagged h words where a block owns one batch row (batch 1 at hidden 512 on any GPU
    # that holds the 32 blocks), the step counters where it owns several (batch 256 spreads over at most 132 SMs)
    assert kgru.v3_plan(1, 512)["exchange"] == "tagged"
    assert kgru.v3_plan(256, 512)["exchange"] == "counters"


# proj.cu, the input projection v3..v6 run for few rows: the encoder's shapes at batch 1 and 8, the ring kernel's
# edges (1, primes, one past a tile), K not a multiple of the chunk or of a 16-byte copy; above 128 rows (float32: the
# bulk-copy kernel, 48 x 64 tiles): one row past the ring kernel's range, ragged tiles, the largest K whose rows fit
# in shared memory (512), and past it (516, 2000: the ring kernel after all, K cycling through its ring).
PROJ_SHAPES = [(1, 1, 1), (30, 1536, 256), (240, 1536, 256), (7, 99, 5), (33, 97, 259), (257, 64, 40), (3, 3, 1000),
               (129, 65, 1), (131, 97, 259), (200, 130, 512), (481, 1537, 260), (131, 33, 516), (129, 7, 2000)]


@needs_gpu
@pytest.mark.parametrize("dtype", kgru.V3_DTYPES, ids=str)
@pytest.mark.parametrize("shape", PROJ_SHAPES, ids=lambda s: "M{}N{}K{}".format(*s))
def test_input_projection_matches_float64(dtype, shape):
    M, N, K = shape
    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(M, K, generator=g).to("cuda", dtype)
        w = (torch.randn(N, K, generator=g) / math.sqrt(K)).to("cuda", dtype)
        want = x.double() @ w.double().t()  # float64 of the same (rounded) operands
        # aligned (16-byte copies where K allows) and a view one element into a buffer (element loads)
        buf = torch.randn(M * K + 1, generator=g).to("cuda", dtype)
        buf[1:].copy_(x.flatten())
        for xx in (x, buf[1:].view(M, K)):
            out = torch.full((M, N), math.nan, device="cuda")
            zero = torch.full((37,), 7, dtype=torch.int32, device="cuda")
            kgru.ext().input_projection(xx, w, out, zero)
            # fp16/bf16 products are exact in fp32: every dtype is held to fp32 accumulation
            verify.assert_close(out, want, torch.float32, what=f"proj {dtype} seed {seed}")
            assert torch.equal(zero, torch.zeros_like(zero)), "the counters must be zeroed in the same launch"


@needs_gpu
def test_first_bulk_projection_of_a_process_opts_in_at_exactly_48_kb():
    # proj.cu's bulk kernel at K <= 96 (here 96): its partial sums take exactly 48 KB of dynamic shared memory, and
    # with its static mbarriers the block is past the default limit, so it must opt in. An opt-in lasts for the
    # process, so a launch at larger K earlier in this one would hide a missing one: a fresh process.
    code = ("import torch; from lab.kernels import gru as k; g = torch.Generator().manual_seed(0); "
            "x = torch.randn(200, 96, generator=g).cuda(); w = torch.randn(64, 96, generator=g).cuda(); "
            "out = k.input_projection(x, w); want = x.double() @ w.double().t(); "
            "print(float((out.double() - want).abs().max() / want.abs().max()))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=env.ROOT, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert float(r.stdout.split()[-1]) < 1e-5, r.stdout


@needs_gpu
def test_input_projection_nan_stays_in_its_row_and_no_rows_still_zeroes():
    x, w = torch.randn(40, 70, device="cuda"), torch.randn(50, 70, device="cuda")
    x[33, 69] = math.nan  # in the second 32-row tile, the last k of the tail chunk
    out = kgru.input_projection(x, w)
    assert out[33].isnan().all() and not out[torch.arange(40, device="cuda") != 33].isnan().any()
    zero = torch.full((5,), -1, dtype=torch.int32, device="cuda")
    out = kgru.ext().input_projection(x[:0], w, torch.empty(0, 50, device="cuda"), zero)
    assert out.shape == (0, 50) and torch.equal(zero, torch.zeros_like(zero))


@pytest.mark.parametrize("device", devices())
def test_input_projection_bad_input_names_the_argument(device):
    x, w = torch.randn(4, 6, device=device), torch.randn(9, 6, device=device)
    out = torch.empty(4, 9, device=device)
    with pytest.raises(ValueError, match=r"w must have as many columns as x \(the input size 6\), got \(9, 5\)"):
        kgru.ext().input_projection(x, w[:, :5].contiguous(), out, None)
    with pytest.raises(TypeError, match=r"out must be Float \(fp32 accumulation and output\), got Half"):
        kgru.ext().input_projection(x, w, out.half(), None)
    with pytest.raises(ValueError, match=r"out must have shape \(rows, 3\*hidden\) = \(4, 9\)"):
        kgru.ext().input_projection(x, w, out[:, :8], None)
    with pytest.raises(TypeError, match=r"zero must be Int"):
        kgru.ext().input_projection(x, w, out, torch.zeros(3, device=device))
    with pytest.raises(TypeError, match=r"x must be Float or Half or BFloat16, got Double"):
        kgru.ext().input_projection(x.double(), w.double(), out, None)
    if device == "cpu":
        with pytest.raises(ValueError, match=r"input_projection is proj.cu's CUDA kernel: x must be a CUDA tensor"):
            kgru.input_projection(x, w)


@needs_gpu
@pytest.mark.parametrize("version", ["v3", "v4", "v5", "v6"])
@pytest.mark.parametrize("dtype", kgru.V3_DTYPES, ids=str)
def test_persistent_kernels_are_deterministic(dtype, version):
    # a missing barrier shows up as run-to-run differences on the same inputs
    x, h0, params = _inputs(12, 67, 40, 200, L=2, dtype=dtype, device="cuda", seed=7)
    a = kgru.gru(x, h0, params, version=version)
    for _ in range(3):
        b = kgru.gru(x, h0, params, version=version)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@needs_gpu
@pytest.mark.parametrize("version", ["v1", "v2", "v3", "v4", "v5", "v6"])
def test_cuda_graph_replay_matches_eager(version):
    x, h0, params = _inputs(6, 16, 32, 64, L=2, device="cuda", seed=2)
    out = (torch.empty(6, 16, 64, device="cuda"), torch.empty(2, 16, 64, device="cuda"))
    from lab.timing import capture_graph
    g = capture_graph(lambda: kgru.gru(x, h0, params, out=out, version=version))
    x2, h02, _ = _inputs(6, 16, 32, 64, L=2, device="cuda", seed=3)
    x.copy_(x2)
    h0.copy_(h02)
    g.replay()
    torch.cuda.synchronize()
    want = kgru.gru(x2, h02, params, version=version)
    torch.testing.assert_close(out, want)


# v5 on the shapes issue 14 names (hidden 1, 33, 200, 1000, 1024; batch 1, 3, 130, 256; layers 1-3; seq 1; with and
# without h0), in each dtype (float32 = TF32 multiplies) and under every warp grid that fits, against float64 nn.GRU.
V5_SHAPES = [(1, 1, 1, 1, 1, True), (4, 3, 33, 33, 3, False), (2, 130, 40, 200, 2, True), (2, 256, 24, 1000, 1, True),
             (3, 3, 17, 1024, 1, False), (5, 256, 64, 512, 1, False), (1, 130, 9, 96, 1, True)]


@needs_gpu
@pytest.mark.parametrize("dtype", kgru.V3_DTYPES, ids=str)
@pytest.mark.parametrize("shape", V5_SHAPES, ids=lambda s: "T{}B{}I{}H{}L{}{}".format(*s[:5], "h0" if s[5] else ""))
def test_v5_every_config_matches_float64_nn_gru(dtype, shape):
    T, B, I, H, L, has_h0 = shape
    x, h0, params = _inputs(T, B, I, H, L=L, h0=has_h0, dtype=dtype, device="cuda", seed=T * B + H)
    ref = kgru.gru_ref(*verify.upcast((x, h0, params)))
    precision = "tf32" if dtype == torch.float32 else None
    ran = []
    for cfg in range(8):
        if kgru.v5_plan(B, H, dtype, cfg)["status"] != 0:
            continue
        out = (torch.full((T, B, H), float("nan"), dtype=dtype, device="cuda"),
               torch.full((L, B, H), float("nan"), dtype=dtype, device="cuda"))
        got = kgru.gru(x, h0, params, out=out, version="v5", config=cfg)
        verify.assert_close(got, ref, dtype, precision=precision, what=f"v5 config {cfg}")
        ran.append(cfg)
    assert ran, "no configuration of v5 fits"
    assert kgru.v5_plan(B, H, dtype)["config"] in ran
    got = kgru.gru(x, h0, params, version="v5", grid_sync=True)      # the first design's exchange: one grid barrier
    verify.assert_close(got, ref, dtype, precision=precision, what="v5 with grid.sync")


@needs_gpu
def test_v5_plan_and_its_errors():
    for B in (1, 8, 64, 128, 256):
        for dt in kgru.V3_DTYPES:
            p = kgru.v5_plan(B, 512, dt)
            assert p["status"] == 0, p
            assert p["units_per_block"] * p["hidden_slices"] >= 512
            assert p["batch_slices"] * p["rows_per_block"] >= B
            assert p["blocks"] <= p["max_coresident"]
    x, _, params = _inputs(2, 2, 3, 2048, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"gru v5 cannot run batch 2, hidden 2048, BFloat16 on this GPU: .*use v2"):
        kgru.gru(x, None, params, version="v5")


@needs_gpu
def test_v5_float32_multiplies_in_tf32_within_its_tolerance():
    # the TF32 path rounds h and W with cvt.rna (no truncation bias): over the encoder's 30 steps it stays inside the
    # TF32 tolerance, and its error is a TF32 error, not fp32 rounding
    x, h0, params = _inputs(30, 64, 256, 512, device="cuda", seed=5)
    ref = kgru.gru_ref(*verify.upcast((x, h0, params)))
    got = kgru.gru(x, h0, params, version="v5")
    err = (got[0].double() - ref[0]).norm() / ref[0].norm()
    assert err < verify.tolerance(torch.float32, "tf32"), err
    assert err > 1e-6, "v5 on float32 must multiply in TF32 (an error this small means fp32 FMAs)"


@needs_gpu
def test_v4_equals_v3_up_to_summation_order():
    # same split, same data movement; only the order of the lane sums differs
    x, h0, params = _inputs(30, 128, 256, 512, device="cuda", seed=11)
    a, b = kgru.gru(x, h0, params, version="v3"), kgru.gru(x, h0, params, version="v4")
    verify.assert_close(b, a, torch.float32, what="v4 vs v3")


# ---- the decoder-step pieces --------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", devices())
def test_gates_in_place_on_strided_rows_match_gru_cell(device):
    # h lives in the right half of an [emb | h] buffer (row stride E + H), updated in place, like the decoder does
    g = torch.Generator().manual_seed(0)
    B, I, H, E = 5, 13, 11, 7
    dt = torch.float64
    cell = torch.nn.GRUCell(I, H, dtype=dt)
    x = torch.randn(B, I, generator=g, dtype=dt)
    xh = torch.randn(B, E + H, generator=g, dtype=dt)
    want = cell(x, xh[:, E:].clone()).detach()
    cell, x, xh = cell.to(device), x.to(device), xh.to(device)
    left = xh[:, :E].clone()
    with torch.no_grad():
        gi = x @ cell.weight_ih.t()
        gh = xh[:, E:] @ cell.weight_hh.t()
        kgru.ext().gru_gates(gi, gh, cell.bias_ih, cell.bias_hh, xh[:, E:], xh[:, E:])
    verify.assert_close(xh[:, E:], want, dt)
    assert torch.equal(xh[:, :E], left), "gates wrote outside h"


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_decoder_prep_argmax_and_gathers(device, dtype):
    g = torch.Generator().manual_seed(1)
    B, V, E, G = 6, 37, 5, 9
    logits = torch.randn(B, V, generator=g, dtype=dtype)
    logits[1, 3] = logits[1, 20] = logits[1].max() + 1     # a tie: the first index wins, like torch.argmax
    logits[2, 30] = math.nan                                # NaN is the largest value for torch.argmax
    logits[3, :] = 0.5                                      # all equal
    emb = torch.randn(V, E, generator=g, dtype=dtype)
    gtab = torch.randn(V, G, generator=g, dtype=dtype)
    gctx = torch.randn(B, G, generator=g, dtype=dtype)
    want = logits.argmax(1)
    assert want[1] == 3 and want[2] == 30 and want[3] == 0
    logits, emb, gtab, gctx = (t.to(device) for t in (logits, emb, gtab, gctx))
    xh = torch.full((B, E + 4), math.nan, dtype=dtype, device=device)
    gi = torch.full((B, G), math.nan, dtype=dtype, device=device)
    tok = torch.full((B,), -7, dtype=torch.long, device=device)
    kgru.ext().decoder_prep(logits, None, tok, emb, gtab, gctx, xh, gi)
    assert torch.equal(tok.cpu(), want)
    w = want.to(device)
    torch.testing.assert_close(xh[:, :E], emb[w], rtol=0, atol=0)
    assert torch.isnan(xh[:, E:]).all(), "prep wrote past the embedding columns"
    torch.testing.assert_close(gi, gtab[w] + gctx, rtol=0, atol=0)
    # given tokens instead of logits
    given = torch.tensor([0, 36, 5, 5, 1, 2], device=device)
    kgru.ext().decoder_prep(None, given, None, emb, gtab, gctx, xh, gi)
    torch.testing.assert_close(xh[:, :E], emb[given], rtol=0, atol=0)


@needs_gpu
def test_decoder_prep_out_of_range_token_poisons_the_row_on_gpu():
    # a device assert would kill the process; the kernel writes NaN instead (the CPU version raises)
    V, E, G = 10, 4, 6
    emb, gtab = torch.randn(V, E, device="cuda"), torch.randn(V, G, device="cuda")
    gctx = torch.zeros(2, G, device="cuda")
    xh, gi = torch.zeros(2, E, device="cuda"), torch.zeros(2, G, device="cuda")
    kgru.ext().decoder_prep(None, torch.tensor([3, 99], device="cuda"), None, emb, gtab, gctx, xh, gi)
    assert torch.isnan(xh[1]).all() and torch.isnan(gi[1]).all()
    torch.testing.assert_close(xh[0], emb[3])


# ---- bad input --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", devices())
def test_bad_input_names_the_argument(device):
    v = "v2" if device == "cuda" else "cpu"
    x, h0, params = _inputs(3, 2, 5, 4, L=1, device=device)
    p = list(params)
    with pytest.raises(ValueError, match=r"x must be 3-D \(seq_len, batch, input_size\), got 2-D"):
        kgru.gru(x[0], h0, p, version=v)
    with pytest.raises(ValueError, match=r"input size mismatch: x has input_size 6 but params\[0\] \(w_ih of layer 0\)"
                                         r" has shape \(12, 5\)"):
        kgru.gru(torch.randn(3, 2, 6, device=device), h0, p, version=v)
    with pytest.raises(ValueError, match=r"params\[1\] \(w_hh of layer 0\) must have shape \(3\*hidden, hidden\) = "
                                         r"\(12, 4\), got \(13, 4\)"):
        kgru.gru(x, h0, [p[0], torch.randn(13, 4, device=device), p[2], p[3]], version=v)
    with pytest.raises(ValueError, match=r"params\[3\] \(b_hh of layer 0\) must have shape \(3\*hidden,\) = \(12,\)"):
        kgru.gru(x, h0, p[:3] + [torch.randn(11, device=device)], version=v)
    with pytest.raises(ValueError, match=r"h0 must have shape \(num_layers, batch, hidden\) = \(1, 2, 4\), "
                                         r"got \(2, 2, 4\)"):
        kgru.gru(x, torch.randn(2, 2, 4, device=device), p, version=v)
    with pytest.raises(ValueError, match=r"params must hold 4 tensors per layer"):
        kgru.gru(x, h0, p + p[:1], version=v)
    with pytest.raises(TypeError, match=r"x must be Float or Double or Half or BFloat16, got Int"):
        kgru.gru(x.int(), h0, p, version=v)
    with pytest.raises(TypeError, match=r"params\[2\] \(b_ih of layer 0\) must have the same dtype as x \(Float\), "
                                        r"got Double"):
        kgru.gru(x, h0, p[:2] + [p[2].double(), p[3]], version=v)
    with pytest.raises(TypeError, match=r"h0 must have the same dtype as x"):
        kgru.gru(x, h0.half(), p, version=v)
    with pytest.raises(ValueError, match=r"params\[0\] \(w_ih of layer 0\) must be contiguous"):
        kgru.gru(x, h0, [p[0].t().contiguous().t()] + p[1:], version=v)
    with pytest.raises(ValueError, match=r"x must have seq_len, batch and input_size >= 1"):
        kgru.gru(x[:0], h0[:, :0], p, version=v)
    with pytest.raises(ValueError, match=r"out must have shape \(seq_len, batch, hidden\) = \(3, 2, 4\)"):
        kgru.gru(x, h0, p, out=(torch.empty(3, 2, 5, device=device), torch.empty(1, 2, 4, device=device)),
                 version=v)
    with pytest.raises(ValueError, match=r"gi must have shape \(batch, 3\*hidden\) = \(2, 12\)"):
        kgru.ext().gru_gates(torch.zeros(2, 11, device=device), None, None, p[3], None,
                             torch.zeros(2, 4, device=device))
    with pytest.raises(ValueError, match=r"decoder_prep takes exactly one of logits"):
        kgru.ext().decoder_prep(None, None, None, *(torch.zeros(3, 3, device=device) for _ in range(5)))


def test_cpu_tensors_refuse_cuda_versions_and_bad_tokens():
    x, h0, params = _inputs(2, 2, 3, 4)
    with pytest.raises(ValueError, match=r"version 3 is a CUDA kernel but x is on the CPU"):
        kgru.gru(x, h0, params, version="v3")
    with pytest.raises(ValueError, match=r"config must be -1 \(automatic\), 0\.\.7 \(v5's warp grids\), 1\.\.4 "
                                         r"\(v6's layers per launch\) or 1\.\.2 \(v3/v4's exchange: 1 step counters, "
                                         r"2 tagged h\), got 9"):
        kgru.gru(x, h0, params, version="cpu", config=9)
    emb, gtab, gctx = torch.zeros(5, 2), torch.zeros(5, 3), torch.zeros(1, 3)
    with pytest.raises(ValueError, match=r"tokens\[0\] = 9 is outside the vocabulary \[0, 5\)"):
        kgru.ext().decoder_prep(None, torch.tensor([9]), None, emb, gtab, gctx, torch.zeros(1, 2), torch.zeros(1, 3))


@needs_gpu
def test_cuda_bad_input():
    x, h0, params = _inputs(3, 2, 5, 4, device="cuda")
    with pytest.raises(ValueError, match=r"params\[1\] \(w_hh of layer 0\) must be on the same device as x "
                                         r"\(cuda:0\), got cpu"):
        kgru.gru(x, h0, [params[0], params[1].cpu(), params[2], params[3]], version="v2")
    for v in ("v3", "v4", "v5"):
        with pytest.raises(TypeError, match=rf"gru {v} supports Float, Half and BFloat16, got Double"):
            kgru.gru(x.double(), h0.double(), [p.double() for p in params], version=v)
    with pytest.raises(ValueError, match=r"gru v3: config is the exchange between steps: -1 \(the plan's choice\), "
                                         r"1 \(step counters\) or 2 \(tagged h\), got 3"):
        kgru.gru(x, h0, params, version="v3", config=3)
    with pytest.raises(ValueError, match=r"gru v4: config is the exchange between steps.*got 0"):
        kgru.gru(x, h0, params, version="v4", config=0)
    xb, _, pb = _inputs(2, 2, 3, 2048, device="cuda")
    with pytest.raises(ValueError, match=r"gru v3 cannot run batch 2, hidden 2048.*hidden <= 1024.*use v2"):
        kgru.gru(xb, None, pb, version="v3")


def test_each_version_is_held_to_the_ceiling_of_the_units_it_runs_on():
    """v1/v2 and cuDNN run their FLOPs in GEMMs (tensor cores at bf16/fp16), v3/v4 in FP32 FMAs: a bf16 v2 held to the
    FMA probe read 119% of peak (e2c8de7)."""
    from lab.ceilings import peak_for
    ceil = {"fma_tflops": 65.0, "gemm_tflops": {"bfloat16": 700.0, "float32": 51.0, "tf32": 370.0}}
    op = next(o for o in kgru.OPS if o.name == "gru")
    peak = {v.name: peak_for(ceil, torch.bfloat16, v.precision_at(torch.bfloat16), v.ceiling or op.compute_ceiling)
            for v in op.versions}
    assert peak["v2"] == peak["v1"] == peak["torch"] == peak["v5"] == 700.0 and peak["v3"] == peak["v4"] == 65.0
    v5 = next(v for v in op.versions if v.name == "v5")
    assert peak_for(ceil, torch.float32, v5.precision_at(torch.float32), v5.ceiling) == 370.0
    tf32 = next(v for v in op.versions if v.name == "torch.tf32")
    assert peak_for(ceil, torch.float32, tf32.precision_at(torch.float32), tf32.ceiling) == 370.0


def test_default_version_keeps_the_precision_and_follows_the_batch():
    n4, n5 = kgru.V4_MIN_BATCH, kgru.V5_MIN_BATCH
    assert kgru.default_version(torch.bfloat16, n5) == kgru.default_version(torch.float16, n5) == "v5"
    assert kgru.default_version(torch.bfloat16, n5 - 1) == "v4" and kgru.default_version(torch.bfloat16, n4 - 1) == "v3"
    assert kgru.default_version(torch.float32, 4 * n5) == "v4", "float32 must never default to TF32 (v5)"
    assert kgru.default_version(torch.float32, 1) == "v3"
    assert kgru.default_version(torch.float32, 1, layers=2) == kgru.default_version(torch.float32, 256, layers=3) == "v6"
    assert kgru.default_version(torch.bfloat16, n5, layers=2) == "v5"
    assert kgru.default_version(torch.float64, 64) == "v2"
    assert kgru.default_version(torch.float32, 64, cuda=False) == "cpu"
    assert kgru._default(torch.zeros(2, n5, 3, dtype=torch.bfloat16)) == "cpu"


@needs_gpu
@pytest.mark.parametrize("version", ["v3", "v4", "v5", "v6"])
def test_slice_counters_and_grid_barrier_give_the_same_bits(version):
    # the two ways the persistent versions meet between steps change only who waits for whom, not one operation: any
    # missing wait shows up as a bit difference (h read before it was written)
    # v3/v4 have a third: the tagged h words (config 2; the plan's choice at one batch row a block), forced here at
    # every batch, with several rows and chunks a block too
    for dt, B in ((torch.bfloat16, 256), (torch.float32, 130), (torch.float16, 3), (torch.float32, 1)):
        x, h0, params = _inputs(9, B, 40, 200, L=2, dtype=dt, device="cuda", seed=B)
        b = kgru.gru(x, h0, params, version=version, grid_sync=True)
        for config in ((-1, 1, 2) if version in ("v3", "v4") else (-1,)):
            a = kgru.gru(x, h0, params, version=version, config=config)
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), (dt, B, config)


# ---- v6: the stack as a wavefront -------------------------------------------------------------------------------
STACK = registry.get("gru").op("gru_stack")


@pytest.mark.parametrize("device", devices())
def test_stack_every_version_matches_nn_gru(device):
    # 2-4 layers; on the GPU v6 runs them as one wavefront (small hidden), in two launches (512, 3 layers) or layer
    # by layer (hidden 1024), with batch slices and shared-memory chunks: every version against float64 nn.GRU
    dts = [torch.float32] if device == "cpu" else list(STACK.dtypes)
    rs = verify.check_op(STACK, device, dtypes=dts, seeds=(0,) if device == "cpu" else (0, 1))
    assert {r.version for r in rs} == ({"cpu"} if device == "cpu" else {"v1", "v2", "v3", "v4", "v5", "v6"})
    bad = [r.details() for r in rs if not r.passed]
    assert not bad, "\n".join(bad)


@needs_gpu
def test_v6_plan_runs_as_many_layers_as_fit_where_that_pays():
    # hidden 512: 32 blocks per role; 2 layers are 3 roles (96 blocks), 3 layers would be 5 (160 > 132 SMs)
    p2, p3 = kgru.v6_plan(1, 512, 2, 30), kgru.v6_plan(1, 512, 3, 30)
    assert p2["status"] == 0 and p2["layers_per_launch"] == 2 and p2["blocks"] == 3 * p2["hidden_slices"], p2
    assert p3["layers_per_launch"] == 2, p3
    assert kgru.v6_plan(1, 512, 2, 30, config=1)["layers_per_launch"] == 1
    assert kgru.v6_plan(4, 64, 3, 30)["layers_per_launch"] == 3
    assert kgru.v6_plan(1, 1024, 2, 30)["layers_per_launch"] == 1  # 3 roles of 128 blocks do not fit
    # batch 64: the wavefront would leave one batch slice of 64 rows a block; layer by layer has 4 slices of 16
    big, forced = kgru.v6_plan(64, 512, 2, 30), kgru.v6_plan(64, 512, 2, 30, config=2)
    assert big["layers_per_launch"] == 1 and big["batch_slices"] == 4 and big["rows_per_pass"] == 4, big
    assert forced["layers_per_launch"] == 2 and forced["batch_slices"] == 1 and forced["rows_per_block"] == 64
    assert kgru.v6_plan(1, 512, 2, 30, config=5)["status"] == 6
    assert kgru.v6_plan(1, 2048, 2, 30)["status"] == 1


@needs_gpu
@pytest.mark.parametrize("B", [1, 3, 130])
def test_v6_on_one_layer_is_v3_bit_for_bit(B):
    # one layer is one role: v3's split, v3's step (rowstep.cuh), two rows a pass below 8 rows a block (v3) and four
    # from there (v4): the same operations in the same order
    x, h0, params = _inputs(7, B, 24, 200, dtype=torch.float32, device="cuda", seed=B)
    want = kgru.gru(x, h0, params, version="v4" if kgru.v6_plan(B, 200, 1, 7)["rows_per_pass"] == 4 else "v3")
    got = kgru.gru(x, h0, params, version="v6")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@needs_gpu
@pytest.mark.parametrize("dtype", kgru.V3_DTYPES, ids=str)
def test_v6_wavefront_and_layer_by_layer_agree_with_nn_gru(dtype):
    # config 1: a launch per layer (the next layer's input projection a cuBLAS GEMM); -1: one wavefront launch (the
    # projection computed in the launch): both against float64 nn.GRU, and layer 0 identical in both
    x, h0, params = _inputs(11, 5, 48, 160, L=3, dtype=dtype, device="cuda", seed=9)
    ref = kgru.gru_ref(*verify.upcast((x, h0, params)))
    assert kgru.v6_plan(5, 160, 3, 11, dtype)["layers_per_launch"] == 3
    wave = kgru.gru(x, h0, params, version="v6")
    step = kgru.gru(x, h0, params, version="v6", config=1)
    verify.assert_close(wave, ref, dtype, what="v6 wavefront")
    verify.assert_close(step, ref, dtype, what="v6 layer by layer")
    assert torch.equal(wave[1][0], step[1][0]), "layer 0 runs the same operations in both"
    # the wavefront where the plan would not take it: 64 rows a block, four rows a pass (v4's step)
    x, h0, params = _inputs(4, 64, 40, 512, L=2, dtype=dtype, device="cuda", seed=10)
    ref = kgru.gru_ref(*verify.upcast((x, h0, params)))
    verify.assert_close(kgru.gru(x, h0, params, version="v6", config=2), ref, dtype, what="v6 wavefront at batch 64")


@needs_gpu
def test_v6_bad_config_names_its_range():
    x, h0, params = _inputs(3, 2, 5, 8, L=2, device="cuda")
    with pytest.raises(ValueError, match=r"gru v6: config is the most layers one launch runs: -1 \(automatic\) or "
                                         r"1\.\.4, got 0"):
        kgru.gru(x, h0, params, version="v6", config=0)
    with pytest.raises(TypeError, match=r"gru v6 supports Float, Half and BFloat16, got Double"):
        kgru.gru(x.double(), h0.double(), [p.double() for p in params], version="v6")
    xb, _, pb = _inputs(2, 2, 3, 2048, L=2, device="cuda")
    with pytest.raises(ValueError, match=r"gru v6 cannot run batch 2, hidden 2048, 2 layer\(s\).*hidden <= 1024.*use v2"):
        kgru.gru(xb, None, pb, version="v6")


@pytest.mark.parametrize("device", devices())
def test_outputs_sharing_memory_with_an_input_are_refused(device):
    """Every step reads h and the weights while it writes out and h_n: an output that shares memory with x, h0, a
    weight or the other output is refused by name, for every version; the gates kernel, elementwise in (b, j), runs
    in place (h_out = h_prev) and gives the out-of-place answer bit for bit."""
    dev = torch.device(device)
    x, h0, params = _inputs(3, 2, 4, 4, L=1, device=device, seed=2)    # input_size = hidden: out = x fits
    p = list(params)
    for v in [v.name for v in OP.versions_for(dev, torch.float32, kernels_only=True)]:
        with pytest.raises(ValueError, match=r"out shares memory with x: the kernel reads x while it writes out"):
            kgru.gru(x, h0, p, out=(x, torch.empty_like(h0)), version=v)
        with pytest.raises(ValueError, match=r"h_n shares memory with h0"):
            kgru.gru(x, h0, p, out=(torch.empty(3, 2, 4, device=device), h0), version=v)
        with pytest.raises(ValueError, match=r"out shares memory with params\[1\] \(w_hh of layer 0\)"):
            kgru.gru(x, h0, p, out=(p[1].view(-1)[:24].view(3, 2, 4), torch.empty_like(h0)), version=v)
        o = torch.empty(3, 2, 4, device=device)
        with pytest.raises(ValueError, match=r"h_n shares memory with out"):
            kgru.gru(x, h0, p, out=(o, o[2:]), version=v)
    g = torch.Generator().manual_seed(4)
    gi, gh = torch.randn(2, 12, generator=g).to(dev), torch.randn(2, 12, generator=g).to(dev)   # (batch, 3*hidden)
    h = torch.randn(2, 4, generator=g).to(dev)                                                   # (batch, hidden)
    want = kgru.ext().gru_gates(gi, gh, p[2], p[3], h, torch.empty_like(h))
    kgru.ext().gru_gates(gi, gh, p[2], p[3], h, h)
    assert torch.equal(h, want)
    with pytest.raises(ValueError, match=r"h_out shares memory with gi"):
        kgru.ext().gru_gates(gi, gh, p[2], p[3], h, gi.view(-1)[:8].view(2, 4))
    buf = torch.empty(36, device=device)
    with pytest.raises(ValueError, match=r"out shares memory with x"):
        kgru.ext().input_projection(buf[:24].view(4, 6), torch.randn(9, 6, device=device), buf.view(4, 9), None)


# ---- the 3xTF32 projection study (lab/studies/gru.py) -------------------------------------------------------------
def test_split_tf32_is_exact_and_its_high_part_is_tf32():
    from lab.studies.gru import split_tf32
    g = torch.Generator().manual_seed(0)
    a = torch.cat([torch.randn(4096, generator=g) * 10.0 ** torch.randint(-30, 30, (4096,), generator=g),
                   torch.tensor([0.0, -0.0, 1.0, -3.0, 1e-40, -1e-42, 3.4e38, 1.0 + 2.0 ** -23])])
    hi, lo = split_tf32(a)
    assert torch.equal(hi + lo, a)                                   # nothing lost: the sum is a, exactly
    assert not (hi.view(torch.int32) & 8191).any()                   # hi fits TF32's 10 mantissa bits
    normal = a.abs() >= torch.finfo(torch.float32).tiny
    assert (lo[normal].abs() < a[normal].abs() * 2.0 ** -10).all()  # lo is below hi's last bit
    assert lo[a == 1.0 + 2.0 ** -23].item() == 2.0 ** -23


@needs_gpu
def test_3xtf32_products_recover_fp32_accuracy_that_one_tf32_gemm_loses():
    # The study's claim on its own numbers: against a float64 product, one TF32 GEMM's error is ~2^-11-ish, the three
    # TF32 GEMMs of the split (accumulated apart) are within a small factor of cuBLAS's fp32 GEMM, the K-tripled one
    # GEMM sits between them.
    from lab.studies.gru import split_tf32, _fp32, _tf32, _three
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(333, 256, generator=g).cuda()                   # (T*B, I)
    w = (torch.randn(1536, 256, generator=g) / 16).cuda()           # W_ih: (3H, I)
    ref = x.double() @ w.double().t()
    err = lambda r: ((r.double() - ref).norm() / ref.norm()).item()
    xh, xl = split_tf32(x)
    wh, wl = split_tf32(w)
    e32, e1 = err(_fp32(x, w)), err(_tf32(x, w))
    e3 = err(_three(xh, xl, wh, wl))
    ek = err(_tf32(torch.cat([xh, xh, xl], 1), torch.cat([wh, wl, wh], 1)))
    assert e1 > 100 * e32, (e1, e32)         # TF32 alone: ~10 bits of mantissa
    assert e3 < 8 * e32, (e3, e32)           # three products, accumulated apart: fp32-class
    assert e3 <= ek < e1 / 10, (e3, ek, e1)  # one accumulator for all three: worse, still far better than TF32
