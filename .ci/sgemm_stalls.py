"""One launch each of linear v8, v9 and cuBLAS fp32 (TF32 off) at 4096^3, for Nsight Compute to read the warp
stall reasons, issue-slot use and clock of the SIMT kernels against cuBLAS (the evidence for issue 4's SIMT gap).
usage (on the GPU; build linear first so the JIT build is not profiled):
  ncu --clock-control none -k regex:"async_copy_warptile|gemm" --section WarpStateStats --section SchedulerStats \
      --section SpeedOfLight --section Occupancy --csv --page details python .ci/sgemm_stalls.py
"""
import torch

from lab.kernels import linear as L

torch.backends.cuda.matmul.allow_tf32 = False
g = torch.Generator(device="cuda").manual_seed(0)
n = 4096
x = torch.randn(n, n, device="cuda", generator=g)   # x: (M, K)
w = torch.randn(n, n, device="cuda", generator=g)   # w: (N, K), nn.Linear layout
y = torch.empty(n, n, device="cuda")                # y: (M, N)
for v in ("v8", "v9"):
    L.linear(x, w, None, y, version=v)
ref = torch.nn.functional.linear(x, w)
torch.cuda.synchronize()
print("max |v9 - cuBLAS| =", float((y - ref).abs().max()))
