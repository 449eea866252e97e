"""Every CUDA source compiles and links (CI: no GPU, TORCH_CUDA_ARCH_LIST=9.0 set by conftest); the module imports
and its CPU code runs from the CUDA build too."""
import os

import pytest
import torch

from lab import build, env


def _reason():
    if torch.version.cuda is None:
        return "this torch is a CPU build: compiling CUDA extensions needs a CUDA build of torch"
    if not torch.cuda.is_available() and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return "no GPU and no TORCH_CUDA_ARCH_LIST"
    return None


CUDA_FAMILIES = sorted({p.stem for p in env.CUDA_SRC.glob("*.cu")} |
                       {p.name for p in env.CUDA_SRC.iterdir() if p.is_dir() and build.is_folder_family(p.name)})


@pytest.mark.skipif(_reason() is not None, reason=str(_reason()))
@pytest.mark.parametrize("family", CUDA_FAMILIES)
def test_cuda_source_builds(family):
    m = build.load(family, "cuda")
    s = build.spec(family, "cuda")
    assert m.__lab_key__ == s.binding.key
    if s.units:  # every unit (and variant) loaded and handed its launchers to the binding
        owners = build.exports(family, "cuda")
        assert set(m._lab_launchers()) == set(owners)
        assert {u.display for u in s.units} == set(owners.values())
