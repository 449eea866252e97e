"""Drop-in optimizers: lab.optim.Adam / AdamW take torch.optim.Adam / AdamW's arguments and state_dict and step with
the lab's multi-tensor-apply kernels (cuda_src/optim/; the C++ CPU version on the CPU). See lab.kernels.optim."""
from .kernels.optim import Adam, AdamW  # noqa: F401

__all__ = ["Adam", "AdamW"]
