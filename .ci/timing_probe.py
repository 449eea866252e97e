"""Does time_cuda's head start hide the host path? (issue 13: the fixed 10 us head start was shorter than F.linear's
host path on a busy host, so batch-1 events timed launch latency.) For a few small calls this prints the events median
(eager and graph, L2 warm like the profiler's back-to-back repeats) beside the GPU's own kernel time from the profiler (the kernels alone, no gaps): events
close to the profiler's sum mean the events time the GPU's work. Run on the GPU: python .ci/timing_probe.py"""
import torch
import torch.nn.functional as F

from lab import profile, timing


def main() -> None:
    torch.manual_seed(0)
    dev = "cuda"
    cases = {}
    for b in (1, 128):                                  # the decoder's fc_out: batch x 1280 -> 5893
        x = torch.randn(b, 1280, device=dev)
        w = torch.randn(5893, 1280, device=dev) / 1280 ** 0.5
        bias = torch.randn(5893, device=dev)
        cases[f"F.linear {b}x1280->5893 fp32"] = lambda x=x, w=w, bias=bias: F.linear(x, w, bias)
    a = torch.randn(1 << 10, device=dev)
    cases["a + a, 1024 floats"] = lambda a=a: a + a
    cases["a.sum().item() (waits for the GPU)"] = lambda a=a: a.sum().item()
    ps = [torch.randn(1000, device=dev) for _ in range(2000)]
    cases["2000 x (p.mul_(0.9)): a host-bound loop"] = lambda ps=ps: [p.mul_(0.9) for p in ps]
    print(f"{'case':40s} {'eager':>9s} {'(gpu':>9s} {'host)':>9s} {'graph':>9s} {'kernels (profiler)':>19s}")
    for name, fn in cases.items():
        t = timing.time_cuda(fn, flush=False)                # L2 warm, as the profiler's repeats are
        gpu = host = float("nan")
        if t.gpu_us:
            gpu, host = (timing.Timing(x, "events").median_us for x in (t.gpu_us, t.host_us))
        try:
            graph = f"{timing.time_cuda(fn, graph=True, flush=False).median_us:7.2f}us"
        except Exception as e:  # noqa: BLE001 (a call that syncs cannot be captured)
            graph = f"({type(e).__name__})"
        kern = profile.kernel_times(fn, reps=20)
        top = sorted(kern.items(), key=lambda kv: -kv[1])[:2]
        print(f"{name:40s} {t.median_us:7.2f}us {gpu:7.2f}us {host:7.2f}us {graph:>9s} {sum(kern.values()):17.2f}us   "
              + ", ".join(f"{profile.short_kernel_name(k)} {v:.2f}" for k, v in top)
              + f"   host-bound {100 * t.host_bound:.0f}% of reps")


def sweep() -> None:
    """The events median of a tiny add against the head start: if it falls as the head start grows, the default (sized
    by the host's enqueue time) is too short and the events time the host."""
    a = torch.randn(1 << 10, device="cuda")
    for hs in (None, 0, 10, 20, 40, 80, 160, 320):
        t = timing.time_cuda(lambda: a + a, flush=False, head_start_us=hs)
        g = timing.time_cuda(lambda: a + a, flush=False, graph=True, head_start_us=hs)
        print(f"head start {'default' if hs is None else f'{hs} us':>9}: eager {t.median_us:6.2f} us "
              f"(p20 {t.p20_us:.2f}, p80 {t.p80_us:.2f}), graph {g.median_us:6.2f} us")


if __name__ == "__main__":
    sweep()
    main()
