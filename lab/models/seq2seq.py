"""The seq2seq GRU encoder-decoder of the course project (Cho et al. 2014 style), in plain PyTorch (`Seq2Seq`), and
the same model with the lab's kernels swapped in, loading the same weights (`LabSeq2Seq`).

    Encoder   src (src_len, batch) -> embedding -> GRU -> hidden (layers, batch, H); context = hidden[-1]
    Decoder   one step: GRU over cat(embedded, context) (width emb + H, seq_len 1), then
              fc_out over cat(embedded, hidden, context) (width emb + 2H) -> logits (batch, tgt_vocab)
    Greedy    context -> hidden; token = <sos>; repeat: logits, hidden = decoder(token, hidden, context);
              token = argmax(logits)

What the lab model changes (lab/kernels/gru.py, cuda_src/gru/: decoder.cu, gates.cu, v3.cu):
- the encoder GRU is the lab's `gru` (v3, the persistent kernel, on the GPU; the C++ version on the CPU);
- the decoder step has no torch.cat. Its weights are split by what they multiply:
    GRU input projection  W_ih [emb | ctx] + b_ih = (E_dec W_ih_emb^T)[token] + (ctx W_ih_ctx^T + b_ih)
                          the first term is a (vocab, 3H) table made once per model, the second once per sentence;
    fc_out                W_fc [emb | h | ctx] + b_fc = W_fc_emb|h [emb | h] + (ctx W_fc_ctx^T + b_fc)
                          the context's share (and the bias) once per sentence; [emb | h] is one buffer `xh` that
                          the token gather writes on the left and the GRU gate kernel writes on the right;
- per step: decoder_prep (argmax of the previous logits = the greedy pick, fused with the gathers of the next
  token's embedding and input projection), h W_hh^T (cuBLAS), the gate kernel (in place into xh), and one addmm for
  fc_out onto the per-sentence term (cuBLAS). Four launches a step, no copies;
- greedy decoding on the GPU runs every step in one launch (cuda_src/gru/greedy.cu, `LabSeq2Seq.greedy_fused`):
  the decoder's weights stay in shared memory across the steps, the argmax merges across blocks with one atomic per
  row and block, and the launch ends when every row has emitted <eos>.

Its study (lab/studies/seq2seq.py): the decoder-step and greedy-decode benchmarks, extras of the gru family, and
the before/after profile of notebooks/04_seq2seq.ipynb.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..kernels import gru as kgru


@dataclass(frozen=True)
class Config:
    src_vocab: int = 7853
    tgt_vocab: int = 5893
    enc_emb: int = 256
    dec_emb: int = 256
    hidden: int = 512
    layers: int = 1        # encoder GRU layers; the decoder's GRU has one (its state starts at the context)
    src_len: int = 30
    max_len: int = 30      # greedy decoding length
    sos: int = 1           # start-of-sentence id
    eos: int | None = None  # end-of-sentence id: a row that emits it emits it from then on (None: no such token)


# =================================================================================================================
# Reference model (plain PyTorch)
# =================================================================================================================
class Encoder(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.embedding = nn.Embedding(cfg.src_vocab, cfg.enc_emb)
        self.rnn = nn.GRU(cfg.enc_emb, cfg.hidden, cfg.layers)

    def forward(self, src):
        embedded = self.embedding(src)            # (src_len, batch, emb)
        outputs, hidden = self.rnn(embedded)      # (src_len, batch, H), (layers, batch, H)
        return outputs, hidden


class Decoder(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.embedding = nn.Embedding(cfg.tgt_vocab, cfg.dec_emb)
        self.rnn = nn.GRU(cfg.dec_emb + cfg.hidden, cfg.hidden)
        self.fc_out = nn.Linear(cfg.dec_emb + 2 * cfg.hidden, cfg.tgt_vocab)

    def forward(self, tokens, hidden, context):
        # tokens: (batch,); hidden, context: (1, batch, H)
        embedded = self.embedding(tokens.unsqueeze(0))                      # (1, batch, emb)
        emb_con = torch.cat((embedded, context), dim=2)                     # (1, batch, emb + H)
        output, hidden = self.rnn(emb_con, hidden)                          # (1, batch, H) each
        output = torch.cat((embedded.squeeze(0), hidden.squeeze(0), context.squeeze(0)), dim=1)  # (batch, emb+2H)
        return self.fc_out(output), hidden                                  # (batch, tgt_vocab), (1, batch, H)


class Seq2Seq(nn.Module):
    def __init__(self, cfg: Config = Config()):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)

    def context(self, src):
        _, hidden = self.encoder(src)
        return hidden[-1:]                                                  # (1, batch, H)

    def forward(self, src, trg):
        """Teacher forcing: logits (len(trg), batch, tgt_vocab), trg[t] being the decoder's input at step t."""
        context = self.context(src)
        hidden = context
        out = []
        for t in range(trg.shape[0]):
            logits, hidden = self.decoder(trg[t], hidden, context)
            out.append(logits)
        return torch.stack(out)

    def greedy(self, src, max_len: int | None = None, return_logits: bool = False):
        """Greedy decoding: tokens (max_len, batch) (and the logits of every step)."""
        max_len = max_len or self.cfg.max_len
        context = self.context(src)
        hidden = context
        tok = torch.full((src.shape[1],), self.cfg.sos, dtype=torch.long, device=src.device)
        done = torch.zeros(src.shape[1], dtype=torch.bool, device=src.device) if self.cfg.eos is not None else None
        toks, logs = [], []
        for _ in range(max_len):
            logits, hidden = self.decoder(tok, hidden, context)
            tok = logits.argmax(1)
            if done is not None:                    # after <eos>, <eos> (no host sync: every step still runs)
                tok = tok.masked_fill(done, self.cfg.eos)
                done = done | (tok == self.cfg.eos)
            toks.append(tok)
            if return_logits:
                logs.append(logits)
        toks = torch.stack(toks)
        return (toks, torch.stack(logs)) if return_logits else toks


def build_model(cfg: Config = Config(), device="cpu", dtype=torch.float32, seed: int = 0) -> Seq2Seq:
    """The reference model with PyTorch's default initialisation, seeded (the global RNG is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = Seq2Seq(cfg)
    return m.to(device=device, dtype=dtype).eval()


def random_src(cfg: Config, batch: int, device="cpu", seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.src_vocab, (cfg.src_len, batch), generator=g).to(device)   # (src_len, batch)


# =================================================================================================================
# The lab model
# =================================================================================================================
# The largest batch greedy() decodes in one launch by default. In the H100 sweep of greedy.cu's wide-tile threshold
# (its header's table: default model, CUDA graphs, L2 flushed, two rounds; every tree wide from 16 up) the
# one-launch decoder was the faster at every batch timed up to 48 (at 48 by 2%: 1693-1703 against 1737-1742 us),
# the step-by-step one from 64 (1850-1860 against 1786-1791 us) and at 128. Earlier sweeps (65a9b41, e1c3a75, before
# the wide tiles) put the crossover between 16 and 32. Notebook 04 section 7 reprints the sweep per run.
FUSED_MAX_BATCH = 48

@dataclass
class DecoderState:
    xh: torch.Tensor       # (batch, emb + H): [embedding of the step's input token | h]; fc_out reads it whole
    gi: torch.Tensor       # (batch, 3H): the step's GRU input projection, context and b_ih included
    gi_ctx: torch.Tensor   # (batch, 3H): ctx W_ih_ctx^T + b_ih             (once per sentence)
    fc_ctx: torch.Tensor   # (batch, vocab): ctx W_fc_ctx^T + b_fc          (once per sentence)
    logits: torch.Tensor   # (batch, vocab)
    emb: int

    @property
    def h(self) -> torch.Tensor:
        return self.xh[:, self.emb:]          # (batch, H), row stride emb + H


class LabSeq2Seq:
    """`Seq2Seq` with the lab's kernels, from the same weights (a state_dict of `Seq2Seq`).

    version: the encoder GRU's version ('cpu', 'v1'..'v6'; default: lab.kernels.gru.default_version for the
    dtype and batch on the GPU, cpu on the CPU).
    """

    def __init__(self, cfg: Config, state: dict, version: str | None = None):
        self.cfg, self.version = cfg, version
        E, H = cfg.dec_emb, cfg.hidden
        w = {k: v.detach() for k, v in state.items()}
        self.enc_emb = w["encoder.embedding.weight"]
        self.enc_params = [w[f"encoder.rnn.{n}_l{l}"].contiguous() for l in range(cfg.layers)
                           for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        self.dec_emb = w["decoder.embedding.weight"].contiguous()                     # (vocab, E)
        w_ih = w["decoder.rnn.weight_ih_l0"]                                          # (3H, E + H)
        self.w_ih_ctx = w_ih[:, E:].contiguous()                                      # (3H, H)
        self.b_ih = w["decoder.rnn.bias_ih_l0"].contiguous()
        self.w_hh = w["decoder.rnn.weight_hh_l0"].contiguous()                        # (3H, H)
        self.b_hh = w["decoder.rnn.bias_hh_l0"].contiguous()
        w_fc = w["decoder.fc_out.weight"]                                             # (vocab, E + 2H)
        self.w_fc_eh = w_fc[:, :E + H].contiguous()                                   # (vocab, E + H)
        self.w_fc_ctx = w_fc[:, E + H:].contiguous()                                  # (vocab, H)
        self.b_fc = w["decoder.fc_out.bias"].contiguous()
        with kgru.precision(tf32=False):
            # the embedding's share of the GRU input projection, for every target token: once per model
            self.gi_table = (self.dec_emb @ w_ih[:, :E].t()).contiguous()              # (vocab, 3H)
        if not 0 <= cfg.sos < cfg.tgt_vocab:
            raise ValueError(f"cfg.sos = {cfg.sos} is outside the target vocabulary [0, {cfg.tgt_vocab})")
        if cfg.eos is not None and not 0 <= cfg.eos < cfg.tgt_vocab:
            raise ValueError(f"cfg.eos = {cfg.eos} is outside the target vocabulary [0, {cfg.tgt_vocab})")

    @classmethod
    def from_model(cls, model: Seq2Seq, version: str | None = None) -> "LabSeq2Seq":
        return cls(model.cfg, model.state_dict(), version)

    @property
    def device(self) -> torch.device:
        return self.dec_emb.device

    # ---- encoder ------------------------------------------------------------------------------------------------
    def encode(self, src):
        embedded = F.embedding(src, self.enc_emb)                                     # (src_len, batch, emb)
        return kgru.gru(embedded, None, self.enc_params, version=self.version)       # out, h_n

    # ---- decoder ------------------------------------------------------------------------------------------------
    def start(self, context: torch.Tensor) -> DecoderState:
        """Once per sentence: the context's shares of the GRU input projection and of fc_out. context: (batch, H)."""
        B, E, H = context.shape[0], self.cfg.dec_emb, self.cfg.hidden
        gi_ctx = torch.addmm(self.b_ih, context, self.w_ih_ctx.t())                  # (batch, 3H)
        fc_ctx = torch.addmm(self.b_fc, context, self.w_fc_ctx.t())                  # (batch, vocab)
        xh = torch.empty(B, E + H, dtype=context.dtype, device=context.device)
        xh[:, E:].copy_(context)                                                      # h starts at the context
        gi = torch.empty_like(gi_ctx)
        return DecoderState(xh, gi, gi_ctx, fc_ctx, torch.empty_like(fc_ctx), E)

    def pick(self, st: DecoderState, tokens=None, tokens_out=None) -> None:
        """The step's input token (given, or the argmax of the previous logits) -> its embedding into xh and its
        input projection into gi; the picked ids go to tokens_out."""
        kgru.ext().decoder_prep(None if tokens is not None else st.logits, tokens, tokens_out, self.dec_emb,
                                self.gi_table, st.gi_ctx, st.xh, st.gi)

    def step(self, st: DecoderState, tokens=None, tokens_out=None) -> torch.Tensor:
        """One decoder step (tokens given: teacher forcing; None: greedy from st.logits). Returns st.logits."""
        self.pick(st, tokens, tokens_out)
        h = st.h
        gh = torch.mm(h, self.w_hh.t())                                               # (batch, 3H)
        kgru.ext().gru_gates(st.gi, gh, None, self.b_hh, h, h)                        # h_t in place into xh
        torch.addmm(st.fc_ctx, st.xh, self.w_fc_eh.t(), out=st.logits)               # fc_out, context's share added
        return st.logits

    def step_fused(self, st: DecoderState, tokens: torch.Tensor) -> torch.Tensor:
        """One teacher-forced decoder step in one call: the one-launch decoder (cuda_src/gru/greedy.cu) run for one
        step from the given tokens, without the next token's pick (tokens=None: no argmax, one grid barrier), writing
        st.logits and st.h in place (on the CPU: cpp_src/gru/cpu.cpp's loop).
        st.xh's embedding half is not refreshed (nothing after a step reads it). Returns st.logits."""
        kgru.ext().greedy_decode(st.h, st.gi_ctx, st.fc_ctx, self.dec_emb, self.gi_table, self.w_hh, self.b_hh,
                                 self.w_fc_eh, self.cfg.sos, -1, None, tokens, st.logits, st.h)   # no pick
        return st.logits

    def decoder_step(self, tokens, hidden, context, fused: bool = False):
        """Decoder.forward's contract: tokens (batch,), hidden, context (1, batch, H) -> logits, hidden. fused: in
        one call (`step_fused`) instead of four."""
        st = self.start(context[0])
        st.h.copy_(hidden[0])
        logits = self.step_fused(st, tokens) if fused else self.step(st, tokens=tokens)
        return logits, st.h.unsqueeze(0)

    def forward(self, src, trg):
        """Teacher forcing, like Seq2Seq.forward: logits (len(trg), batch, vocab)."""
        _, h_n = self.encode(src)
        st = self.start(h_n[-1])
        out = torch.empty(trg.shape[0], trg.shape[1], self.cfg.tgt_vocab, dtype=st.logits.dtype,
                          device=st.logits.device)
        for t in range(trg.shape[0]):
            out[t] = self.step(st, tokens=trg[t])
        return out

    def greedy(self, src, max_len: int | None = None, fused: bool | None = None) -> torch.Tensor:
        """Greedy decoding, like Seq2Seq.greedy: tokens (max_len, batch). No host synchronisation inside.

        fused: True runs every decoder step in one call (`greedy_fused`: one launch on the GPU); False step by step
        (4 launches a step); None (default) fused where it is the faster of the two on the H100 (batch <=
        FUSED_MAX_BATCH) and `fused_plan` says it runs (CUDA, float32, the weights fit on chip).
        """
        max_len = max_len or self.cfg.max_len
        B = src.shape[1]
        if fused is None:
            fused = B <= FUSED_MAX_BATCH and self.fused_plan(B).get("status") == 0
        _, h_n = self.encode(src)
        if fused:
            return self.greedy_fused(h_n[-1], max_len)
        st = self.start(h_n[-1])
        toks = torch.empty(max_len, B, dtype=torch.long, device=src.device)
        sos = torch.full((B,), self.cfg.sos, dtype=torch.long, device=src.device)
        self.step(st, tokens=sos)
        for t in range(1, max_len):
            self.step(st, tokens_out=toks[t - 1])    # argmax of step t-1 = input of step t
        self.pick(st, tokens_out=toks[max_len - 1])
        if self.cfg.eos is not None:                 # after a row's first <eos>, <eos>
            toks.masked_fill_((toks == self.cfg.eos).cumsum(0) > 0, self.cfg.eos)
        return toks

    def greedy_fused(self, context: torch.Tensor, max_len: int | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
        """Every step of a greedy decode from the encoder's context (batch, H) in one call: on the GPU one cooperative
        launch (cuda_src/gru/greedy.cu: cell, fc_out, argmax and the next token's gathers, the weights on chip, a
        stop when every row has emitted <eos>); on the CPU the C++ loop of cpp_src/gru/cpu.cpp. tokens (max_len, B),
        written into `out` when given."""
        max_len = max_len or self.cfg.max_len
        ctx = context.contiguous()
        gi_ctx = torch.addmm(self.b_ih, ctx, self.w_ih_ctx.t())                      # (batch, 3H)
        fc_ctx = torch.addmm(self.b_fc, ctx, self.w_fc_ctx.t())                      # (batch, vocab)
        toks = torch.empty(max_len, ctx.shape[0], dtype=torch.long, device=ctx.device) if out is None else out
        eos = -1 if self.cfg.eos is None else self.cfg.eos
        kgru.ext().greedy_decode(ctx, gi_ctx, fc_ctx, self.dec_emb, self.gi_table, self.w_hh, self.b_hh,
                                 self.w_fc_eh, self.cfg.sos, eos, toks, None, None, None)
        return toks

    def fused_plan(self, batch: int) -> dict:
        """How the one-launch decoder would run `batch` rows on this model's GPU ({"status": 0, ...} when it runs;
        otherwise "reason" says why). {"status": -1, "reason": ...} off the GPU or outside float32."""
        if self.device.type != "cuda" or self.dec_emb.dtype != torch.float32:
            return {"status": -1, "reason": f"the one-launch decoder runs float32 CUDA tensors, the model is "
                                            f"{self.dec_emb.dtype} on {self.device.type}"}
        with torch.cuda.device(self.device):
            return dict(kgru.ext().greedy_plan(batch, self.cfg.hidden, self.cfg.dec_emb, self.cfg.tgt_vocab))
