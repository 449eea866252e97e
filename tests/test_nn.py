"""lab.nn / lab.optim: the drop-in modules take torch's arguments and state_dict, compute what torch's modules compute
(float64 references), and refuse, with a message naming it, what their kernels do not do — never a silent
difference (e.g. an output that does not require grad in a training loop)."""
import pytest
import torch

import lab.nn
import lab.optim
from lab import verify
from lab.kernels import rope as krope

from conftest import devices

@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("bias", [True, False])
def test_linear_is_nn_linear(device, bias):
    torch.manual_seed(0)
    ref = torch.nn.Linear(67, 33, bias=bias, device=device)
    m = lab.nn.Linear.from_torch(ref)
    assert isinstance(m, torch.nn.Linear) and list(m.state_dict()) == list(ref.state_dict())
    x = torch.randn(3, 5, 67, device=device)
    want = torch.nn.functional.linear(x.double(), ref.weight.double(), None if ref.bias is None else ref.bias.double())
    with torch.no_grad():
        verify.assert_close(m(x), want, torch.float32)
        verify.assert_close(m(x.transpose(0, 1)), want.transpose(0, 1), torch.float32)   # non-contiguous input
    with torch.inference_mode():
        verify.assert_close(m(x), want, torch.float32)

def test_linear_refuses_to_train_without_a_backward():
    m = lab.nn.Linear(8, 4)
    with pytest.raises(ValueError, match=r"linear: weight requires grad, but this kernel has no backward"):
        m(torch.randn(2, 8))
    m.requires_grad_(False)
    with pytest.raises(ValueError, match=r"linear: x requires grad"):
        m(torch.randn(2, 8, requires_grad=True))
    assert m(torch.randn(2, 8)).shape == (2, 4)          # frozen parameters, plain input: fine with grad enabled

@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("batch_first,bias", [(False, True), (True, True), (False, False)])
def test_gru_is_nn_gru(device, batch_first, bias):
    torch.manual_seed(1)
    ref = torch.nn.GRU(7, 19, num_layers=2, bias=bias, batch_first=batch_first, device=device)
    m = lab.nn.GRU.from_torch(ref).eval()
    assert isinstance(m, torch.nn.GRU) and list(m.state_dict()) == list(ref.state_dict())
    x = torch.randn((5, 4, 7) if batch_first else (4, 5, 7), device=device)      # batch 5, seq 4 (or transposed)
    h0 = torch.randn(2, 5, 19, device=device)
    ref64 = torch.nn.GRU(7, 19, num_layers=2, bias=bias, batch_first=batch_first, dtype=torch.float64,
                         device=device)
    ref64.load_state_dict({k: v.double() for k, v in ref.state_dict().items()})
    with torch.no_grad():
        for hx in (None, h0):
            want = ref64(x.double(), None if hx is None else hx.double())
            verify.assert_close(m(x, hx), want, torch.float32)
        # unbatched: (seq, input) and h0 (layers, hidden)
        xu = x[0] if batch_first else x[:, 0]
        want = ref64(xu.double(), h0[:, 0].double())
        got = m(xu, h0[:, 0])
        assert got[0].shape == want[0].shape and got[1].shape == want[1].shape
        verify.assert_close(got, want, torch.float32)

def test_gru_refuses_what_its_kernels_do_not_do():
    with pytest.raises(NotImplementedError, match="bidirectional"):
        lab.nn.GRU(4, 8, bidirectional=True)
    m = lab.nn.GRU(4, 8, num_layers=2, dropout=0.5)
    x = torch.randn(3, 2, 4)
    with torch.no_grad(), pytest.raises(NotImplementedError, match="dropout=0.5"):
        m(x)                                                 # training mode: torch would drop out between layers
    with pytest.raises(ValueError, match=r"gru: params\[0\] \(w_ih of layer 0\) requires grad, but this kernel has no"):
        m.eval()(x)
    m.requires_grad_(False)
    with pytest.raises(ValueError, match=r"gru: x requires grad"):
        m(x.clone().requires_grad_())
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor([3, 2]))
    with torch.no_grad(), pytest.raises(TypeError, match="PackedSequence"):
        m(packed)
    with torch.no_grad(), pytest.raises(ValueError, match="hx must have 3 dimensions"):
        m(x, torch.zeros(2, 8))

def test_kron_linear_and_the_optimizers_are_the_lab_ones():
    from lab.kernels import kron, optim
    assert lab.nn.KronLinear is kron.KronLinear
    assert lab.optim.AdamW is optim.AdamW and issubclass(lab.optim.AdamW, torch.optim.Optimizer)

@pytest.mark.parametrize("device", devices())
def test_functional_rope_matches_the_reference_and_its_gradient(device):
    gen = torch.Generator().manual_seed(3)
    cos, sin = krope.rope_tables(64, 10, dtype=torch.float64, device=device)
    q = torch.randn(2, 4, 7, 10, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    k = torch.randn(2, 2, 7, 10, generator=gen, dtype=torch.float64).to(device).requires_grad_()  # 2 kv heads
    qr, kr = lab.nn.functional.rope(q, k, cos, sin, offset=5)
    want_q, want_k = krope.rope_qk_ref(q.detach(), k.detach(), cos, sin, offset=5)
    verify.assert_close((qr, kr), (want_q, want_k), torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: lab.nn.functional.rope(a, b, cos, sin, offset=5), (q, k))
