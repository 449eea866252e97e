"""Drop-in modules: lab's kernels behind torch's module interfaces, to swap into a model.

    import lab.nn, lab.optim
    model.rnn = lab.nn.GRU.from_torch(model.rnn)            # same weights, same state_dict keys
    model.proj = lab.nn.Linear.from_torch(model.proj)
    opt = lab.optim.AdamW(model.parameters(), lr=3e-4)      # torch.optim.AdamW's arguments and state_dict
    q, k = lab.nn.functional.rope(q, k, cos, sin)           # differentiable

Each module is a subclass of torch's (constructor arguments, parameters, state_dict and repr are torch's), whose
forward calls the lab's kernel (`version=` picks one; default: the fastest for the input's device and dtype). What a
kernel does not do is an error that names it, never a silent difference:
- `Linear` and `GRU` have no backward yet: called with grad enabled on a parameter or input that requires grad, their
  bindings raise (lab::check_no_grad: the output would otherwise silently not require grad and a training loop would
  stop learning). Run them under `torch.no_grad()` / `torch.inference_mode()`, or train with torch's module.
- `GRU`: no bidirectional, no PackedSequence, no dropout between layers while training.
`KronLinear` and `functional.rope` are differentiable (their backward kernels exist).
"""
from __future__ import annotations

import torch

from ..kernels import gru as _gru
from ..kernels import linear as _linear
from ..kernels.kron import KronLinear  # noqa: F401  (a module of its own: factors as parameters, autograd)
from . import functional  # noqa: F401

__all__ = ["Linear", "GRU", "KronLinear", "functional"]


class Linear(torch.nn.Linear):
    """torch.nn.Linear whose forward is the lab's linear kernel (cuda_src/linear/): y = x Wᵀ + b.

    x: (..., in_features) of the module's dtype and device. version: a rung of the GEMM ladder, 'cpu', 'v1'..'v11'
    (v10, v11: TF32 on float32, bf16 on bfloat16); default: the fastest for the input, lab.kernels.linear.fastest
    (the gemv op's kernel for a few float32 rows)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 version: str | None = None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.version = version

    @classmethod
    def from_torch(cls, m: torch.nn.Linear, version: str | None = None) -> "Linear":
        """The same layer (its parameters copied, state_dict keys unchanged) running the lab's kernel."""
        new = cls(m.in_features, m.out_features, m.bias is not None, device=m.weight.device, dtype=m.weight.dtype,
                  version=version)
        new.load_state_dict(m.state_dict())
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _linear.linear(x.contiguous(), self.weight, self.bias, version=self.version)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", version={self.version}" if self.version else "")


class GRU(torch.nn.GRU):
    """torch.nn.GRU whose forward is the lab's GRU (cuda_src/gru/; the C++ CPU version on the CPU).

    Same constructor arguments and state_dict as torch.nn.GRU, plus version= ('cpu', 'v1'..'v6'; default:
    lab.kernels.gru.default_version for the input's dtype, batch and layers). Input (seq, batch, input_size), (batch, seq, input_size) with batch_first=True, or
    unbatched (seq, input_size); h0 (num_layers, batch, hidden_size) or (num_layers, hidden_size). Returns (output,
    h_n) as torch does."""

    def __init__(self, *args, version: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.version = version
        if self.bidirectional:
            raise NotImplementedError("lab.nn.GRU: bidirectional=True is not implemented (the lab's GRU runs one "
                                      "direction); use torch.nn.GRU")

    @classmethod
    def from_torch(cls, m: torch.nn.GRU, version: str | None = None) -> "GRU":
        """The same GRU (its weights copied, state_dict keys unchanged) running the lab's kernels."""
        w = m.weight_ih_l0
        new = cls(m.input_size, m.hidden_size, m.num_layers, bias=m.bias, batch_first=m.batch_first,
                  dropout=m.dropout, bidirectional=m.bidirectional, device=w.device, dtype=w.dtype, version=version)
        new.load_state_dict(m.state_dict())
        return new

    def forward(self, input, hx: torch.Tensor | None = None):
        if isinstance(input, torch.nn.utils.rnn.PackedSequence):
            raise TypeError("lab.nn.GRU does not take a PackedSequence (the kernels run full-length sequences); pad "
                            "the batch (torch.nn.utils.rnn.pad_packed_sequence) or use torch.nn.GRU")
        if self.dropout and self.training and self.num_layers > 1:
            raise NotImplementedError(f"lab.nn.GRU: dropout={self.dropout} between layers is not implemented; call "
                                      ".eval() (torch applies no dropout in eval mode either) or use torch.nn.GRU")
        params = list(self._flat_weights)
        if input.dim() not in (2, 3):
            raise ValueError(f"lab.nn.GRU: expected input of 2 (unbatched) or 3 dimensions, got shape "
                             f"{tuple(input.shape)}")
        unbatched = input.dim() == 2
        x = input.unsqueeze(1) if unbatched else (input.transpose(0, 1) if self.batch_first else input)
        if hx is not None:
            if hx.dim() != (2 if unbatched else 3):
                raise ValueError(f"lab.nn.GRU: for {'unbatched' if unbatched else 'batched'} input, hx must have "
                                 f"{2 if unbatched else 3} dimensions, got shape {tuple(hx.shape)}")
            hx = hx.unsqueeze(1) if unbatched else hx
            hx = hx.contiguous()
        if not self.bias:   # the kernels add b_ih and b_hh: zeros are the bias-free GRU
            z = torch.zeros(3 * self.hidden_size, dtype=params[0].dtype, device=params[0].device)
            params = [t for i in range(self.num_layers) for t in (params[2 * i], params[2 * i + 1], z, z)]
        out, hn = _gru.gru(x.contiguous(), hx, params, version=self.version)
        if unbatched:
            return out.squeeze(1), hn.squeeze(1)
        return (out.transpose(0, 1) if self.batch_first else out), hn

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", version={self.version}" if self.version else "")
