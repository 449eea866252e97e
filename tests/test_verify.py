"""The verification machinery itself: it must fail what is wrong."""
import math

import pytest
import torch

from lab import verify
from lab.registry import Op, Version

from conftest import devices


def test_compare_exact_and_scaled_error():
    ref = torch.randn(1000, dtype=torch.float64)
    c = verify.compare(ref.clone(), ref)
    assert c.rel_err == 0 and c.nonfinite == 0
    noisy = ref * (1 + 1e-3)
    assert verify.compare(noisy, ref).rel_err == pytest.approx(1e-3, rel=1e-6)


def test_a_cancelling_sum_is_held_to_its_terms_scale():
    # a dot product whose terms cancel: the same absolute error is large against the value, small against the
    # root-sum-square of the terms (Op.scale); the scale never forgives a NaN or an error of the terms' own size
    a = torch.tensor([3.0, -2.0, 1.0, -2.0 + 1e-3], dtype=torch.float64)
    b = torch.ones(4, dtype=torch.float64)
    ref = (a * b).sum().reshape(1)                       # 1e-3: the terms cancel
    scale = ((a * a) * (b * b)).sum().sqrt().reshape(1)  # ~4.2
    got = ref + 4e-3                                     # one bf16 rounding of a term of size ~2
    assert verify.compare(got, ref).rel_err == pytest.approx(4.0)
    assert verify.compare(got, ref, scale=scale).rel_err == pytest.approx(4e-3 / float(scale), rel=1e-9)
    verify.assert_close(got, ref, torch.bfloat16, scale=scale)
    with pytest.raises(AssertionError, match="relative error"):
        verify.assert_close(ref + 0.5, ref, torch.bfloat16, scale=scale)
    with pytest.raises(AssertionError, match="non-finite"):
        verify.assert_close(torch.full_like(ref, math.nan), ref, torch.bfloat16, scale=scale)


def test_nan_never_passes():
    ref = torch.randn(100, dtype=torch.float64)
    out = ref.clone()
    out[17] = math.nan
    c = verify.compare(out, ref)
    assert c.nonfinite == 1 and math.isinf(c.rel_err)
    assert c.worst[0][0] == (17,)
    with pytest.raises(AssertionError, match="non-finite"):
        verify.assert_close(out, ref, torch.float32)


def test_inf_where_reference_finite_fails():
    ref = torch.ones(4, 4, dtype=torch.float64)
    out = ref.clone()
    out[2, 3] = math.inf
    c = verify.compare(out, ref)
    assert c.nonfinite == 1 and c.worst[0][0] == (2, 3)


def test_tolerance_table_is_per_dtype_and_tf32_is_looser_than_fp32():
    assert verify.tolerance(torch.float64) < verify.tolerance(torch.float32) < verify.tolerance(torch.float32, "tf32")
    assert verify.tolerance(torch.float16) < verify.tolerance(torch.bfloat16)


def _op(fn_writes_half: bool):
    def kernel(x, out=None):
        out = torch.empty_like(x) if out is None else out
        n = x.numel() // 2 if fn_writes_half else x.numel()
        out.view(-1)[:n] = x.view(-1)[:n] * 2
        return out
    return Op("t", "double", lambda s, dt, dev, g: (torch.randn(s["n"], generator=g, dtype=dt).to(dev),),
              lambda x: x * 2, [Version("v1", kernel, "any")], [{"n": 10}], [{"n": 10}])


def test_poisoned_output_catches_unwritten_elements():
    # torch.empty_like may hand back memory that already holds the right answer; poisoning makes that impossible
    op = _op(fn_writes_half=True)
    r = verify.check_version(op, op.versions[0], {"n": 10}, torch.float32, "cpu")
    assert not r.passed and "NaN" in r.problem
    good = _op(fn_writes_half=False)
    assert verify.check_version(good, good.versions[0], {"n": 10}, torch.float32, "cpu").passed


def test_wrong_answer_fails_with_worst_elements_reported():
    op = _op(False)
    op.reference = lambda x: x * 2.001
    r = verify.check_version(op, op.versions[0], {"n": 10}, torch.float32, "cpu")
    assert not r.passed and "over tolerance" in r.problem
    assert len(r.worst) > 0 and "got" in r.details()


def test_kernel_ignoring_out_is_caught():
    op = _op(False)
    op.versions[0].fn = lambda x, out=None: x * 2
    r = verify.check_version(op, op.versions[0], {"n": 10}, torch.float32, "cpu")
    assert not r.passed and "out=" in r.problem


def test_several_seeds_draw_different_inputs():
    seen = []
    op = _op(False)
    base = op.make_inputs
    op.make_inputs = lambda s, dt, dev, g: seen.append(base(s, dt, dev, g)[0]) or (seen[-1],)
    verify.check_version(op, op.versions[0], {"n": 10}, torch.float32, "cpu", seeds=(0, 1, 2))
    assert len(seen) == 3 and not torch.equal(seen[0], seen[1])
    assert all(bool((x != 0).all()) for x in seen)



def test_lean_check_runs_no_baseline_and_still_fails_a_wrong_version():
    # lean (for compute-sanitizer): reference on the CPU, the baseline not run; a wrong kernel still fails
    calls = []

    def baseline(x):
        calls.append(1)
        return x * 2

    def wrong(x, out=None):
        out = torch.empty_like(x) if out is None else out
        out.copy_(x * 2 + 1e-3)
        return out
    op = Op("t", "double", lambda s, dt, dev, g: (torch.randn(s["n"], generator=g, dtype=dt).to(dev),),
            lambda x: x * 2, [Version("v1", _op(False).versions[0].fn, "any"), Version("bad", wrong, "any"),
                              Version("torch", baseline, "any", baseline=True, takes_out=False)],
            [{"n": 100}], [{"n": 100}])
    full = verify.check_version(op, op.versions[0], {"n": 100}, torch.float32, "cpu", seeds=(0,))
    assert full.passed and full.torch_rel_err == 0.0 and calls == [1]
    lean = verify.check_version(op, op.versions[0], {"n": 100}, torch.float32, "cpu", seeds=(0,), lean=True)
    assert lean.passed and lean.torch_rel_err is None and calls == [1]
    bad = verify.check_version(op, op.versions[1], {"n": 100}, torch.float32, "cpu", seeds=(0,), lean=True)
    assert not bad.passed and "over tolerance" in bad.problem
    # a lean sweep of the op checks our versions, not the baseline (checkable here: a Triton baseline would be)
    op.versions[2].check = True
    names = [r.version for r in verify.check_op(op, "cpu", [torch.float32], seeds=(0,), lean=True)]
    assert names == ["v1", "bad"] and calls == [1]
    names = [r.version for r in verify.check_op(op, "cpu", [torch.float32], ["torch"], seeds=(0,), lean=True)]
    assert names == ["torch"]


def test_a_few_wrong_elements_fail_though_the_norm_passes():
    """The norm-relative error alone lets a few sign-flipped elements through at bf16's tolerance; the worst-element
    bound (against the reference's RMS) does not, while bf16's honest rounding of every element passes."""
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(200_000, generator=gen, dtype=torch.float64)
    tol = verify.tolerance(torch.bfloat16)
    rounded = ref.to(torch.bfloat16).to(torch.float64)
    assert verify.compare(rounded, ref).fails(tol) == ""
    flipped = rounded.clone()
    idx = torch.nonzero(ref.abs() > 1.0)[:10, 0]          # 10 of 200000 elements (0.005%), each |x| > 1
    flipped[idx] = -flipped[idx]
    c = verify.compare(flipped, ref)
    assert c.rel_err < tol                                  # the norm alone would pass it
    assert "worst element" in c.fails(tol)
    with pytest.raises(AssertionError, match="worst element"):
        verify.assert_close(flipped, ref, torch.bfloat16)


def test_check_version_fails_a_kernel_with_one_wrong_element():
    def kernel(x, out=None):
        out = torch.empty_like(x) if out is None else out
        out.copy_(x * 2)
        out.view(-1)[x.numel() // 2] *= -1                   # one element of 40009 with its sign flipped
        return out
    op = Op("t", "double", lambda s, dt, dev, g: (torch.randn(s["n"], generator=g, dtype=dt).to(dev) + 3,),
            lambda x: x * 2, [Version("v1", kernel, "any")], [{"n": 40009}], [{"n": 40009}])
    r = verify.check_version(op, op.versions[0], {"n": 40009}, torch.bfloat16, "cpu")
    assert not r.passed and "worst element" in r.problem, r.line()



@pytest.mark.parametrize("device", devices())
def test_version_without_out_gets_poisoned_memory(device):
    # A version that allocates its own output and fills all but the last element: its torch.empty may get a block that
    # held anything (the caching allocator's last output, malloc's reuse). The check must see poison there, not
    # whatever the block held: reference x * 2.
    calls = []

    def forgetful(x):
        y = torch.empty_like(x)
        n = x.numel() - 1                                 # never writes the last element
        calls.append(n)
        y.view(-1)[:n] = x.view(-1)[:n] * 2
        return y

    op = Op("t", "double", lambda s, dt, dev, g: (torch.randn(s["n"], generator=g).to(dev, dt),), lambda x: x * 2,
            [Version("v1", forgetful, "any", takes_out=False)], [{"n": 4099}], [{"n": 4099}])
    res = verify.check_version(op, op.versions[0], {"n": 4099}, torch.float32, device, seeds=(0,))
    assert not res.passed and "NaN" in res.problem, res.line()
    # (the CPU's malloc makes no promise to hand back the freed block: torch.empty is NaN-filled for the run, and the
    # deterministic mode that takes is switched off again after it)
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory


def test_worst_element_scale_ignores_a_mostly_zero_reference():
    # an embedding gradient over a million-row vocabulary: nearly every row is 0, so the rms over all elements is tiny
    # and a correctly rounded bf16 sum would fail against it; over the nonzero elements it passes
    g = torch.Generator().manual_seed(3)
    ref = torch.zeros(1_000_000, 8, dtype=torch.float64)                                    # (V, dim)
    ref[torch.randperm(1_000_000, generator=g)[:20]] = torch.randn(20, 8, generator=g, dtype=torch.float64) * 3
    assert verify.compare(ref.to(torch.bfloat16), ref).fails(verify.tolerance(torch.bfloat16)) == ""
    # and one sign-flipped element still fails on the element bound where the norm lets it through
    ref = torch.zeros(100_000, 8, dtype=torch.float64)
    ref[torch.randperm(100_000, generator=g)[:20_000]] = torch.randn(20_000, 8, generator=g, dtype=torch.float64)
    bad = ref.to(torch.bfloat16)
    i = int(ref.abs().amax(1).argmax())
    bad[i] = -bad[i]
    why = verify.compare(bad, ref).fails(verify.tolerance(torch.bfloat16))
    assert why.startswith("worst element"), why
