"""dev: one backward each (bf16, TF32) at batch 1024 and 32, 128x128, for ncu."""
import torch
from lab.kernels import kron as K
for dt in (torch.bfloat16, torch.float32):
    for b in (1024, 32):
        x, gy, *ws = K.make_train_inputs({"batch": b, "factors": "128x128"}, dt, torch.device("cuda"), torch.Generator().manual_seed(0))
        K.backward(gy, x, ws, [], version="v5")
        torch.cuda.synchronize()
