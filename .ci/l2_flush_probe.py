"""Does the way the L2 is flushed before a timed run change what a memory-bound kernel measures?

lab.timing flushes the L2 by writing a buffer twice its size, which leaves the L2 full of dirty lines. A timed
kernel that reads less than the L2 holds evicts them as it misses and pays their write-back: HBM traffic up to twice
what the kernel itself moves. This probe times the same reads after a 'write' flush and after a 'read' flush (the
dirty lines written back during the flush) at two footprints: fc_out's weight at batch 1 (30.2 MB, below the 50 MB
L2) and four times that (121 MB, above it).
usage (on a GPU): python .ci/l2_flush_probe.py
"""
import os

import torch

from lab import timing
from lab.ceilings import ceilings
from lab.kernels import linear as L


def main() -> None:
    dev = torch.device("cuda")
    copy = ceilings(dev)["copy_gbps"]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; copy ceiling {copy:.0f} GB/s (large copy)")
    print(f"{'N':>6} {'MB':>6} {'what':<24} {'write-flush us':>14} {'GB/s':>6} {'read-flush us':>14} {'GB/s':>6}")
    g = torch.Generator(device="cuda").manual_seed(0)
    for N in (5893, 4 * 5893):
        K = 1280
        x = torch.randn(1, K, device=dev, generator=g)            # x: (1, K)
        w = torch.randn(N, K, device=dev, generator=g)            # w: (N, K), nn.Linear layout
        b = torch.randn(N, device=dev, generator=g)               # b: (N,)
        y = torch.empty(1, N, device=dev)
        dst = torch.empty_like(w)
        mb = w.numel() * 4 / 1e6
        fns = {  # name -> (fn, bytes moved)
            "gemv v1": (lambda: L.gemv(x, w, b, y, version="v1"), w.numel() * 4),
            "torch linear (cuBLAS)": (lambda: torch.nn.functional.linear(x, w, b), w.numel() * 4),
            "w.sum() (read only)": (lambda: w.sum(), w.numel() * 4),
            "copy w (read + write)": (lambda: dst.copy_(w), 2 * w.numel() * 4),
        }
        for name, (fn, nbytes) in fns.items():
            t = {m: None for m in timing.FLUSH_MODES}
            for mode in timing.FLUSH_MODES:
                os.environ["LAB_FLUSH"] = mode
                t[mode] = timing.time_cuda(fn).median_us
            print(f"{N:>6} {mb:>6.1f} {name:<24} {t['write']:>14.2f} {nbytes / t['write'] / 1e3:>6.0f} "
                  f"{t['read']:>14.2f} {nbytes / t['read'] / 1e3:>6.0f}")
    os.environ.pop("LAB_FLUSH", None)


if __name__ == "__main__":
    main()
