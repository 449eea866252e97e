"""dev: time the tensor-core backward (fwd+bwd through autograd, and backward alone) against cuBLAS-factorwise."""
import statistics, sys, torch
from lab.kernels import kron as K
from lab.timing import time_cuda
from lab import build
dev = torch.device("cuda")
rows = []
for dt, base in ((torch.bfloat16, "torch.bmm"), (torch.float32, "torch.bmm.tf32")):
    for b in (32, 1024, 4096):
        g = torch.Generator().manual_seed(0)
        x, gy, *ws = K.make_train_inputs({"batch": b, "factors": "128x128"}, dt, dev, g)
        for v in ("v5", base) + (("v2",) if dt == torch.float32 else ()):
            fn = K._train(v)
            with build.frozen():
                t = time_cuda(lambda: fn(x, gy, *ws), graph=True, budget_ms=60)
            rows.append((str(dt)[6:], b, v, "fwd+bwd graph", round(t.median_us, 2), "gpu", round(statistics.median(t.gpu_us), 2)))
            print(*rows[-1], flush=True)
        # backward alone (ours)
        dx = torch.empty_like(x); dws = [torch.empty_like(w) for w in ws]
        with build.frozen():
            t = time_cuda(lambda: K.ext().backward(gy, x, ws, [], dx, dws, 5), graph=True, budget_ms=60)
        print(str(dt)[6:], b, "v5", "bwd only graph", round(t.median_us, 2), "gpu", round(statistics.median(t.gpu_us), 2), flush=True)
