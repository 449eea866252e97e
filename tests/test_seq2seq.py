"""The seq2seq model: the lab model (lab kernels, no torch.cat) loads the reference model's weights and gives the same
decoder step, the same teacher-forced logits and the same greedy tokens (exactly in float64 on the CPU; on the GPU
in fp32, where a differing token is allowed only at a near-tie of the reference's logits)."""
import pytest
import torch

from lab import verify
from lab.kernels import gru as kgru
from lab.models import seq2seq as s2s

from conftest import needs_gpu

SMALL = s2s.Config(src_vocab=101, tgt_vocab=97, enc_emb=16, dec_emb=12, hidden=24, layers=1, src_len=7, max_len=6)


def _pair(cfg, device, dtype=torch.float32, seed=0):
    model = s2s.build_model(cfg, device, dtype, seed)
    return model, s2s.LabSeq2Seq.from_model(model)


def _step_inputs(cfg, B, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.tgt_vocab, (B,), generator=g).to(device)
    hidden = (torch.randn(1, B, cfg.hidden, generator=g, dtype=torch.float64) * 0.5).to(device, dtype)
    context = (torch.randn(1, B, cfg.hidden, generator=g, dtype=torch.float64) * 0.5).to(device, dtype)
    return tokens, hidden, context


def _check_greedy(model, lab, src):
    """Same tokens; where a row first differs, the two tokens must be a near-tie of the reference's logits."""
    with torch.no_grad(), kgru.precision(tf32=False):
        ref_tok, ref_logits = model.greedy(src, return_logits=True)
        got = lab.greedy(src)
    assert got.shape == ref_tok.shape and got.dtype == torch.long
    diff = (got != ref_tok)
    for b in diff.any(0).nonzero().flatten().tolist():
        t = int(diff[:, b].nonzero()[0])
        row = ref_logits[t, b]
        gap = float(row[ref_tok[t, b]] - row[got[t, b]])
        assert gap <= 1e-4 * max(1.0, float(row.abs().max())), \
            f"batch {b}, step {t}: lab picked {int(got[t, b])}, reference {int(ref_tok[t, b])}, logit gap {gap:.3e}"
    return diff


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("layers", [1, 2])
def test_cpu_model_matches_reference(dtype, layers):
    cfg = s2s.Config(**{**SMALL.__dict__, "layers": layers})
    model, lab = _pair(cfg, "cpu", dtype)
    tokens, hidden, context = _step_inputs(cfg, 5, "cpu", dtype)
    with torch.no_grad():
        want = model.decoder(tokens, hidden, context)
        got = lab.decoder_step(tokens, hidden, context)
        verify.assert_close(got, want, dtype, what="decoder step (logits, hidden)")
        src = s2s.random_src(cfg, 5)
        trg = torch.randint(0, cfg.tgt_vocab, (cfg.max_len, 5), generator=torch.Generator().manual_seed(3))
        verify.assert_close(lab.forward(src, trg), model(src, trg), dtype, what="teacher-forced logits")
        verify.assert_close(lab.encode(src), model.encoder(src), dtype, what="encoder")
    diff = _check_greedy(model, lab, src)
    if dtype == torch.float64:
        assert not diff.any(), "float64 greedy tokens must be identical"


def test_lab_model_loads_a_state_dict():
    # "loading the same weights": through a state_dict round trip, not by sharing tensors with the module
    model, _ = _pair(SMALL, "cpu")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    lab = s2s.LabSeq2Seq(SMALL, state)
    src = s2s.random_src(SMALL, 3)
    with torch.no_grad():
        verify.assert_close(lab.encode(src), model.encoder(src), torch.float32, what="encoder")
    _check_greedy(model, lab, src)


def test_bad_sos_is_refused():
    model, _ = _pair(SMALL, "cpu")
    with pytest.raises(ValueError, match=r"cfg.sos = 97 is outside the target vocabulary \[0, 97\)"):
        s2s.LabSeq2Seq(s2s.Config(**{**SMALL.__dict__, "sos": 97}), model.state_dict())


def _check_gpu_model(cfg, B):
    model, lab = _pair(cfg, "cuda")
    tokens, hidden, context = _step_inputs(cfg, B, "cuda", torch.float32)
    with torch.no_grad(), kgru.precision(tf32=False):
        want = model.decoder(tokens, hidden, context)
        got = lab.decoder_step(tokens, hidden, context)
        verify.assert_close(got, want, torch.float32, what="decoder step (logits, hidden)")
        src = s2s.random_src(cfg, B, "cuda")
        verify.assert_close(lab.encode(src), model.encoder(src), torch.float32, what="encoder")
        trg = torch.randint(0, cfg.tgt_vocab, (cfg.max_len, B), generator=torch.Generator().manual_seed(5)).cuda()
        verify.assert_close(lab.forward(src, trg), model(src, trg), torch.float32, what="teacher-forced logits")
    diff = _check_greedy(model, lab, src)
    assert diff.float().mean() < 0.05, f"{int(diff.sum())} of {diff.numel()} greedy tokens differ"


@needs_gpu
@pytest.mark.parametrize("B", [1, 128])
def test_gpu_full_model_matches_reference(B):
    _check_gpu_model(s2s.Config(), B)


@needs_gpu
@pytest.mark.parametrize("B", [1, 5])
def test_gpu_small_model_matches_reference(B):
    # odd vocabularies (101, 97), hidden 24, batch 5: small enough for compute-sanitizer, which .ci/gpu runs on it
    _check_gpu_model(SMALL, B)


@needs_gpu
def test_gpu_greedy_replays_from_a_cuda_graph():
    from lab.timing import capture_graph
    cfg = s2s.Config()
    model, lab = _pair(cfg, "cuda")
    src = s2s.random_src(cfg, 8, "cuda")
    box = {}
    with torch.no_grad():
        g = capture_graph(lambda: box.__setitem__("toks", lab.greedy(src)))
        src2 = s2s.random_src(cfg, 8, "cuda", seed=9)
        src.copy_(src2)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(box["toks"], lab.greedy(src2))
