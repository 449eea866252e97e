"""Studies: what a family's module does not hold (STYLE.md, "What a family module holds").

A family module (`lab/kernels/<name>.py`) holds the API, the reference and the Ops. A study is everything else about
the family: one-off benchmarks (a model end to end, an optimizer step over a real parameter list), the attempts of the
notes, compiler reports, extra figures, a study's own command line. `lab/studies/<name>.py` attaches to its family
(`registry.attach_extras`, `registry.attach_plots`), so `python -m lab bench <family> --extra NAME`, the report and
`lab plot` run it like the family's own; the family module never imports its study, and the harness imports neither.

    optim     AdamW steps over GPT-2 small and 2000 small tensors (extras), their figure, the pointer-passing attempts
    linear    the compiler's report per version: registers, shared memory, spills, SASS instruction counts
    seq2seq   the seq2seq model's decoder step and greedy decode (extras of gru), its before/after profile
    kron      the original study's command line (`python -m lab.kron`)
    rope      what torch.compile costs before its first run (extra)
    embedding issue 16's goals read from the rows, the determinism and index-check probes, the ladder's figure
    survey    how the seq2seq model reaches the GPU: operators -> kernels and launch configurations, CUDA runtime
              calls, the dispatcher ladder (notebook 08; its figures attach to gru)
"""
