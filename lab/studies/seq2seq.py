"""The seq2seq model's study (the model: lab/models/seq2seq.py): its end-to-end benchmarks, extras of the gru family,
and the before/after profile of notebooks/04_seq2seq.ipynb.

    bench_decoder_step    one decoder step, reference (embedding, 2 cats, cuDNN GRU, Linear) against the lab's
    bench_greedy_decode   greedy decoding of 30 tokens end to end, encoder included: step by step ('lab') and with
                          every decoder step in one launch ('lab.fused', cuda_src/gru/greedy.cu)
                          (`python -m lab bench gru --extra decoder_step`, the report)
    profile_breakdown     self device time per operator, reference ('before') and lab ('after'), per phase
    plot_breakdown        its figure, results/<device>/plots/gru_seq2seq_profile.png
    ncu_greedy            Nsight Compute on the one-launch greedy decoder (rows in results/<device>/ncu.csv)

Both benchmarks are timed like every other row: the L2 flushed before each repetition, eager and replayed from a
CUDA graph (the flush runs between replays, outside the graph), speedups against the reference in the same mode.
"""
from __future__ import annotations

import sys

import matplotlib.pyplot as plt
import torch

from .. import profile, registry, results
from ..kernels import gru as kgru
from ..models.seq2seq import Config, LabSeq2Seq, Seq2Seq, build_model, random_src
from ..plot import save_figure   # (lab.plot picks matplotlib's backend: Agg outside a notebook)
from ..timing import time_fn


# =================================================================================================================
# Benchmarks (the gru family's extras)
# =================================================================================================================
def _row(op: str, version: str, batch: int, t, base_us: float | None, device, note: str) -> dict:
    return {"family": kgru.FAMILY, "op": op, "version": version, "shape": f"batch={batch}", "size": batch,
            "dtype": "float32", "precision": "float32", "mode": t.mode, "median_us": t.median_us, "p20_us": t.p20_us,
            "p80_us": t.p80_us, "reps": t.reps, "gbps": None, "tflops": None, "pct_copy_bw": None, "pct_peak": None,
            "baseline": f"reference ({t.mode})" if base_us else None,
            "speedup": base_us / t.median_us if base_us else None, "note": note, **results.stamp(device)}


def _bench(name: str, fns: dict, batch: int, device, note: str) -> list[dict]:
    """Time each fn eagerly and (on the GPU) replayed from a CUDA graph, the L2 flushed before every repetition;
    speedups against the reference in the same launch mode."""
    dev = torch.device(device)
    modes = [False, True] if dev.type == "cuda" else [False]
    rows = []
    for graph in modes:
        base = None
        for version, fn in fns.items():
            try:
                with kgru.precision(tf32=False):
                    t = time_fn(fn, dev, graph=graph)
            except RuntimeError as e:  # e.g. a launch that cannot be captured: say so, keep going
                print(f"[lab] {name} {version} batch={batch} ({'graph' if graph else 'eager'}) failed: {e}",
                      flush=True)
                continue
            if version == "reference":
                base = t.median_us
            rows.append(_row(name, version, batch, t, base, dev, note + "; speedup vs reference in the same mode"))
            print(f"[lab] gru.{name} {version:<10} batch={batch:<4} {t.median_us:10.2f} us ({t.mode})", flush=True)
    return rows


def _batches(device, quick: bool) -> tuple[int, ...]:
    return (1, 128) if torch.device(device).type == "cuda" else (1,)


def bench_decoder_step(device, record: bool = True, quick: bool = False, cfg: Config = Config()) -> list[dict]:
    """One decoder step, reference (embedding, 2 cats, cuDNN GRU, Linear) against the lab's (4 launches, the
    context's shares precomputed once per sentence) and, on the GPU, the one-launch decoder run for one step
    ('lab.fused'). L2 flushed before each repetition, like every other row: the
    step's weights (fc_out's 18 MB, W_hh's 3 MB) come from HBM, where a decoding loop would find them in L2."""
    rows = []
    for B in _batches(device, quick):
        model = build_model(cfg, device)
        lab = LabSeq2Seq.from_model(model)
        g = torch.Generator().manual_seed(B)
        tokens = torch.randint(0, cfg.tgt_vocab, (B,), generator=g).to(device)
        hidden = (torch.randn(1, B, cfg.hidden, generator=g) * 0.5).to(device)
        context = (torch.randn(1, B, cfg.hidden, generator=g) * 0.5).to(device)
        with kgru.precision(tf32=False):
            st = lab.start(context[0])
        st.h.copy_(hidden[0])
        fns = {"reference": lambda: model.decoder(tokens, hidden, context), "lab": lambda: lab.step(st, tokens=tokens)}
        if lab.fused_plan(B)["status"] == 0:
            fns["lab.fused"] = lambda: lab.step_fused(st, tokens)
        with torch.no_grad():
            rows += _bench("decoder_step", fns, B, device,
                           "fp32 without TF32; L2 flushed; lab: per-sentence context terms precomputed")
    if record and rows:
        results.append(rows)
    return rows


def bench_greedy_decode(device, record: bool = True, quick: bool = False, cfg: Config = Config()) -> list[dict]:
    """Greedy decoding of 30 tokens end to end (encoder included), reference against the lab model: 'lab' decodes
    step by step (4 launches a step), 'lab.fused' runs every decoder step in one launch (GPU only)."""
    rows = []
    for B in _batches(device, quick):
        model = build_model(cfg, device)
        lab = LabSeq2Seq.from_model(model)
        src = random_src(cfg, B, device)
        fns = {"reference": lambda: model.greedy(src), "lab": lambda: lab.greedy(src, fused=False)}
        plan = lab.fused_plan(B)
        if plan["status"] == 0:
            fns["lab.fused"] = lambda: lab.greedy(src, fused=True)
        elif torch.device(device).type == "cuda":
            print(f"[lab] greedy_decode lab.fused batch={B}: not run: {plan['reason']}", flush=True)
        with torch.no_grad():
            rows += _bench("greedy_decode", fns, B, device,
                           f"fp32 without TF32; src_len {cfg.src_len}, {cfg.max_len} tokens; L2 flushed")
    if record and rows:
        results.append(rows)
    return rows


# =================================================================================================================
# The profile breakdown (notebooks/04_seq2seq.ipynb, section 5)
# =================================================================================================================
def phases(model: Seq2Seq, lab: LabSeq2Seq, batch: int, device) -> dict[str, tuple]:
    """(reference fn, lab fn) for the encoder, one decoder step and a greedy decode, on random inputs."""
    cfg = model.cfg
    src = random_src(cfg, batch, device)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.tgt_vocab, (batch,), generator=g).to(device)
    hidden = (torch.randn(1, batch, cfg.hidden, generator=g) * 0.5).to(device)
    st = lab.start(hidden[0])
    return {
        "encoder": (lambda: model.encoder(src), lambda: lab.encode(src)),
        "decoder step": (lambda: model.decoder(tokens, hidden, hidden), lambda: lab.step(st, tokens=tokens)),
        "greedy decode": (lambda: model.greedy(src), lambda: lab.greedy(src)),
    }


def profile_breakdown(device, batch: int = 128, cfg: Config = Config(), reps: int = 3) -> dict[str, dict]:
    """Self device time per operator (us per call, torch.profiler) for each phase, reference ('before') and lab
    ('after'): {phase: {"before": {op: us}, "after": {op: us}}}. CPU time on a machine without a GPU."""
    dev = torch.device(device)
    model = build_model(cfg, dev)
    lab = LabSeq2Seq.from_model(model)
    out = {}
    with torch.no_grad(), kgru.precision(tf32=False):
        for phase, fns in phases(model, lab, batch, dev).items():
            out[phase] = {"before": profile.op_times(fns[0], dev.type, reps=reps),
                          "after": profile.op_times(fns[1], dev.type, reps=reps)}
    return out


def plot_breakdown(breakdown: dict[str, dict], title: str = "", top: int = 8, name: str = "gru_seq2seq_profile"):
    """Horizontal bars of time per operator, before (reference) and after (lab), one panel per phase; saved under
    results/<device>/plots/. Operators past the top few are summed into 'other'."""
    phases_ = list(breakdown)
    fig, axes = plt.subplots(len(phases_), 2, figsize=(13, 3.2 * len(phases_)), squeeze=False)
    for i, ph in enumerate(phases_):
        for k, when in enumerate(("before", "after")):
            ax = axes[i][k]
            times = breakdown[ph][when]
            items = list(times.items())[:top]
            rest = sum(v for _, v in list(times.items())[top:])
            if rest > 0:
                items.append(("other", rest))
            labels = [(n if len(n) < 48 else n[:45] + "...") for n, _ in items][::-1]
            vals = [v for _, v in items][::-1]
            ax.barh(labels, vals, color="0.6" if when == "before" else "C0")
            ax.set_title(f"{ph}: {'reference' if when == 'before' else 'lab'} "
                         f"({sum(times.values()):.0f} us of operator time)", fontsize=9)
            ax.tick_params(axis="y", labelsize=7)
            ax.set_xlabel("self time per call (us)", fontsize=8)
    fig.suptitle(title or "seq2seq: time per operator, before and after", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, name, dpi=120)


# =================================================================================================================
# Nsight Compute on the one-launch greedy decoder (notebooks/04_seq2seq.ipynb, section 7)
# =================================================================================================================
def _ncu_step_child(batch: int) -> None:
    """What ncu profiles for the step-by-step decoder: one step (LabSeq2Seq.step: token pick and gathers, h W_hhᵀ, the
    gates, fc_out) once to warm up, then once between cudaProfilerStart and Stop."""
    cfg = Config()
    model = build_model(cfg, "cuda")
    lab = LabSeq2Seq.from_model(model)
    g = torch.Generator().manual_seed(batch)
    tokens = torch.randint(0, cfg.tgt_vocab, (batch,), generator=g).to("cuda")              # (B,)
    context = (torch.randn(batch, cfg.hidden, generator=g) * 0.5).to("cuda")                 # (B, H)
    with torch.no_grad(), kgru.precision(tf32=False):
        st = lab.start(context)
        lab.step(st, tokens=tokens)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        lab.step(st, tokens=tokens)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def ncu_step(batch: int, device="cuda", record: bool = True) -> list[dict]:
    """ncu rows of one step of the step-by-step decoder at `batch` (a row per kernel it launches); appended to
    results/<device>/ncu.csv with record. [] where ncu or a GPU is missing (lab.profile.ncu says why)."""
    key = {"family": kgru.FAMILY, "op": "decoder_step", "version": "lab", "shape": f"batch={batch}",
           "dtype": "float32", "precision": "float32"}
    return profile.ncu([sys.executable, "-m", "lab.studies.seq2seq", "ncu-step-child", str(batch)], key=key,
                       device=device, record_rows=record, name=f"gru_decoder_step_b{batch}")


def _ncu_child(batch: int) -> None:
    """What ncu profiles: the decoder's launch once to warm up, then once between cudaProfilerStart and Stop."""
    cfg = Config()
    lab = LabSeq2Seq.from_model(build_model(cfg, "cuda"))
    src = random_src(cfg, batch, "cuda")
    with torch.no_grad(), kgru.precision(tf32=False):
        _, h_n = lab.encode(src)
        ctx = h_n[-1].contiguous()
        lab.greedy_fused(ctx)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        lab.greedy_fused(ctx)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def ncu_greedy(batch: int, device="cuda", record: bool = True) -> list[dict]:
    """ncu rows of the one-launch greedy decoder at `batch` (the default model, 30 steps): its kernel and the two
    per-sentence GEMMs before it; appended to results/<device>/ncu.csv with record. [] where ncu or a GPU is
    missing (lab.profile.ncu says why)."""
    key = {"family": kgru.FAMILY, "op": "greedy_decode", "version": "lab.fused", "shape": f"batch={batch}",
           "dtype": "float32", "precision": "float32"}
    return profile.ncu([sys.executable, "-m", "lab.studies.seq2seq", "ncu-child", str(batch)], key=key,
                       device=device, record_rows=record, name=f"gru_greedy_fused_b{batch}")


# The gru family's extras (`python -m lab bench gru --extra decoder_step`, the report): attached here, so neither
# lab/kernels/gru.py nor the model depends on its benchmarks.
registry.attach_extras(kgru.FAMILY, {"decoder_step": bench_decoder_step, "greedy_decode": bench_greedy_decode})


if __name__ == "__main__":   # python -m lab.studies.seq2seq ncu-child|ncu-step-child BATCH (the ncu children)
    children = {"ncu-child": _ncu_child, "ncu-step-child": _ncu_step_child}
    if len(sys.argv) != 3 or sys.argv[1] not in children or not sys.argv[2].isdigit():
        sys.exit("usage: python -m lab.studies.seq2seq ncu-child|ncu-step-child BATCH")
    children[sys.argv[1]](int(sys.argv[2]))
