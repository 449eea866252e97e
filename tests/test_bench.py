"""lab.bench's parts that run without a GPU: the L2 flush's mode is checked before anything touches a device."""
import pytest

from lab import bench


@pytest.mark.parametrize("how", ["arg", "env"])
def test_unknown_flush_mode_is_a_clear_error(how, monkeypatch):
    if how == "env":
        monkeypatch.setenv("LAB_FLUSH", "clean")
    with pytest.raises(ValueError, match=r"L2 flush mode must be one of \('write', 'read'\), got 'clean'"):
        bench.flush_l2("cpu", mode="clean" if how == "arg" else None)
