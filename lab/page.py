"""results/index.html: one self-contained page of every device's results (no network needed to open it).

Per device: the measured ceilings, the checks (passed / run, per family), the build times, and one chart per (family,
op, dtype) drawn from the recorded rows — time against size on log axes (one line per version and mode, each line
from one run: its newest), or bars where an op has no size axis. Hover a point or a bar for version, shape, median
and p20–p80, GB/s or TFLOP/s with the % of the ceiling, speedup and its baseline, commit; click a legend entry to
hide or show its series. Charts are inline SVG and a few lines of script, so the file is the whole page; the PNGs in
results/<device>/plots/ stay the figures for papers.

    python -m lab plot            # also writes results/index.html
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path

from . import env, results
from .buildtime import latest_run

_W, _H, _PAD = 560, 300, 48
_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94"]


def _esc(s) -> str:
    return html.escape(str(s), quote=True)


def _series_key(r: dict) -> str:
    return r["version"] + (" (graph)" if r["mode"] == "graph" else "")


def _one_run_per_series(rows: list[dict]) -> list[dict]:
    """Each series (version, mode) from its newest run only: a line never joins points of different runs."""
    newest: dict[str, tuple[str, str]] = {}   # series -> (timestamp, run_id) of its newest row
    for r in rows:
        k = _series_key(r)
        if (r.get("timestamp") or "") >= newest.get(k, ("", ""))[0]:
            newest[k] = (r.get("timestamp") or "", r.get("run_id") or "")
    return [r for r in rows if (r.get("run_id") or "") == newest[_series_key(r)][1]]


def _tip(r: dict) -> str:
    parts = [f"{_series_key(r)} · {r['shape']} · {r['dtype']}",
             f"median {r['median_us']:.3g} µs (p20–p80 {r['p20_us'] or 0:.3g}–{r['p80_us'] or 0:.3g})"]
    if r.get("gbps"):
        parts.append(f"{r['gbps']:.4g} GB/s" + (f" = {r['pct_copy_bw']:.1f}% of copy" if r.get("pct_copy_bw") else ""))
    if r.get("tflops"):
        parts.append(f"{r['tflops']:.4g} TFLOP/s" + (f" = {r['pct_peak']:.1f}% of peak" if r.get("pct_peak") else ""))
    if r.get("speedup") and (r.get("baseline") or "").endswith(")"):
        # only rows of the same-mode rule ("torch (graph)"); older rows divided graph replays by an eager baseline
        parts.append(f"{r['speedup']:.2f}× over {r['baseline']}")
    parts.append(f"commit {r.get('commit')} · {r.get('timestamp')}")
    return "\n".join(parts)


def _log_axis(vals: list[float], lo_px: float, hi_px: float):
    lo, hi = math.log10(min(vals)), math.log10(max(vals))
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    pad = 0.06 * (hi - lo) + 0.05   # the extreme points and the shortest bar stay visible
    lo, hi = lo - pad, hi + pad
    return (lambda v: lo_px + (math.log10(v) - lo) / (hi - lo) * (hi_px - lo_px)), lo, hi


def _ticks(lo: float, hi: float) -> list[float]:
    return [10.0 ** e for e in range(math.floor(lo), math.ceil(hi) + 1) if lo - 1e-9 <= e <= hi + 1e-9] or [10 ** lo]


def _chart(cid: str, title: str, rows: list[dict]) -> str:
    keys = sorted({_series_key(r) for r in rows})
    color = {k: _COLORS[i % len(_COLORS)] for i, k in enumerate(keys)}
    sized = all(r.get("size") for r in rows) and len({r["size"] for r in rows}) > 1
    out = [f'<figure class="chart" id="{cid}"><figcaption>{_esc(title)}</figcaption>',
           f'<svg viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" role="img">']
    x0, x1, y0, y1 = _PAD + 10, _W - 10, _H - _PAD + 10, 10
    ys = [r["median_us"] for r in rows if r["median_us"]]
    fy, ylo, yhi = _log_axis(ys, y0, y1)
    for t in _ticks(ylo, yhi):
        y = fy(t)
        out.append(f'<line class="grid" x1="{x0}" x2="{x1}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="tick" x="{x0 - 4}" y="{y + 3:.1f}" text-anchor="end">{t:g}</text>')
    out.append(f'<text class="label" x="12" y="{(y0 + y1) / 2:.0f}" transform="rotate(-90 12 {(y0 + y1) / 2:.0f})" '
               f'text-anchor="middle">median µs (log)</text>')
    if sized:
        fx, xlo, xhi = _log_axis([r["size"] for r in rows], x0, x1)
        for t in _ticks(xlo, xhi):
            x = fx(t)
            out.append(f'<text class="tick" x="{x:.1f}" y="{y0 + 14}" text-anchor="middle">{t:g}</text>')
        out.append(f'<text class="label" x="{(x0 + x1) / 2:.0f}" y="{_H - 6}" text-anchor="middle">size (log)</text>')
        for k in keys:
            pts = sorted((r for r in rows if _series_key(r) == k and r["median_us"]), key=lambda r: r["size"])
            line = " ".join(f"{fx(r['size']):.1f},{fy(r['median_us']):.1f}" for r in pts)
            out.append(f'<g class="series" data-series="{_esc(k)}" stroke="{color[k]}" fill="{color[k]}">'
                       f'<polyline fill="none" points="{line}"/>')
            for r in pts:
                out.append(f'<circle cx="{fx(r["size"]):.1f}" cy="{fy(r["median_us"]):.1f}" r="3.5">'
                           f'<title>{_esc(_tip(r))}</title></circle>')
            out.append("</g>")
    else:
        bars = sorted((r for r in rows if r["median_us"]), key=lambda r: (r["shape"], _series_key(r)))
        w = (x1 - x0) / max(1, len(bars))
        for i, r in enumerate(bars):
            k = _series_key(r)
            y = fy(r["median_us"])
            out.append(f'<g class="series" data-series="{_esc(k)}" fill="{color[k]}"><rect x="{x0 + i * w + 1:.1f}" '
                       f'y="{y:.1f}" width="{max(1.0, w - 2):.1f}" height="{max(0.5, y0 - y):.1f}">'
                       f'<title>{_esc(_tip(r))}</title></rect></g>')
        out.append(f'<text class="label" x="{(x0 + x1) / 2:.0f}" y="{_H - 6}" text-anchor="middle">'
                   f'shapes × versions (hover a bar)</text>')
    out.append("</svg><div class=\"legend\">")
    for k in keys:
        out.append(f'<button type="button" data-series="{_esc(k)}" style="border-color:{color[k]}">'
                   f'<span style="background:{color[k]}"></span>{_esc(k)}</button>')
    out.append("</div></figure>")
    return "\n".join(out)


def _table(head: list[str], body: list[list]) -> str:
    rows = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in body)
    return "<table><tr>" + "".join(f"<th>{_esc(h)}</th>" for h in head) + f"</tr>{rows}</table>"


def _device_section(d: Path, n: int) -> str:
    # timings only: wall-clock rows (a torch.compile's first call) are not on the same axis
    rows = [r for r in results.latest(results.read(d / results.TABLE)) if r["median_us"] and r["mode"] != "wall"]
    name = rows[0]["device_name"] if rows else d.name
    parts = [f'<section class="device" id="dev{n}"><h2>{_esc(name)}</h2>']
    if (d / "ceilings.json").exists():
        body = []
        for key, c in sorted(json.loads((d / "ceilings.json").read_text()).items()):
            gemm = ", ".join(f"{p} {v:.1f}" for p, v in sorted(c.get("gemm_tflops", {}).items()))
            body.append([key, f"{c.get('copy_gbps', 0):.0f}", gemm, f"{c['fma_tflops']:.1f}" if c.get("fma_tflops")
                         else "–"])
        parts += ["<h3>Ceilings (measured on this device)</h3>",
                  _table(["device | torch", "copy GB/s", "GEMM TFLOP/s", "FP32 FMA TFLOP/s"], body)]
    checks = results.read(d / "checks.csv", numeric={"rel_err", "tol"})
    if checks:
        newest = results.latest_checks(checks)
        fams = sorted({c["family"] for c in newest})
        body = [[f, sum(c["passed"] == "True" for c in newest if c["family"] == f),
                 sum(1 for c in newest if c["family"] == f)] for f in fams]
        parts += ["<h3>Checks against float64 references (newest per case)</h3>",
                  _table(["family", "passed", "cases"], body)]
    bt = results.read(d / "build_times.csv", numeric={"seconds"})
    if bt:
        run_ = latest_run(bt)
        if run_:
            parts += [f"<details><summary><b>Build times</b> (the edit-and-rerun benchmark, commit "
                      f"{_esc(run_[0]['commit'])}: {len(run_)} events)</summary>",
                      _table(["family", "event", "target", "seconds"],
                             [[r["family"], r["event"], r["target"] or "", f"{r['seconds']:.2f}"] for r in run_]),
                      "</details>"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["family"], r["op"], r["dtype"]), []).append(r)
    fams = sorted({k[0] for k in groups})
    parts.append('<nav>' + " ".join(f'<a href="#dev{n}-{_esc(f)}">{_esc(f)}</a>' for f in fams) + "</nav>")
    for f in fams:
        parts.append(f'<h3 class="family" id="dev{n}-{_esc(f)}">{_esc(f)}</h3><div class="charts">')
        for i, (fam, op, dt) in enumerate(sorted(k for k in groups if k[0] == f)):
            sel = _one_run_per_series(groups[(fam, op, dt)])
            parts.append(_chart(f"dev{n}-{fam}-{op}-{dt}", f"{fam}.{op} · {dt}", sel))
        parts.append("</div>")
    parts.append("</section>")
    return "\n".join(parts)


_CSS = """body{font:14px system-ui,sans-serif;margin:24px;color:#222}h2{border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:6px 0 14px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
.charts{display:flex;flex-wrap:wrap;gap:14px}.chart{margin:0;border:1px solid #eee;padding:6px}
figcaption{font-weight:600;margin-bottom:4px}.grid{stroke:#eee}.tick{font-size:10px;fill:#666}
.label{font-size:11px;fill:#444}polyline{stroke-width:1.6}.legend button{font-size:11px;margin:2px;
background:#fff;border:1px solid;border-radius:3px;cursor:pointer}.legend span{display:inline-block;width:9px;
height:9px;margin-right:4px}.legend button.off{opacity:.35}.series.off{display:none}nav a{margin-right:10px}"""

_JS = """document.querySelectorAll('.chart').forEach(function (fig) {
  fig.querySelectorAll('.legend button').forEach(function (b) {
    b.addEventListener('click', function () {
      var s = b.getAttribute('data-series'), off = !b.classList.contains('off');
      b.classList.toggle('off', off);
      fig.querySelectorAll('.series').forEach(function (g) {
        if (g.getAttribute('data-series') === s) g.classList.toggle('off', off);
      });
    });
  });
});
document.body.setAttribute('data-charts', String(document.querySelectorAll('.chart').length));"""


def write(path: Path | None = None) -> Path | None:
    """results/index.html from every device folder under results/ that has rows; returns its path (None: no rows)."""
    dirs = [d for d in env.device_dirs() if (d / results.TABLE).exists()]
    if not dirs:
        return None
    path = path or env.results_root() / "index.html"
    body = "\n".join(_device_section(d, i) for i, d in enumerate(dirs))
    toc = " · ".join(f'<a href="#dev{i}">{_esc(d.name)}</a>' for i, d in enumerate(dirs))
    page = (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>kernel lab results</title>"
            f"<style>{_CSS}</style></head><body><h1>kernel lab — results</h1><p>Devices: {toc}. Every chart is drawn "
            f"from results/&lt;device&gt;/results.csv (hover a point; click a legend entry to hide its series). "
            f"Generated by <code>python -m lab plot</code>.</p>{body}<script>{_JS}</script></body></html>\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
    return path
