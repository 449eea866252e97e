"""The kernel lab: CUDA/C++ kernels for PyTorch, read from disk, JIT-built, verified, timed, profiled and plotted.

    import lab
    ext = lab.load("basics")                 # cpp_src/basics/ + cuda_src/basics/, built (or cached), units loaded
    fam = lab.family("basics")               # ops, versions, references, shapes, byte/FLOP formulas
    lab.verify.check_op(fam.op("square"), "cuda")
    lab.bench.bench_op(fam.op("square"), "cuda")
    lab.watch("basics", op="square")         # rebuild, check and time on every save
    %load_ext lab                            # in a notebook: %%lab_source, %lab_check, %lab_bench, %lab_watch

Read top-down: build -> verify -> timing -> ceilings -> bench -> profile -> results -> plot; the CLI is
`python -m lab`.

`import lab` costs little over `import torch`: the harness modules, the families and matplotlib are imported on
first use (attribute access), not here.
"""
from __future__ import annotations

import importlib

from . import env  # noqa: F401  (first: it points CUDA_HOME at the toolkit)
from .build import BuildError, load  # noqa: F401,E402

_SUBMODULES = {"build", "verify", "timing", "ceilings", "bench", "registry", "results", "plot", "profile", "report",
               "isolate", "notebooks", "buildtime", "magic", "kernels", "models", "watcher", "nn", "optim", "steps",
               "compare", "page", "studies"}

__all__ = ["load", "family", "families", "watch", "BuildError", "build", "verify", "bench", "registry", "results",
           "env", "isolate"]


# The imports inside the functions below are lazy on purpose (`import lab` stays cheap, see above), not to dodge a
# cycle: tests/test_imports.py allows them here and nowhere else in the package.
def family(name: str):
    """The registered family `name` (imports lab.kernels on first use)."""
    from .registry import get
    return get(name)


def families():
    from .registry import families as _families
    return _families()


def watch(family: str, **kwargs):
    """lab.watcher.watch: rebuild, check and time the family's versions on every save (interrupt to stop)."""
    from .watcher import watch as _watch
    return _watch(family, **kwargs)


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'lab' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    """`%load_ext lab`: the notebook magics (lab/magic.py)."""
    from .magic import register
    register(ipython)
