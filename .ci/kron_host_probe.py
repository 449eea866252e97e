"""Why does kron v5's eager call cost the host ~54 us in lab.timing (the bf16 tuning table at batch 1-1024, against
v3's ~16) when its graph replay at batch 32 takes 7.6 us, and an unfrozen back-to-back probe put its call within ~12 us
of v3's? (Session note of 2026-11-28, "Host cost per call".) For v3, v4 and v5, bf16 and float32 (TF32), batch 32 and
1024: lab.timing's eager row split into its GPU and host medians, as the tuning table times it (ext().forward, a fixed
out, L2 flushed, head start); then the CPU-side events (CUDA runtime calls and the binding) of 30 such repetitions of
v5 and of v3 under torch.profiler, largest self CPU time first. Run on the GPU: python .ci/kron_host_probe.py

What it found (H200, results/nvidia-h200/logs/kron-host-probe-*.log): at 1b26dd3 v5's host part was 25.3 us at bf16
batch 32 against v3's 16.1 -- v5 searched its plan afresh, twice a call; at 7c26fec, with the plan cached (kron.cuh's
PlanCache since), 9.8 against v3's 10.4."""
import statistics

import torch

from lab import build, timing
from lab.kernels import kron as K


def main() -> None:
    g = torch.Generator().manual_seed(0)
    fns = {}
    print(f"{'case':34s} {'median':>9s} {'gpu':>9s} {'host':>9s}")
    for dt in (torch.bfloat16, torch.float32):
        for b in (32, 1024):
            x, *ws = K.make_forward_inputs({"batch": b, "factors": "128x128"}, dt, "cuda", g)   # x: (b, 16384)
            out = torch.empty_like(x)
            for v in ("v3", "v4", "v5"):
                fn = (lambda x=x, ws=ws, out=out, n=K.version_number(v):
                      K.ext().forward(x, ws, out, [], n, -1, 0))
                fns[(v, str(dt)[6:], b)] = fn
                t = timing.time_cuda(fn, flush=True)
                print(f"{v} {str(dt)[6:]:9s} batch {b:<5}            {t.median_us:7.1f}us "
                      f"{statistics.median(t.gpu_us):7.1f}us {statistics.median(t.host_us):7.1f}us")
    for v in ("v5", "v3"):
        fn = fns[(v, "bfloat16", 32)]
        with build.frozen(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(30):
                timing.flush_l2()
                torch.cuda._sleep(100_000)                  # ~50 us of head start, as lab.timing gives
                fn()
            torch.cuda.synchronize()
        print(f"\n{v} bf16 batch 32, 30 repetitions (flush, head start, call):")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
