"""Registers the `faulty` test family (tests/faulty/): y = 2x, with deliberately broken versions beside right ones.

Imported by the isolation, watch and magic tests, in the test process and in lab.isolate's workers. Its sources are
copied with lab's shared headers into a scratch source root ($LAB_SRC_ROOT) by the tests' fixture.
"""
import torch

from lab import build
from lab.registry import Family, Op, Version, register


def _fn(version):
    def run(x, out=None):
        out = torch.empty_like(x) if out is None else out
        return build.load("faulty").scale(x, out, version)
    return run


def _wrong(x, out=None):
    """A version that runs fine and is wrong (3x, not 2x): bench must check before it times."""
    out = torch.empty_like(x) if out is None else out
    return torch.mul(x, 3, out=out)


OP = Op(
    family="faulty", name="scale",
    make_inputs=lambda shape, dtype, device, gen: (torch.randn(shape["n"], generator=gen).to(dtype).to(device),),
    reference=lambda x: 2 * x,
    versions=[Version("cpu", _fn("cpu"), "cpu"), Version("crash", _fn("crash"), "cpu"),
              Version("hang", _fn("hang"), "cpu"), Version("wrong", _wrong, "cpu"), Version("v1", _fn("v1"), "cuda"),
              Version("oob", _fn("oob"), "cuda"), Version("spin", _fn("spin"), "cuda"),
              Version("torch", lambda x: 2 * x, "any", baseline=True, takes_out=False, check=False)],
    check_shapes=[{"n": 1}, {"n": 1031}], bench_shapes=[{"n": 1 << 20}], cpu_bench_shapes=[{"n": 1 << 16}],
    dtypes=(torch.float32,), nbytes=lambda s, d: 8 * s["n"])
register(Family("faulty", "deliberately faulty versions (tests only)", [OP]))
