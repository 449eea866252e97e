"""The kernel lab: CUDA/C++ kernels for PyTorch, read from disk, JIT-built, verified, timed, profiled and plotted.

    import lab
    ext = lab.load("basics")                 # cuda_src/basics.cu + cpp_src/basics.cpp, built (or cached)
    fam = lab.family("basics")               # ops, versions, references, shapes, byte/FLOP formulas
    lab.verify.check_op(fam.op("square"), "cuda")
    lab.bench.bench_op(fam.op("square"), "cuda")

Read top-down: build -> verify -> bench -> profile -> results -> plot; the CLI is `python -m lab`.
"""
from . import env  # noqa: F401  (first: it points CUDA_HOME at the toolkit)
from . import bench, build, registry, results, verify  # noqa: F401,E402
from .build import BuildError, load  # noqa: F401
from .registry import families, get as family  # noqa: F401

__all__ = ["load", "family", "families", "BuildError", "build", "verify", "bench", "registry", "results", "env"]
