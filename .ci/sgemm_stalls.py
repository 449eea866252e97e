"""One launch each of linear v8, v9 and cuBLAS fp32 (TF32 off) at 4096^3, for Nsight Compute to read the warp
stall reasons, issue-slot use and clock of the SIMT kernels against cuBLAS (the evidence for issue 4's SIMT gap, and
issue 14's 90% goal).
usage (on the GPU; build linear first so the JIT build is not profiled):
  ncu --clock-control none -k regex:"async_copy_warptile|gemm" --section WarpStateStats --section SchedulerStats \
      --section SpeedOfLight --section Occupancy --csv --page details python .ci/sgemm_stalls.py
Which instructions stall (source-level warp-state sampling; results/<device>/profiles/linear_sgemm_4096_ncu_source_
{v8,v9,cublas}.csv hold the H100's, trimmed to the instructions that executed or were sampled):
  ncu --section SourceCounters -k regex:"async_copy_warptile|xmma" -o sgemm python .ci/sgemm_stalls.py
  ncu --import sgemm.ncu-rep --page source --csv --print-source sass --launch-skip N --launch-count 1 > source_N.csv
and, anywhere (no GPU), the samples of each stall reason by opcode, as fractions of all of a kernel's samples:
  python .ci/sgemm_stalls.py summarize results/<device>/profiles/linear_sgemm_4096_ncu_source_*.csv
"""
import collections
import csv
import sys


def summarize(paths: list[str], top: int = 4) -> None:
    """Per file: the share of each stall reason in all warp samples, and the opcodes that hold the largest reasons."""
    for path in paths:
        with open(path) as f:
            lines = f.read().splitlines()
        head = lines[0] if lines[0].startswith(('"#', "#")) else ""
        rows = list(csv.DictReader(lines[1:] if head else lines))
        reasons = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
        total, by_op = collections.Counter(), collections.defaultdict(collections.Counter)
        for r in rows:
            words = r["Source"].split()
            if not words:
                continue
            op = (words[1] if words[0].startswith("@") else words[0]).split(".")[0]   # predicated: @P0 OP ...
            for c in reasons:
                v = float((r[c] or "0").replace(",", ""))
                total[c] += v
                by_op[op][c] += v
        n = sum(total.values())
        name = head.strip('#" ')[:140]
        print(f"{path}\n  {name}\n  {int(n)} samples")
        for c, v in total.most_common(8):
            ops = sorted(((cnt[c], op) for op, cnt in by_op.items() if cnt[c]), reverse=True)[:top]
            print(f"  {c[6:]:18s} {v / n:6.3f}   " + ", ".join(f"{op} {s / n:.3f}" for s, op in ops))


def run() -> None:
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


if __name__ == "__main__":
    if sys.argv[1:2] == ["summarize"]:
        summarize(sys.argv[2:])
    else:
        run()
