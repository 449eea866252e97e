"""dev: the tensor-core backward under compute-sanitizer: every step kind, both tiles, vector and element paths."""
import math, torch
from lab.kernels import kron as K
from lab import verify
for dt in (torch.float32, torch.bfloat16):
    for b, f in [(3, "128x128"), (64, "128x128"), (5, "13x17"), (2, "8x16x32"), (1, "100x100x2"), (3, "1x1"), (4, "64x128")]:
        x, gy, *ws = K.make_train_inputs({"batch": b, "factors": f}, dt, torch.device("cuda"), torch.Generator().manual_seed(1))
        dx = torch.full_like(x, math.nan); dws = [torch.full_like(w, math.nan) for w in ws]
        K.backward(gy, x, ws, [], dx, dws, version="v3")
        inp = [t.double() for t in (x, gy, *ws)]
        ref, sc = K.train_ref(*inp), K.root_sum_square(K.train_ref)(*inp)
        for o, r, s in zip([dx, *dws], ref[1:], sc[1:]):
            verify.assert_close(o, r, dt, precision="tf32" if dt == torch.float32 else None, scale=s)
        print("ok", dt, b, f, flush=True)
print("sanitizer cases done")
