"""The edit-and-rerun benchmark: how long a person waits after saving a source, per family and per kind of edit.

    python -m lab buildtime [FAMILY ...]      # rows into results/<device>/build_times.csv, a table on stdout

Everything runs on a scratch copy of cpp_src/ and cuda_src/ with an empty build cache, in fresh processes, so the
repository's files and cache are untouched and nothing is warm that a new user would not have warm:

- import_lab_over_torch   `import lab` after `import torch`, in a new process (what lab adds)
- cold_build_all          every family from an empty cache, in one process (the units build in parallel)
- cached_load_new_process `lab.load(family)` in a new process once everything is cached
- edit_unit               a one-line edit of one CUDA unit (each of the family's, in turn), then `lab.load(family)`
                          in the same process: the rebuild + reload a notebook user waits for
- edit_cpu_unit           the same for the CPU version's unit
- edit_shared_header      the family's shared device header (cuda_src/<family>/<family>.cuh)
- edit_binding            the binding (cpp_src/<family>/<family>.cpp)
- edit_lab_common         cpp_src/lab_common.h (every binding includes it)

Each edit waits 1 s after the previous step (as a person would: mtimes differ), appends a comment line, and times
the next `load` (max_age=0). A comment changes the content key exactly as a code edit does, so the compile is real.
"""
from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import build, env, results
from .plot import plt, save_figure

COLUMNS = ["family", "flavor", "event", "target", "seconds", "device_name", "cpus", "torch", "commit", "timestamp",
           "run_id"]

_IMPORT = r"""
import json, time
t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); import lab; t2 = time.perf_counter()
print("LAB_TIMES", json.dumps({"import_torch": t1 - t0, "import_lab_over_torch": t2 - t1}))
"""

_COLD = r"""
import json, sys, time
from lab import build
fams, flavor = json.loads(sys.argv[1]), sys.argv[2]
t0 = time.perf_counter()
res = build.build_all(fams, flavor, verbose=True)
dt = time.perf_counter() - t0
bad = {f: str(r) for f, r in res.items() if isinstance(r, build.BuildError)}
build.wait_for_pch()
print("LAB_TIMES", json.dumps({"cold_build_all": dt, "failed": bad}))
"""

_LOAD = r"""
import json, sys, time
t0 = time.perf_counter()
import lab
t1 = time.perf_counter()
lab.load(sys.argv[1], sys.argv[2], verbose=False)
print("LAB_TIMES", json.dumps({"cached_load_new_process": time.perf_counter() - t1}))
"""

_EDITS = r"""
import json, sys, time
from pathlib import Path
from lab import build, env
family, flavor, edits = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
build.load(family, flavor, verbose=False)
out = []
for event, rel in edits:
    p = env.SRC_ROOT / rel
    original = p.read_text()
    time.sleep(1.0)
    # (the family in the line: an edit of a shared header is new content for every family, never a cached one)
    p.write_text(original + f"\n// edited by lab.buildtime ({family})\n")
    t0 = time.perf_counter()
    build.load(family, flavor, verbose=False, max_age=0)
    out.append([event, rel, time.perf_counter() - t0])
    build.wait_for_pch()
    # Each edit starts from the pristine tree: put the file back (its build is still cached: a reload, not a
    # compile). Left edited, a lab_common.h edit made every later family's "cached" load rebuild its binding.
    p.write_text(original)
    build.load(family, flavor, verbose=False, max_age=0)
print("LAB_TIMES", json.dumps(out))
"""


def _probe(code: str, args: list[str], penv: dict, timeout: float = 1800, echo: bool = False) -> dict | list:
    """Run a probe in a fresh interpreter; its LAB_TIMES line. echo: pass its "[lab]" progress lines on as they come
    (the cold build is otherwise silent for tens of seconds)."""
    p = subprocess.Popen([sys.executable, "-c", code, *args], env=penv, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    err: list[str] = []
    t = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
    t.start()
    out: list[str] = []
    timer = threading.Timer(timeout, p.kill)
    timer.start()
    try:
        for ln in p.stdout:
            out.append(ln)
            if echo and ln.startswith("[lab]"):
                print("   " + ln.rstrip(), flush=True)
        rc = p.wait()
    finally:
        timer.cancel()
    t.join(5)
    stdout, stderr = "".join(out), "".join(err)
    line = [ln for ln in stdout.splitlines() if ln.startswith("LAB_TIMES ")]
    if rc or not line:
        raise RuntimeError(f"build-time probe failed (rc {rc}):\n{stdout[-3000:]}\n{stderr[-3000:]}")
    return json.loads(line[-1][len("LAB_TIMES "):])


def edits_for(family: str, flavor: str, src: Path) -> list[tuple[str, str]]:
    """(event, path relative to the source root) of every edit the benchmark makes for `family`."""
    cpp, cu = src / "cpp_src", src / "cuda_src"
    out: list[tuple[str, str]] = []
    if (cpp / family / f"{family}.cpp").exists():
        if flavor == "cuda":
            out += [("edit_unit", f"cuda_src/{family}/{p.name}") for p in sorted((cu / family).glob("*.cu"))]
            if (cu / family / f"{family}.cuh").exists():
                out.append(("edit_shared_header", f"cuda_src/{family}/{family}.cuh"))
        out += [("edit_cpu_unit", f"cpp_src/{family}/{p.name}") for p in sorted((cpp / family).glob("*.cpp"))
                if p.stem != family]
        out.append(("edit_binding", f"cpp_src/{family}/{family}.cpp"))
    else:
        if flavor == "cuda" and (cu / f"{family}.cu").exists():
            out.append(("edit_unit", f"cuda_src/{family}.cu"))
        out.append(("edit_binding", f"cpp_src/{family}.cpp"))
    if (cpp / "lab_common.h").exists():
        out.append(("edit_lab_common", "cpp_src/lab_common.h"))
    return out


def run(families: list[str] | None = None, flavor: str | None = None, record: bool = True,
        verbose: bool = True) -> list[dict]:
    flavor = flavor or build.default_flavor()
    fams = families or build.families_on_disk()
    stamp = env.machine()
    rows: list[dict] = []
    recorded: list[dict] = []

    def add(family, event, target, seconds):
        rows.append({"family": family, "flavor": flavor, "event": event, "target": target,
                     "seconds": round(float(seconds), 3), "device_name": stamp["device_name"],
                     "cpus": os.cpu_count(), "torch": stamp["torch"], "commit": stamp["commit"],
                     "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"), "run_id": results.RUN_ID})
        if verbose:
            print(f"[lab] buildtime {family:<8} {event:<24} {target:<34} {seconds:7.2f} s", flush=True)

    with tempfile.TemporaryDirectory(prefix="lab-buildtime-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(env.CPP_SRC, src / "cpp_src")
        shutil.copytree(env.CUDA_SRC, src / "cuda_src")
        penv = {**os.environ, "LAB_CACHE_DIR": str(Path(tmp) / "cache"), "LAB_SRC_ROOT": str(src),
                "PYTHONPATH": os.pathsep.join([str(env.ROOT), os.environ.get("PYTHONPATH", "")])}
        penv.pop("LAB_ONLY", None)
        if verbose:
            print(f"[lab] buildtime: {', '.join(fams)} ({flavor}) on a scratch copy in {tmp}", flush=True)
        imp = _probe(_IMPORT, [], penv)
        add("(all)", "import_torch", "", imp["import_torch"])
        add("(all)", "import_lab_over_torch", "", imp["import_lab_over_torch"])
        if verbose:
            print("[lab] buildtime: cold build of every family (empty cache) ...", flush=True)
        cold = _probe(_COLD, [json.dumps(fams), flavor], penv, echo=verbose)
        if cold["failed"]:
            raise RuntimeError(f"cold build failed: {cold['failed']}")
        add("(all)", "cold_build_all", ",".join(fams), cold["cold_build_all"])
        for fam in fams:
            add(fam, "cached_load_new_process", "", _probe(_LOAD, [fam, flavor], penv)["cached_load_new_process"])
            if verbose:
                print(f"[lab] buildtime: editing {fam} ...", flush=True)
            for event, target, sec in _probe(_EDITS, [fam, flavor, json.dumps(edits_for(fam, flavor, src))], penv):
                add(fam, event, target, sec)
            if record:  # family by family: a run stopped part-way keeps what it measured
                append([r for r in rows if r not in recorded])
                recorded.extend(r for r in rows if r not in recorded)
    return rows


NAME = "build_times.csv"


def append(rows: list[dict], path: Path | None = None) -> Path:
    """Append to results/<device>/build_times.csv (each row to its device's; results.append routes them), first
    rewriting a table of the older schema (no `target` column)."""
    for p in ([path] if path else [results.table_path(d, NAME) for d in {r["device_name"] for r in rows}]):
        if p.exists():
            with open(p, newline="") as fh:
                r = csv.DictReader(fh)
                if r.fieldnames and r.fieldnames != COLUMNS:
                    old = [{k: row.get(k, "") for k in COLUMNS} for row in r]
                    p.unlink()
                    results.append(old, p, COLUMNS)
    return results.append(rows, path, COLUMNS, name=NAME)


def table(rows: list[dict]) -> str:
    lines = [f"{'family':<9} {'event':<24} {'target':<36} {'seconds':>8}"]
    for r in rows:
        lines.append(f"{r['family']:<9} {r['event']:<24} {r['target'] or '':<36} {r['seconds']:8.2f}")
    return "\n".join(lines)


GOALS = {"edit_unit": 3.0, "edit_cpu_unit": 6.0, "edit_binding": 6.0, "edit_shared_header": 6.0,
         "cold_build_all": 15.0, "import_lab_over_torch": 0.5, "cached_load_new_process": 0.3}


def latest_run(rows: list[dict], device_name: str | None = None) -> list[dict]:
    """The newest measurement of each edit on one device (default: the device of the newest run): per (family,
    event, target) the newest row; for "(all)", the newest import rows and the newest cold build that covered the most
    families. The lent H100 runs a few families per call, so one table is put together from several runs (README
    names their commits)."""
    rows = [r for r in rows if r.get("run_id")]
    if device_name is None and rows:
        device_name = max(rows, key=lambda r: r["timestamp"])["device_name"]
    rows = [r for r in rows if r["device_name"] == device_name]
    newest: dict[tuple, dict] = {}
    for r in rows:
        if r["family"] == "(all)" and r["event"] == "cold_build_all":
            continue
        if (r["target"] or "").startswith(("cuda_src/", "cpp_src/")) and not (env.ROOT / r["target"]).exists():
            continue   # a file that has moved or gone since (basics/fma_peak.cu is cuda_src/harness/ now)
        k = (r["family"], r["event"], r["target"] or "")
        if k not in newest or r["timestamp"] >= newest[k]["timestamp"]:
            newest[k] = r
    out = sorted(newest.values(), key=lambda r: (r["family"], r["event"], r["target"] or ""))
    cold = [r for r in rows if r["family"] == "(all)" and r["event"] == "cold_build_all"]
    if cold:
        out.append(max(cold, key=lambda r: (len(r["target"].split(",")), r["timestamp"])))
    return out


def _cold_text(run_: list[dict]) -> str:
    c = [r for r in run_ if r["event"] == "cold_build_all"]
    if not c:
        return "no cold build recorded"
    fams = c[0]["target"].split(",")
    what = "every family" if set(fams) >= set(build.families_on_disk()) else f"{', '.join(fams)} together"
    return f"cold build of {what} {float(c[0]['seconds']):.1f} s (commit {c[0]['commit']})"


def readme_table(rows: list[dict]) -> str:
    """Markdown: per family, the worst one-line edit of each kind, from the newest run of each device."""
    out = []
    for dev in sorted({r["device_name"] for r in rows}):
        run_ = latest_run(rows, dev)
        if not run_:
            continue
        first = max(run_, key=lambda r: r["timestamp"])
        g = {r["event"]: float(r["seconds"]) for r in run_ if r["family"] == "(all)"}
        commits = sorted({r["commit"] for r in run_ if r["family"] != "(all)"})
        out.append(f"**{dev}**, {first['cpus']} cores, torch {first['torch']}, commit{'s' if len(commits) > 1 else ''} "
                   f"{', '.join(commits)} (newest {first['timestamp'][:10]}): {_cold_text(run_)} "
                   f"(goal ≤ {GOALS['cold_build_all']:.0f} s on the H100 machine); `import lab` over `import torch` "
                   f"{g.get('import_lab_over_torch', 0):.2f} s (goal ≤ {GOALS['import_lab_over_torch']} s).\n")
        out.append("| family | edit one unit: slowest (which) | CPU version | shared header | binding | "
                   "`lab_common.h` | cached load, new process |")
        out.append("|---|---|---|---|---|---|---|")
        out.append(f"| *goal* | ≤ {GOALS['edit_unit']:g} s | ≤ {GOALS['edit_cpu_unit']:g} s | "
                   f"≤ {GOALS['edit_shared_header']:g} s | ≤ {GOALS['edit_binding']:g} s | – | "
                   f"≤ {GOALS['cached_load_new_process']:g} s |")
        for fam in sorted({r["family"] for r in run_} - {"(all)"}):
            fr = [r for r in run_ if r["family"] == fam]

            def worst(pred):
                sel = [r for r in fr if pred(r)]
                return max(sel, key=lambda r: float(r["seconds"])) if sel else None

            cu = worst(lambda r: r["event"] == "edit_unit")
            cpu = worst(lambda r: r["event"] == "edit_cpu_unit")
            cells = [f"{float(cu['seconds']):.1f} s ({Path(cu['target']).name})" if cu else "–",
                     f"{float(cpu['seconds']):.1f} s" if cpu else "–"]
            for ev in ("edit_shared_header", "edit_binding", "edit_lab_common", "cached_load_new_process"):
                r = worst(lambda r, ev=ev: r["event"] == ev)
                cells.append(f"{float(r['seconds']):.2f} s" if r and ev == "cached_load_new_process" else
                             f"{float(r['seconds']):.1f} s" if r else "–")
            out.append(f"| {fam} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out) or "(no build-time rows yet: run `python -m lab buildtime`)"


_PLOT_EVENTS = [("edit_unit", "one CUDA unit"), ("edit_shared_header", "shared .cuh"),
                ("edit_cpu_unit", "CPU unit"), ("edit_binding", "binding .cpp"), ("edit_lab_common", "lab_common.h"),
                ("cached_load_new_process", "cached load,\nnew process")]


def plot(rows: list[dict] | None = None, device_name: str | None = None) -> Path | None:
    """results/<device>/plots/build_times.png: per family, each kind of one-line edit (every unit's edit as a dot, the bar at
    the slowest), with the goal of each kind dashed; the newest run of one device (default: the newest run)."""
    rows = rows if rows is not None else results.read(numeric=set(), name=NAME)
    run_ = latest_run(rows, device_name)
    if not run_:
        return None
    fams = sorted({r["family"] for r in run_} - {"(all)"})
    kinds = [(e, lbl) for e, lbl in _PLOT_EVENTS if any(r["event"] == e for r in run_)]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.6 * len(fams) + 3), 4.6))
    w = 0.8 / max(1, len(kinds))
    cmap = plt.get_cmap("tab10")
    for k, (ev, lbl) in enumerate(kinds):
        xs, hs = [], []
        for i, fam in enumerate(fams):
            vals = [float(r["seconds"]) for r in run_ if r["family"] == fam and r["event"] == ev]
            if not vals:
                continue
            x = i - 0.4 + w * (k + 0.5)
            xs.append(x)
            hs.append(max(vals))
            if len(vals) > 1:
                ax.scatter([x] * len(vals), vals, s=9, color="black", zorder=3, linewidths=0)
        ax.bar(xs, hs, w * 0.92, color=cmap(k), label=lbl)
        goal = GOALS.get(ev)
        if goal:
            for x in xs:
                ax.plot([x - w / 2, x + w / 2], [goal, goal], color="black", lw=1.0, ls="--", zorder=4)
    ax.set_yscale("log")
    top = max(float(r["seconds"]) for r in run_ if r["family"] != "(all)")
    ax.set_ylim(top=top * 8)  # room for the legend above the bars
    ax.set_xticks(range(len(fams)), fams)
    ax.set_ylabel("seconds until the next call runs the edit (log)")
    ax.set_title(f"Edit-and-rerun: one-line edits, then lab.load  ({_cold_text(run_)}; dashed: goals)", fontsize=10)
    ax.legend(fontsize=8, ncol=3, loc="upper left")
    ax.grid(axis="y", which="both", alpha=0.3)
    first = max(run_, key=lambda r: r["timestamp"])
    commits = ", ".join(sorted({r["commit"] for r in run_ if r["family"] != "(all)"}))
    fig.text(0.01, 0.01, f"{first['device_name']} · {first['cpus']} cores · torch {first['torch']} · commits "
             f"{commits} · newest {first['timestamp']} · dots: each unit's edit, bar: the slowest",
             fontsize=7, color="0.35", va="bottom")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return save_figure(fig, "build_times", device_name=first["device_name"])


def write_readme(path: Path | None = None) -> Path:
    """Regenerate README's build-time table (between the buildtime markers) from every device's build_times.csv."""
    path = path or env.ROOT / "README.md"
    rows = results.read(numeric=set(), name=NAME)
    text = path.read_text()
    a, b = "<!-- buildtime:begin -->", "<!-- buildtime:end -->"
    if a not in text or b not in text:
        raise ValueError(f"{path} has no {a} ... {b} markers")
    i, j = text.index(a) + len(a), text.index(b)
    text = text[:i] + "\n" + readme_table(rows) + "\n" + text[j:]
    a, b = "<!-- buildphases:begin -->", "<!-- buildphases:end -->"
    if a in text and b in text:
        i, j = text.index(a) + len(a), text.index(b)
        text = text[:i] + "\n" + phases_table(results.read(numeric=set(), name=PHASES_NAME)) + "\n" + text[j:]
    path.write_text(text)
    return path


def phases_table(rows: list[dict]) -> str:
    """Markdown: per family, the slowest CUDA build (one unit variant) and the binding, their compiles re-run alone
    (`lab buildtime --phases`), split into the compiler's phases: what bounds an edit of each."""
    out = []
    for dev in sorted({r["device_name"] for r in rows}):
        dr = [r for r in rows if r["device_name"] == dev and r.get("run_id")]
        rid = max(dr, key=lambda r: r["timestamp"])["run_id"]
        dr = [r for r in dr if r["run_id"] == rid]
        first = dr[0]
        out.append(f"**{dev}**, {first['cpus']} cores, commit {first['commit']}, each compile alone "
                   f"(`python -m lab buildtime --phases`; all rows in `results/{env.slug(dev)}/{PHASES_NAME}`; g++'s "
                   "`-ftime-report` timers make its run slower than a plain one, so compare the phases with each other):\n")
        out.append("| family | slowest CUDA build | nvcc | host side (preprocess, cudafe++, g++) | device side "
                   "(cicc, ptxas) | binding g++ | parse | instantiate templates | optimize + generate |")
        out.append("|---|---|---|---|---|---|---|---|---|")

        def sec(t, step, pred):
            return sum(float(r["seconds"]) for r in dr if r["target"] == t and r["step"] == step and pred(r["phase"]))
        for fam in sorted({r["family"] for r in dr}):
            fr = [r for r in dr if r["family"] == fam]
            cu = {r["target"] for r in fr if r["kind"] == "cuda"}
            slow = max(cu, key=lambda t: sec(t, "cuda.cu", lambda p: p == "wall"), default=None)
            b = next((r["target"] for r in fr if r["kind"] == "binding"), None)
            cells = ["–"] * 4 if slow is None else [
                slow.replace(f"cuda_src/{fam}/", ""), f"{sec(slow, 'cuda.cu', lambda p: p == 'wall'):.2f} s",
                f"{sec(slow, 'cuda.cu', lambda p: p.startswith('host')):.2f} s",
                f"{sec(slow, 'cuda.cu', lambda p: p.startswith('device')):.2f} s"]
            cells += ["–"] * 4 if b is None else [
                f"{sec(b, 'main.cpp', lambda p: p == 'wall'):.2f} s"] + [
                f"{sec(b, 'main.cpp', lambda p, ph=ph: p == ph):.2f} s"
                for ph in ("parse", "instantiate templates", "optimize + generate")]
            out.append(f"| {fam} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out) or "(no phase rows yet: run `python -m lab buildtime --phases`)"


# --------------------------------------------------------------------------------------------------------------
# Where a rebuild's time goes: each target's compile, re-run alone with the compiler's own phase timers
# --------------------------------------------------------------------------------------------------------------
PHASES_NAME = "build_phases.csv"
PHASE_COLUMNS = ["family", "target", "kind", "step", "phase", "seconds", "device_name", "cpus", "torch", "commit",
                 "timestamp", "run_id"]
# nvcc --time's phases, grouped: what the host compiler does (cudafe++ splits the file, g++ compiles the host side)
# and what makes the device code (cicc: C++ -> PTX, ptxas: PTX -> SASS).
_NVCC_GROUP = {"gcc (preprocessing 4)": "host: preprocess", "cudafe++": "host: cudafe++",
               "gcc (compiling)": "host: g++", "gcc (preprocessing 1)": "device: preprocess", "cicc": "device: cicc",
               "ptxas": "device: ptxas", "fatbinary": "device: fatbinary"}
# g++ -ftime-report's top-level phases (GCC >= 9)
_GCC_PHASES = {"phase parsing": "parse", "phase lang. deferred": "instantiate templates",
               "phase opt and generate": "optimize + generate", "phase setup": "setup"}


def _ninja_vars(bdir: Path) -> dict[str, list[str] | str]:
    vals: dict = {}
    for ln in (bdir / "build.ninja").read_text().splitlines():
        k, sep, v = ln.partition(" = ")
        if sep and not ln.startswith(" "):
            vals[k] = v
    return vals


def _timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed:\n{r.stderr[-2000:]}")
    return dt, r.stderr


def target_phases(t) -> list[tuple[str, str, float]]:
    """(step, phase, seconds) of one built target, its commands re-run one at a time in a scratch folder with the
    flags torch's build.ninja gave them: nvcc --time for the .cu, g++ -ftime-report for the .cpp, and the link."""
    bdir = t.build_dir
    v = _ninja_vars(bdir)
    out: list[tuple[str, str, float]] = []
    with tempfile.TemporaryDirectory(prefix="lab-phases-") as tmp:
        tmp = Path(tmp)
        objs = []
        if (bdir / "main.cpp").exists():
            flags = shlex.split(v["cflags"]) + shlex.split(v.get("post_cflags", ""))
            pch = build.pch_dir(t)
            if pch is not None and f"-I{pch}" not in flags:
                flags.insert(0, f"-I{pch}")   # as the next edit of this binding compiles
            cmd = shlex.split(v["cxx"]) + flags + ["-c", str(bdir / "main.cpp"), "-o", str(tmp / "main.o"),
                                                   "-ftime-report"]
            dt, err = _timed(cmd, tmp)
            out.append(("main.cpp", "wall", dt))
            for ln in err.splitlines():
                name, sep, rest = ln.strip().partition(":")
                if sep and name.strip() in _GCC_PHASES:
                    nums = re.findall(r"(\d+\.\d+)\s*\(", rest)   # usr, sys, wall
                    if len(nums) >= 3:
                        out.append(("main.cpp", _GCC_PHASES[name.strip()], float(nums[2])))
            objs.append(tmp / "main.o")
        if (bdir / "cuda.cu").exists():
            flags = shlex.split(v["cuda_cflags"]) + shlex.split(v.get("cuda_post_cflags", ""))
            csv_path = tmp / "nvcc-time.csv"
            cmd = shlex.split(v["nvcc"]) + flags + ["-c", str(bdir / "cuda.cu"), "-o", str(tmp / "cuda.o"),
                                                    "--time", str(csv_path)]
            dt, _ = _timed(cmd, tmp)
            out.append(("cuda.cu", "wall", dt))
            groups: dict[str, float] = {}
            with open(csv_path, newline="") as fh:
                for row in csv.reader(fh):
                    if len(row) >= 8 and row[1].strip() in _NVCC_GROUP:
                        g = _NVCC_GROUP[row[1].strip()]
                        groups[g] = groups.get(g, 0.0) + float(row[6]) / 1e3
            out += [("cuda.cu", g, s) for g, s in groups.items()]
            objs.append(tmp / "cuda.o")
        dt, _ = _timed(shlex.split(v["cxx"]) + [str(o) for o in objs] + shlex.split(v["ldflags"]) +
                       ["-o", str(tmp / "x.so")], tmp)
        out.append(("link", "wall", dt))
    return out


def phases(families: list[str] | None = None, flavor: str | None = None, record: bool = True,
           verbose: bool = True) -> list[dict]:
    """Build the families (if not cached), then time every target's compile alone, phase by phase, into
    results/<device>/build_phases.csv: the evidence for what bounds an edit that misses its goal."""
    flavor = flavor or build.default_flavor()
    fams = families or build.families_on_disk()
    stamp = env.machine()
    rows: list[dict] = []
    for fam in fams:
        build.load(fam, flavor, verbose=verbose)
        build.wait_for_pch()
        for t in build.spec(fam, flavor).targets:
            for step, phase, sec in target_phases(t):
                rows.append({"family": fam, "target": t.display, "kind": t.kind, "step": step, "phase": phase,
                             "seconds": round(sec, 3), "device_name": stamp["device_name"], "cpus": os.cpu_count(),
                             "torch": stamp["torch"], "commit": stamp["commit"],
                             "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"), "run_id": results.RUN_ID})
            if verbose:
                mine = [r for r in rows if r["target"] == t.display and r["family"] == fam]
                parts = ", ".join(f"{r['step']} {r['phase']} {r['seconds']:.2f}" for r in mine
                                  if r["phase"] != "wall" or r["step"] == "link")
                walls = sum(r["seconds"] for r in mine if r["phase"] == "wall" and r["step"] != "link")
                print(f"[lab] phases {t.display:<44} {walls:6.2f} s  ({parts})", flush=True)
        if record:
            results.append([r for r in rows if r["family"] == fam], None, PHASE_COLUMNS, name=PHASES_NAME)
    return rows
