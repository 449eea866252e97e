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
@pytest.mark.parametrize("fused", [False, True], ids=["stepwise", "one_launch"])
def test_gpu_greedy_replays_from_a_cuda_graph(fused):
    from lab.timing import capture_graph
    cfg = s2s.Config()
    _, lab = _pair(cfg, "cuda")
    src = s2s.random_src(cfg, 8, "cuda")
    box = {}
    with torch.no_grad():
        g = capture_graph(lambda: box.__setitem__("toks", lab.greedy(src, fused=fused)))
        src2 = s2s.random_src(cfg, 8, "cuda", seed=9)
        src.copy_(src2)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(box["toks"], lab.greedy(src2, fused=fused))


# ---- greedy decoding in one call (LabSeq2Seq.greedy_fused: cuda_src/gru/greedy.cu, cpp_src/gru/cpu.cpp) -----------
def _eos_cfg(cfg, model, src):
    """A config whose <eos> is a token the reference emits early for some rows (so rows stop at different steps)."""
    with torch.no_grad(), kgru.precision(tf32=False):
        toks = model.greedy(src)
    return s2s.Config(**{**cfg.__dict__, "eos": int(toks[1, 0])})


def _check_eos_tail(toks, eos):
    """After a row's first <eos>, nothing but <eos>."""
    seen = (toks == eos).cumsum(0) > 0
    assert torch.all(toks[seen] == eos)


def test_reference_greedy_keeps_eos_once_emitted():
    # the reference's masking, checked against its own run without <eos>: equal up to each row's first <eos>
    model, _ = _pair(SMALL, "cpu", torch.float64)
    src = s2s.random_src(SMALL, 6)
    cfg = _eos_cfg(SMALL, model, src)
    with torch.no_grad():
        free = model.greedy(src)
        model.cfg = cfg
        stop = model.greedy(src)
    seen = (free == cfg.eos).cumsum(0) > 0
    assert seen.any(), "the test's <eos> must occur"
    assert torch.equal(stop[~seen], free[~seen]) and torch.all(stop[seen] == cfg.eos)


@pytest.mark.parametrize("eos", [False, True], ids=["no_eos", "eos"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_cpu_fused_greedy_matches_reference(dtype, eos):
    model, _ = _pair(SMALL, "cpu", dtype)
    src = s2s.random_src(SMALL, 7, seed=4)
    cfg = _eos_cfg(SMALL, model, src) if eos else SMALL
    model.cfg = cfg
    lab = s2s.LabSeq2Seq(cfg, model.state_dict())
    with torch.no_grad():
        want = model.greedy(src)
        _, h_n = lab.encode(src)
        got = lab.greedy_fused(h_n[-1])
        stepwise = lab.greedy(src, fused=False)
    assert got.shape == (cfg.max_len, 7) and got.dtype == torch.long
    if eos:
        _check_eos_tail(got, cfg.eos)
        assert (got == cfg.eos).any()
    if dtype == torch.float64:
        assert torch.equal(got, want) and torch.equal(stepwise, want)
    else:
        _check_greedy(model, lab, src)   # fused=None on the CPU: step by step
        assert (got != want).float().mean() < 0.05


def test_fused_greedy_takes_nan_as_largest():
    # torch.argmax: NaN is the largest value and the first NaN wins; a NaN bias on two rows of fc_out -> the first
    model, _ = _pair(SMALL, "cpu")
    with torch.no_grad():
        model.decoder.fc_out.bias[[37, 50]] = float("nan")
    lab = s2s.LabSeq2Seq.from_model(model)
    src = s2s.random_src(SMALL, 3)
    with torch.no_grad():
        assert torch.all(model.greedy(src) == 37)
        assert torch.all(lab.greedy(src, fused=True) == 37)


def _fused_args(lab, B, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(2)
    ctx = torch.randn(B, lab.cfg.hidden, generator=g).to(device, dtype)
    H, V = lab.cfg.hidden, lab.cfg.tgt_vocab
    return dict(ctx=ctx, gi_ctx=torch.zeros(B, 3 * H, dtype=dtype, device=device),
                fc_ctx=torch.zeros(B, V, dtype=dtype, device=device), emb=lab.dec_emb, gi_table=lab.gi_table,
                w_hh=lab.w_hh, b_hh=lab.b_hh, w_fc=lab.w_fc_eh, sos=1, eos=-1,
                tokens=torch.empty(4, B, dtype=torch.long, device=device), tokens_in=None, logits=None, h_out=None)


@pytest.mark.parametrize("change, message", [
    (dict(sos=97), r"sos = 97 is outside the vocabulary \[0, 97\)"),
    (dict(eos=-2), r"eos = -2 must be -1 \(none\) or inside the vocabulary \[0, 97\)"),
    (dict(w_fc=torch.zeros(97, 35)), r"w_fc.*\(97, 36\)"),
    (dict(gi_ctx=torch.zeros(3, 72, dtype=torch.float64)),
     r"gi_ctx must have the same dtype as ctx \(Float\), got Double"),
    (dict(tokens=torch.empty(4, 3, dtype=torch.int32)), r"tokens.*(Long|int64)"),
    (dict(tokens=torch.empty(4, 2, dtype=torch.long)), r"tokens.*\(steps, batch\)"),
    (dict(logits=torch.empty(3, 96)), r"logits must have shape \(batch, vocab\) = \(3, 97\), got \(3, 96\)"),
    (dict(tokens_in=torch.zeros(2, dtype=torch.long)), r"tokens_in must have shape \(batch,\)"),
    (dict(h_out=torch.empty(24, 3).t()), r"h_out must have unit stride along its last dimension"),
    (dict(tokens=None), r"tokens=None runs one teacher-forced step without the pick: it needs tokens_in and logits"),
    (dict(tokens=None, logits=torch.empty(3, 97)), r"tokens=None .* needs tokens_in and logits"),
])
def test_fused_greedy_bad_input(change, message):
    _, lab = _pair(SMALL, "cpu")
    args = {**_fused_args(lab, 3), **change}
    with pytest.raises((ValueError, TypeError), match=message):
        kgru.ext().greedy_decode(*args.values())


def _check_gpu_fused(cfg, B, seed=0, eos=False):
    model, _ = _pair(cfg, "cuda", seed=seed)
    src = s2s.random_src(cfg, B, "cuda", seed=seed)
    if eos:
        cfg = _eos_cfg(cfg, model, src)
        model.cfg = cfg
    lab = s2s.LabSeq2Seq(cfg, model.state_dict())
    assert lab.fused_plan(B)["status"] == 0, lab.fused_plan(B)
    with torch.no_grad(), kgru.precision(tf32=False):
        _, h_n = lab.encode(src)
        got = lab.greedy_fused(h_n[-1], out=torch.full((cfg.max_len, B), -7, dtype=torch.long, device="cuda"))
        assert not (got == -7).any(), "every token is written, the ones after an early stop too"
        assert torch.equal(got, lab.greedy(src, fused=True))
    diff = _check_greedy(model, lab, src)
    assert diff.float().mean() < 0.05, f"{int(diff.sum())} of {diff.numel()} greedy tokens differ"
    if eos:
        _check_eos_tail(got, cfg.eos)
    return got


@needs_gpu
@pytest.mark.parametrize("B", [1, 3, 64, 128, 130, 300])
def test_gpu_fused_greedy_full_model(B):
    # 130 and 300: more rows than one batch tile (128), the last tile ragged
    _check_gpu_fused(s2s.Config(), B)


@needs_gpu
@pytest.mark.parametrize("B", [1, 5, 33])
@pytest.mark.parametrize("seed", [0, 1])
def test_gpu_fused_greedy_small_model(B, seed):
    # hidden 24, emb 12, vocab 97 over 132 blocks: most blocks own no unit and one vocabulary row, many none
    _check_gpu_fused(SMALL, B, seed)


@needs_gpu
@pytest.mark.parametrize("cfg", [SMALL, s2s.Config(max_len=12)], ids=["small", "full"])
def test_gpu_fused_greedy_stops_at_eos(cfg):
    got = _check_gpu_fused(cfg, 9, eos=True)
    assert (got == got[1, 0]).any()


@needs_gpu
@pytest.mark.parametrize("B", [7, 9, 37])
def test_gpu_fused_greedy_odd_model(B):
    # odd sizes everywhere: hidden 37 (not a multiple of 4), emb 5, vocab 1009 (prime), 2 encoder layers. Batch 9
    # (the first past the narrow tile's 8 rows) and 37 take greedy.cu's wide tiles: phase B's 8 vocabulary rows a
    # block (9 padded) as two groups of 6, the second starting at row 3 and storing only rows 6..8
    cfg = s2s.Config(src_vocab=211, tgt_vocab=1009, enc_emb=19, dec_emb=5, hidden=37, layers=2, src_len=5, max_len=9)
    _check_gpu_fused(cfg, B)
    plan = kgru.ext().greedy_plan(B, cfg.hidden, cfg.dec_emb, cfg.tgt_vocab)
    assert (plan["b_weight_rows_per_thread"], plan["b_rows_per_thread"]) == ((3, 1) if B == 7 else (6, 8)), plan


@needs_gpu
def test_gpu_fused_greedy_matches_cpu_fused():
    # the same C++ loop's answer on the CPU, from the same context: the GPU kernel and the CPU loop agree token by
    # token except at near-ties
    model, lab = _pair(s2s.Config(), "cuda")
    src = s2s.random_src(lab.cfg, 4, "cuda")
    with torch.no_grad(), kgru.precision(tf32=False):
        _, h_n = lab.encode(src)
        got = lab.greedy_fused(h_n[-1])
    cpu = s2s.LabSeq2Seq(lab.cfg, {k: v.double().cpu() for k, v in model.state_dict().items()})
    want = cpu.greedy_fused(h_n[-1].double().cpu())
    assert (got.cpu() != want).float().mean() < 0.05


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_gpu)])
def test_greedy_default_path(device):
    # greedy() decodes in one call up to FUSED_MAX_BATCH rows on the GPU, step by step above it and on the CPU
    _, lab = _pair(SMALL, device)
    calls, fused = [], lab.greedy_fused
    lab.greedy_fused = lambda *a, **k: calls.append(1) or fused(*a, **k)
    for B in (1, s2s.FUSED_MAX_BATCH, s2s.FUSED_MAX_BATCH + 1):
        calls.clear()
        with torch.no_grad(), kgru.precision(tf32=False):
            toks = lab.greedy(s2s.random_src(SMALL, B, device))
        assert toks.shape == (SMALL.max_len, B)
        assert calls == ([1] if device == "cuda" and B <= s2s.FUSED_MAX_BATCH else []), (device, B)


@needs_gpu
def test_gpu_fused_greedy_errors():
    _, lab = _pair(SMALL, "cuda")
    plan = lab.fused_plan(2000)
    assert plan["status"] == 1 and "batch <= 1024" in plan["reason"]
    args = _fused_args(lab, 2000, "cuda")
    with pytest.raises(ValueError, match=r"batch <= 1024.*fused=False"):
        kgru.ext().greedy_decode(*args.values())
    _, lab64 = _pair(SMALL, "cuda", torch.float64)
    with pytest.raises(ValueError, match=r"runs float32 on the GPU"):
        kgru.ext().greedy_decode(*_fused_args(lab64, 2, "cuda", torch.float64).values())
    plan = kgru.ext().greedy_plan(8, 512, 256, 40000)   # fc_out's 40000 x 768 floats do not fit on chip
    assert plan["status"] == 2 and "shared memory" in plan["reason"]


# ---- one decoder step in one call (LabSeq2Seq.step_fused: greedy_decode with one step, given tokens) ---------------
def _check_fused_step(cfg, B, device, dtype=torch.float32):
    model, lab = _pair(cfg, device, dtype)
    tokens, hidden, context = _step_inputs(cfg, B, device, dtype, seed=B)
    with torch.no_grad(), kgru.precision(tf32=False):
        want = model.decoder(tokens, hidden, context)
        st = lab.start(context[0])
        st.h.copy_(hidden[0])
        st.logits.fill_(float("nan"))
        logits = lab.step_fused(st, tokens)
        assert logits.data_ptr() == st.logits.data_ptr()
        verify.assert_close((logits, st.h.unsqueeze(0)), want, dtype, what="fused decoder step (logits, hidden)")
        got = lab.decoder_step(tokens, hidden, context, fused=True)
        verify.assert_close(got, want, dtype, what="decoder_step(fused=True)")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_cpu_fused_decoder_step(dtype):
    _check_fused_step(SMALL, 5, "cpu", dtype)


def test_fused_step_poisons_a_row_with_a_bad_token():
    # no device-side assert: a token outside the vocabulary makes its row NaN (logits and h), the other rows exact
    _, lab = _pair(SMALL, "cpu")
    tokens, hidden, context = _step_inputs(SMALL, 3, "cpu", torch.float32)
    tokens[1] = SMALL.tgt_vocab
    with torch.no_grad():
        logits, h = lab.decoder_step(tokens, hidden, context, fused=True)
        ref_logits, ref_h = lab.decoder_step(tokens.clamp(max=SMALL.tgt_vocab - 1), hidden, context)
    assert torch.isnan(logits[1]).all() and torch.isnan(h[0, 1]).all()
    keep = [0, 2]
    torch.testing.assert_close(logits[keep], ref_logits[keep])
    torch.testing.assert_close(h[0, keep], ref_h[0, keep])


def test_fused_step_h_out_needs_no_eos():
    _, lab = _pair(SMALL, "cpu")
    a = _fused_args(lab, 3)
    a["eos"], a["h_out"] = 2, torch.empty(3, SMALL.hidden)
    with pytest.raises(ValueError, match=r"h_out needs eos = -1"):
        kgru.ext().greedy_decode(*a.values())


@needs_gpu
@pytest.mark.parametrize("B", [1, 3, 128, 130])
def test_gpu_fused_decoder_step_full_model(B):
    _check_fused_step(s2s.Config(), B, "cuda")


@needs_gpu
@pytest.mark.parametrize("B", [7, 37])
@pytest.mark.parametrize("cfg", [SMALL, s2s.Config(src_vocab=211, tgt_vocab=1009, enc_emb=19, dec_emb=5, hidden=37,
                                                   layers=1, src_len=5, max_len=9)], ids=["small", "odd"])
def test_gpu_fused_decoder_step_small_models(cfg, B):
    _check_fused_step(cfg, B, "cuda")


@needs_gpu
def test_gpu_fused_step_poisons_a_row_with_a_bad_token():
    _, lab = _pair(s2s.Config(), "cuda")
    tokens, hidden, context = _step_inputs(lab.cfg, 3, "cuda", torch.float32)
    tokens[2] = -1
    with torch.no_grad(), kgru.precision(tf32=False):
        logits, h = lab.decoder_step(tokens, hidden, context, fused=True)
        ref_logits, ref_h = lab.decoder_step(tokens.clamp(min=0), hidden, context, fused=True)
    assert torch.isnan(logits[2]).all() and torch.isnan(h[0, 2]).all()
    assert torch.equal(logits[:2], ref_logits[:2]) and torch.equal(h[0, :2], ref_h[0, :2])


def test_the_ncu_children_refuse_a_bad_command_line():
    # python -m lab.studies.seq2seq ncu-child|ncu-step-child BATCH: what lab.profile.ncu runs under Nsight Compute
    import subprocess
    import sys
    for argv in ([], ["ncu-step-child"], ["ncu-step-child", "x"], ["ncu-steps-child", "8"]):
        p = subprocess.run([sys.executable, "-m", "lab.studies.seq2seq", *argv], capture_output=True, text=True)
        assert p.returncode == 1 and "usage: python -m lab.studies.seq2seq ncu-child|ncu-step-child BATCH" in p.stderr


def test_ncu_step_says_why_where_ncu_cannot_run(monkeypatch, capsys):
    from lab import profile
    from lab.studies import seq2seq as study
    monkeypatch.setattr(profile, "ncu_unavailable", lambda: "no GPU here (test)")
    assert study.ncu_step(128) == []
    assert "[lab] ncu: no GPU here (test)" in capsys.readouterr().out
