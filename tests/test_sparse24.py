"""2:4 sparsity: pruning keeps the 2 largest magnitudes of every group; the compressed format round-trips exactly and
matches an independent Python encoding nibble for nibble; every version of y = x·Wᵀ + b matches F.linear with the
pruned weight in float64 (odd sizes, several seeds, poisoned outputs); a weight that is not 2:4, or bad input, is a
clear error naming it."""
import pytest
import torch
import torch.nn.functional as F

from lab import registry, verify
from lab.kernels import sparse24 as S
from lab.kernels._common import randn

from conftest import devices, needs_gpu

FAM = registry.get("sparse24")
DTYPES = [torch.bfloat16, torch.float16]


def _rand(shape, dtype, device, seed, scale=1.0):
    return randn(shape, dtype, device, torch.Generator().manual_seed(seed), scale=scale)


def _versions(device):
    return ["cpu"] if device == "cpu" else ["v1", "v2", "v3", "v4"]


def _encode_python(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The format written out element by element in Python (sparse24.cuh's rules), to hold compress to."""
    n, k = w.shape
    kp = S.padded_k(k)
    wf = w.float().cpu()
    values = torch.zeros(n, kp // 2, dtype=torch.float32)
    meta = torch.zeros(n, kp // 32, dtype=torch.int64)
    for r in range(n):
        for g in range(kp // 4):
            v = [float(wf[r, 4 * g + i]) if 4 * g + i < k else 0.0 for i in range(4)]
            nz = [i for i in range(4) if v[i] != 0.0]
            assert len(nz) <= 2
            if len(nz) == 2:
                i0, i1 = nz
            elif len(nz) == 1:
                i0, i1 = (2, 3) if nz[0] == 3 else (nz[0], nz[0] + 1)
            else:
                i0, i1 = 0, 1
            values[r, 2 * g], values[r, 2 * g + 1] = v[i0], v[i1]
            meta[r, g // 8] |= (i0 | (i1 << 2)) << (4 * (g % 8))
    meta = torch.where(meta >= 2 ** 31, meta - 2 ** 32, meta).to(torch.int32)
    return values.to(w.dtype), meta


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("op", [o.name for o in FAM.ops])
def test_every_version_matches_reference(op, device):
    verify.assert_op_passes(FAM.op(op), device)


@pytest.mark.parametrize("device", devices())
def test_larger_shapes(device):
    op = FAM.op("linear")
    shapes = S.CHECK_LARGE if device == "cuda" else S.CHECK_LARGE[:2]
    verify.assert_op_passes(op, device, shapes=shapes, seeds=(5,))


def test_prune_keeps_the_two_largest_magnitudes():
    w = _rand((9, 23), torch.float32, "cpu", 0)
    w[0, :4] = torch.tensor([1.0, -3.0, 3.0, 0.5])       # a tie in magnitude: the lower column wins
    p = S.prune(w)
    assert p.shape == w.shape and S.is_24(p)
    for r in range(w.shape[0]):
        for g in range(0, 23, 4):
            grp, kept = w[r, g:g + 4], p[r, g:g + 4]
            want = sorted(range(len(grp)), key=lambda i: (-abs(float(grp[i])), i))[:2]
            for i in range(len(grp)):
                assert float(kept[i]) == (float(grp[i]) if i in want else 0.0), (r, g, i)
    assert p[0, :4].tolist() == [0.0, -3.0, 3.0, 0.0]
    with pytest.raises(ValueError, match="2-D"):
        S.prune(torch.ones(4))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
def test_compress_matches_python_encoding_and_round_trips(dtype, device):
    # groups with 0, 1 (at every position) and 2 nonzeros, K not a multiple of 4 or 32
    w = S.prune(_rand((13, 71), torch.float32, "cpu", 1))
    w[0, :4] = 0
    for i in range(4):
        w[1, 4 * i:4 * i + 4] = 0
        w[1, 4 * i + i] = 1.5
    w[2, 68:] = 0
    w = w.to(dtype).to(device)
    packed = S.compress(w)
    values, meta = _encode_python(w)
    assert torch.equal(packed.meta.cpu(), meta)
    assert torch.equal(packed.values.cpu(), values)
    assert torch.equal(packed.to_dense(), w)
    # every nibble is one of the six valid ones (never 0b0000, 0b0101, 0b1010, 0b1111)
    nib = (packed.meta.cpu().unsqueeze(-1) >> torch.arange(0, 32, 4, dtype=torch.int32)) & 0xF
    assert not torch.isin(nib, torch.tensor([0, 5, 10, 15], dtype=torch.int32)).any()


@pytest.mark.parametrize("device", devices())
def test_weight_that_is_not_24_is_refused_with_where(device):
    w = S.prune(_rand((6, 40), torch.float32, "cpu", 2))
    w[4, 9] = w[4, 10] = w[4, 11] = 1.0                   # group 2 of row 4 (columns 8..11): 3 nonzeros
    w[5, 0:4] = 1.0                                       # a later bad group: the first one is named
    with pytest.raises(ValueError, match=r"not 2:4 sparse: row 4, columns 8\.\.11"):
        S.compress(w.bfloat16().to(device))


@pytest.mark.parametrize("device", devices())
def test_bad_input_is_named(device):
    w = S.prune(_rand((8, 64), torch.float32, "cpu", 3)).bfloat16().to(device)
    packed = S.compress(w)
    x = _rand((2, 64), torch.bfloat16, device, 4)
    v = _versions(device)[0]
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., in_features\) with in_features = 64"):
        S.linear(_rand((2, 63), torch.bfloat16, device, 4), packed, version=v)
    with pytest.raises(TypeError, match="x must be BFloat16 or Half, got Float"):
        S.linear(x.float(), packed, version=v)
    with pytest.raises(TypeError, match=r"values must have the same dtype as x \(Half\), got BFloat16"):
        S.linear(x.half(), packed, version=v)             # x fp16, weight bf16
    with pytest.raises(ValueError, match=r"bias must have shape \(out_features,\)"):
        S.linear(x, packed, torch.zeros(7, dtype=torch.bfloat16, device=device), version=v)
    bad_meta = S.Sparse24Weight(packed.values, packed.meta.long(), 64)
    with pytest.raises(TypeError, match="meta must be Int, got Long"):
        S.linear(x, bad_meta, version=v)
    short = S.Sparse24Weight(packed.values[:, :16].contiguous(), packed.meta, 64)
    with pytest.raises(ValueError, match="values must have shape"):
        S.linear(x, short, version=v)
    with pytest.raises(TypeError, match="Sparse24Weight"):
        S.linear(x, w, version=v)
    with pytest.raises(ValueError, match="CUDA versions are 1..4, got 5" if device == "cuda" else
                       "version 1 is a CUDA kernel but x is on the CPU"):
        S.linear(x, packed, version="v5" if device == "cuda" else "v1")
    with pytest.raises(ValueError, match="weight must be 2-D"):
        S.compress(w[0])
    xg = x.clone().requires_grad_()
    with pytest.raises(ValueError, match="requires grad"):
        S.linear(xg, packed, version=v)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
def test_leading_dims_empty_and_k_zero(dtype, device):
    w = S.prune(_rand((5, 33), torch.float32, "cpu", 6)).to(dtype).to(device)
    packed, b = S.compress(w), _rand((5,), dtype, device, 7)
    x = _rand((2, 3, 33), dtype, device, 8)
    for v in _versions(device):
        got = S.linear(x, packed, b, version=v)
        verify.assert_close(got, F.linear(x.double(), w.double(), b.double()), dtype, what=f"{v} (2, 3, K)")
        assert S.linear(x[:0], packed, b, version=v).shape == (0, 3, 5)
    w0 = torch.zeros(5, 0, dtype=dtype, device=device)
    p0 = S.compress(w0)
    for v in _versions(device):
        assert torch.equal(S.linear(torch.zeros(2, 0, dtype=dtype, device=device), p0, b, version=v),
                           b.expand(2, 5))


@pytest.mark.parametrize("device", devices())
def test_nan_in_x_reaches_only_its_row(device):
    # a NaN in row 1 of x: row 1 of y is NaN wherever W reads that column, the other rows stay finite
    w = S.prune(_rand((16, 64), torch.float32, "cpu", 9)).bfloat16().to(device)
    packed = S.compress(w)
    x = _rand((3, 64), torch.bfloat16, device, 10)
    x[1, 5] = float("nan")
    for v in _versions(device):
        y = S.linear(x, packed, version=v).float().cpu()
        reads = (w[:, 5] != 0).cpu()
        assert torch.isnan(y[1, reads]).all() and torch.isfinite(y[1, ~reads]).all(), v
        assert torch.isfinite(y[[0, 2]]).all(), v


@needs_gpu
def test_versions_agree_with_cusparselt_where_torch_makes_one():
    w = S.prune(_rand((256, 512), torch.float32, "cpu", 11)).bfloat16().cuda()
    packed = S.compress(w, make_semi=True)
    if packed.semi is None:
        pytest.skip(f"torch made no semi-structured tensor here: {packed.semi_error}")
    x = _rand((64, 512), torch.bfloat16, "cuda", 12)
    ref = F.linear(x.double(), w.double())
    verify.assert_close(S.linear_cusparselt(x, w, packed), ref, torch.bfloat16, what="cusparselt")
    for v in ("v1", "v2", "v3", "v4"):
        verify.assert_close(S.linear(x, packed, version=v), ref, torch.bfloat16, what=v)


def _kernels(fn) -> set[str]:
    """Names of the CUDA kernels one call of fn launches (torch.profiler)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_v4_runs_its_own_kernel_where_tma_takes_x_and_v2_elsewhere(dtype):
    # K % 8 == 0 and aligned x: the wgmma.sp kernel itself (on a Hopper GPU); K = 1283 (rows of x not 16-byte
    # multiples) and an x that starts 2 bytes into its storage: v2's kernel, the same product
    hopper = torch.cuda.get_device_capability()[0] == 9
    for k, offset in ((776, 0), (1283, 0), (776, 1)):
        w = S.prune(_rand((260, k), torch.float32, "cpu", 13)).to(dtype).cuda()
        packed, b = S.compress(w), _rand((260,), dtype, "cuda", 14)
        storage = _rand((300 * k + offset,), dtype, "cuda", 15)
        x = storage[offset:].view(300, k)                         # (300, K), contiguous, maybe misaligned
        y = torch.full((300, 260), float("nan"), dtype=dtype, device="cuda")   # poisoned
        names = _kernels(lambda: S.linear(x, packed, b, out=y, version="v4"))
        verify.assert_close(y, F.linear(x.double(), w.double(), b.double()), dtype, what=f"v4 K={k} offset={offset}")
        own = any("v4_kernel" in n for n in names)
        assert own == (hopper and k % 8 == 0 and offset == 0), (k, offset, sorted(names))
        assert own or any("v2_kernel" in n for n in names), sorted(names)


def test_goals_read_the_best_kernel_against_dense_in_the_same_mode():
    from lab.studies import sparse24 as SS

    def row(version, m, n, k, us, speedup, mode="events", op="linear"):
        return {"op": op, "version": version, "dtype": "bfloat16", "mode": mode, "median_us": us,
                "speedup": speedup, "shape": f"M={m} N={n} K={k} bias=1"}
    sq = (4096, 4096, 4096)
    rows = [row("torch", *sq, 180.0, 1.0), row("v1", *sq, 9000.0, 0.02), row("v2", *sq, 450.0, 0.4),
            row("v1", 1, 4096, 4096, 14.0, 1.6), row("v3", 1, 4096, 4096, 16.0, 1.4),
            row("v1", 1, 4096, 4096, 15.0, 1.45, mode="graph"),
            row("v1", 1, 5893, 1280, 11.0, 1.3, op="fc_out")]
    got = {(g["goal"].split(":")[0], g["mode"]): g for g in SS.goals(rows)}
    big = got[("4096 x 4096 x 4096", "eager")]
    assert big["version"] == "v2" and abs(big["margin"] - 0.4 / 1.5) < 1e-12 and not big["met"]
    one = got[("batch 1, 4096 x 4096 weight", "eager")]
    assert one["version"] == "v1" and one["met"] and abs(one["margin"] - 1.6 / 1.5) < 1e-12
    assert not got[("batch 1, 4096 x 4096 weight", "graph")]["met"]     # graph is read against graph rows only
    assert ("4096 x 4096 x 4096", "graph") not in got                  # no graph rows: no goal line
    assert got[("batch 1, fc_out 1280 -> 5893", "eager")]["target"] is None
    table = SS.against(rows, "linear")
    assert "v2" in table and "2.50x" not in table and f"{180.0 / 450.0:13.2f}x" in table


def test_designs_table_sets_each_tensor_core_design_against_dense_with_its_ncu_reading():
    from lab.studies import sparse24 as SS
    sq = "M=4096 N=4096 K=4096 bias=1"
    rows = [{"op": "linear", "version": v, "dtype": "bfloat16", "mode": "events", "median_us": us, "speedup": sp,
             "shape": sq} for v, us, sp in (("torch", 180.0, 1.0), ("v2", 450.0, 0.4), ("v4", 150.0, 1.2))]
    rows.append(dict(rows[2], mode="graph", median_us=1.0, speedup=180.0))   # another mode: not read
    def k(v, kernel, us, tc, ts, stall):
        return {"op": "linear", "version": v, "dtype": "bfloat16", "shape": sq, "kernel": kernel, "duration_us": us,
                "tensor_pct": tc, "sm_pct": 50.0, "timestamp": ts, "stall1": stall, "stall1_ratio": 2.5}
    ncu = [k("v4", "v4_kernel", 999.0, 10.0, "2026-01-01", "old"),
           k("v4", "v4_kernel", 160.0, 70.0, "2026-02-01", "gmma"),
           k("v4", "tiny_kernel", 2.0, 0.0, "2026-02-01", "x"),
           k("torch", "nvjet_gemm", 170.0, 94.0, "2026-02-01", "barrier")]
    lines = SS.designs(rows, ncu).splitlines()
    v2 = next(l for l in lines if l.startswith("v2 "))
    v4 = next(l for l in lines if l.startswith("v4 "))
    assert "450.0" in v2 and "0.40x" in v2 and f"{0.4 / 1.5:7.2f}" in v2 and "no ncu row" in v2
    assert "150.0" in v4 and "1.20x" in v4 and f"{1.2 / 1.5:7.2f}" in v4
    assert "v4_kernel" in v4 and "160.0" in v4 and "70.0" in v4 and "gmma 2.50" in v4 and "old" not in v4
    assert "nvjet_gemm" in next(l for l in lines if l.startswith("torch "))


@pytest.mark.parametrize("device", devices())
def test_out_sharing_memory_with_an_input_is_refused(device):
    """Every output tile reads whole rows of x and of the compressed weight: an out that shares memory with either
    is refused by name, for every version (before, the answer depended on the order the tiles ran in)."""
    w = S.prune(_rand((8, 64), torch.float32, "cpu", 5)).bfloat16().to(device)   # (out_features, in_features)
    packed = S.compress(w)
    for v in _versions(device):
        x = _rand((2, 64), torch.bfloat16, device, 6)                               # (batch, in_features)
        with pytest.raises(ValueError, match=r"out shares memory with x: the kernel reads x while it writes out"):
            S.linear(x, packed, out=x.view(-1)[:16].view(2, 8), version=v)
        with pytest.raises(ValueError, match=r"out shares memory with values"):
            S.linear(x, packed, out=packed.values.view(-1)[:16].view(2, 8), version=v)
