"""lab.profile: the per-operator device time adds up to the device time, each kernel once."""
from types import SimpleNamespace as NS

from torch.autograd import DeviceType

from lab import profile


def test_profile_counts_each_kernel_once():
    """torch.profiler lists a kernel as a device event and inside its operator's self device time: the per-operator
    table counts it once, under the operator; a kernel launched outside any operator keeps its own name."""
    def dev(name, us):
        return NS(name=name, device_type=DeviceType.CUDA, time_range=NS(elapsed_us=lambda: us))
    events = [NS(name="aten::mm", device_type=DeviceType.CPU, is_async=False,
                 kernels=[NS(name="sm90_gemm", duration=10.0)]),
              NS(name="aten::add", device_type=DeviceType.CPU, is_async=False,
                 kernels=[NS(name="add_kernel", duration=2.0)]),
              NS(name="cudaLaunchKernel", device_type=DeviceType.CPU, is_async=False, kernels=[]),
              dev("sm90_gemm", 10.0), dev("add_kernel", 2.0), dev("gru_v3_kernel", 30.0)]
    got = profile.attribute_device_time(events, reps=2)
    assert got == {"gru_v3_kernel": 15.0, "aten::mm": 5.0, "aten::add": 1.0}
    assert sum(got.values()) == (10.0 + 2.0 + 30.0) / 2          # the device time, once
