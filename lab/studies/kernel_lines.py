"""Lines of code per version, read from the sources on disk: a Triton kernel (lab/kernels/_triton/<family>.py) beside
a CUDA unit (cuda_src/<family>/<unit>.cu, or one __global__ function of it), for the notebooks' comparison of what
each costs to write (issue 17: lines of code, time, % of ceiling).

A line of code is a line with code on it: blank lines, comment-only lines and (Python) docstrings do not count; a
line with code and a trailing comment counts once. Shared headers (.cuh) are not counted with a unit unless named.

    triton_lines("linear")                  {"linear_kernel": n, "linear": n}: the @triton.jit kernels, the launchers
    cuda_lines("linear", "v8_v9.cu")        the whole unit
    cuda_lines("basics", "vector_add.cu", "vector_add_v2")    one __global__ function (signature to closing brace)

And what the compilers emitted, for "where Triton is faster, say why from the generated code" (issue 17): the SASS of
a CUDA unit (nvcc -cubin) and of a Triton kernel (compiled ahead of time for the same arch: no GPU needed), and the
global-memory instructions of each kernel in it, by width.

    memory_ops(cuda_sass("basics", "vector_add.cu"), "add_v2")    {"add_v2<float>": {"LDG.E.128": 8, ...}, ...}

And what the profiler recorded about the launches, for "where Triton's kernel is ahead, and why" (notebook 02): per
shape, the blocks each kernel launched against the SM count, beside its Nsight Compute time (ncu.csv rows).

    launch_fill(profile.read_ncu(family="linear", device_name=name), sm_count, name)    v11 vs triton.tf32, cuBLAS
"""
from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from .. import build, env, profile

TRITON_DIR = env.ROOT / "lab" / "kernels" / "_triton"


def python_code_lines(source: str) -> int:
    """Lines with code in a piece of Python source (docstrings, comments and blank lines left out)."""
    tree = ast.parse(source)
    doc_lines: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            doc_lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    n = 0
    for i, line in enumerate(source.splitlines(), 1):
        s = line.strip()
        if s and not s.startswith("#") and i not in doc_lines:
            n += 1
    return n


def c_code_lines(source: str) -> int:
    """Lines with code in C/C++/CUDA source (// and /* */ comments and blank lines left out)."""
    no_block = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), source, flags=re.S)
    return sum(1 for line in no_block.splitlines() if line.split("//", 1)[0].strip())


def _is_jit(fn: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


def triton_lines(family: str, folder: Path = TRITON_DIR) -> dict[str, int]:
    """Code lines of each top-level function of the family's Triton module: the @triton.jit kernels (decorators
    included) and the launchers. The module's docstring, imports and constants are not counted."""
    path = folder / f"{family}.py"
    src = path.read_text()
    lines = src.splitlines()
    out: dict[str, int] = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef):
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            out[node.name] = python_code_lines("\n".join(lines[start - 1:node.end_lineno]))
    return out


def triton_kernels(family: str, folder: Path = TRITON_DIR) -> list[str]:
    """Names of the @triton.jit functions of the family's Triton module."""
    tree = ast.parse((folder / f"{family}.py").read_text())
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and _is_jit(n)]


def _function_text(source: str, name: str) -> str:
    """The text of the __global__ function `name`, from its signature to its matching closing brace."""
    m = re.search(r"__global__[^;{]*?\b" + re.escape(name) + r"\s*\(", source)
    if not m:
        raise KeyError(f"no __global__ function {name!r}")
    start = source.rfind("\n", 0, m.start()) + 1
    while start > 0:   # take a template<...> line just above along
        prev = source.rfind("\n", 0, start - 1) + 1
        if source[prev:start].strip().startswith("template"):
            start = prev
        else:
            break
    depth, i = 0, source.index("{", m.end())
    for j in range(i, len(source)):
        if source[j] == "{":
            depth += 1
        elif source[j] == "}":
            depth -= 1
            if depth == 0:
                return source[start:j + 1]
    raise ValueError(f"unbalanced braces in {name!r}")


def cuda_lines(family: str, unit: str, kernel: str | None = None, root: Path | None = None) -> int:
    """Code lines of cuda_src/<family>/<unit> (a .cu or .cuh), or of one __global__ function in it."""
    src = ((root or env.CUDA_SRC) / family / unit).read_text()
    return c_code_lines(_function_text(src, kernel) if kernel else src)


def triton_against_rungs(rows: list[dict], device: str = "") -> str:
    """At each shape: every Triton row against the fastest of our CUDA rungs (vN) of the same op, shape, dtype,
    precision and timing mode, from bench rows. Faster or slower where their p20..p80 ranges do not overlap, level
    where they do; one line per Triton row (the notebooks print it: issue 17 asks them to say where Triton is faster,
    from the rows, not in typed prose)."""
    tri_rows = [r for r in rows if r["version"].startswith("triton")]
    lines = []
    for t in tri_rows:
        same = [r for r in rows if re.fullmatch(r"v\d+", r["version"])
                and all(r[k] == t[k] for k in ("op", "shape", "dtype", "precision", "mode"))]
        if not same:
            lines.append(f"{t['op']} {t['version']} {t['shape']}: no CUDA rung of this precision timed beside it")
            continue
        best = min(same, key=lambda r: r["median_us"])
        verdict = ("Triton is FASTER" if t["p80_us"] < best["p20_us"] else
                   "Triton is slower" if t["p20_us"] > best["p80_us"] else "level (p20..p80 ranges overlap)")
        ratio = t["median_us"] / best["median_us"]
        lines.append(f"{t['op']} {t['precision']:<8} {t['shape']:<40} {t['version']:<11} {t['median_us']:9.1f} us | "
                     f"best rung {best['version']:<3} {best['median_us']:9.1f} us | Triton takes {ratio:.2f}x its "
                     f"time: {verdict}")
    if not tri_rows:
        lines.append(f"no triton rows on this machine ({device}): nothing to compare (the cells above say why)")
    return "\n".join(lines)


def _dims(s: str | None) -> int | None:
    """'64x1x1' -> 64: the blocks of a grid (or the threads of a block) ncu recorded; None where it recorded none."""
    if not s:
        return None
    n = 1
    for d in s.lower().split("x"):
        if not d.strip().isdigit():
            return None
        n *= int(d)
    return n


def _shape_order(label: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", label or ""))


def launch_fill(rows: list[dict], sm_count: int | None = None, device_name: str = "", ours: str = "v11",
                theirs: str = "triton.tf32", reference: tuple[str, ...] = ("torch.tf32",)) -> str:
    """Where Triton's kernel is ahead of our rung, why, from Nsight Compute rows (profile.read_ncu: ncu.csv of one
    device): at each (op, shape, dtype, precision) with rows of both `ours` and `theirs`, one line per recorded launch
    of ours, theirs and the reference versions (every recorded run, oldest first; '*' marks each version's newest),
    with its kernel, grid, block, blocks launched against the SM count, shared memory per block, duration and SM%;
    then a verdict from the newest runs: theirs' kernel time over ours', and how many SMs our grid leaves without a
    block. sm_count None (no GPU here, and ncu.csv does not record the SM count): 'n/a'. One line when no shape has
    both (a machine with no rows for its device)."""
    versions = (ours, theirs, *reference)
    cases: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("version") in versions and (not device_name or r.get("device_name") == device_name):
            cases.setdefault((r["op"], r["shape"], r["dtype"], r.get("precision") or ""), []).append(r)
    both = {k: rs for k, rs in cases.items() if {ours, theirs} <= {r["version"] for r in rs}}
    if not both:
        return (f"no ncu rows of both {ours} and {theirs} recorded for {device_name or 'this device'}: nothing to "
                f"compare (the Nsight Compute cell of section 5 records them on a GPU where ncu runs)")
    sms = f"{sm_count} SMs" if sm_count else "SM count n/a (no GPU here; ncu.csv does not record it)"
    lines = []
    for (op, shape, dtype, prec) in sorted(both, key=lambda k: (k[0], k[2], k[3], _shape_order(k[1]))):
        rs = both[(op, shape, dtype, prec)]
        lines.append(f"{op} {dtype} ({prec}) {shape}: {sms}")
        lines.append(f"  {'version':<12} {'kernel':<30} {'grid':>9} {'block':>9} {'blocks':>6} {'/SMs':>5} "
                     f"{'smem KB':>7} {'us':>8} {'SM%':>5}  ncu run")
        newest: dict[str, list[dict]] = {}
        for v in versions:
            runs: dict[tuple, list[dict]] = {}
            for r in rs:
                if r["version"] == v:
                    runs.setdefault((r.get("timestamp") or "", r.get("run_id") or ""), []).append(r)
            for i, key in enumerate(sorted(runs)):
                last = i == len(runs) - 1
                if last:
                    newest[v] = runs[key]
                for r in runs[key]:
                    blocks = _dims(r.get("grid"))
                    per_sm = f"{blocks / sm_count:5.2f}" if blocks is not None and sm_count else "  n/a"
                    smem = ((r.get("smem_static") or 0) + (r.get("smem_dynamic") or 0)) / 1024
                    us = "-" if r.get("duration_us") is None else f"{r['duration_us']:.2f}"
                    sm_pct = "-" if r.get("sm_pct") is None else f"{r['sm_pct']:.1f}"
                    kernel = profile.short_kernel_name(r.get("kernel") or "?", 30)
                    lines.append(f"{'*' if last else ' '} {v:<12} {kernel:<30} "
                                 f"{r.get('grid') or '-':>9} {r.get('block') or '-':>9} "
                                 f"{blocks if blocks is not None else '-':>6} {per_sm} {smem:7.1f} {us:>8} "
                                 f"{sm_pct:>5}  {r.get('commit') or '?'} {key[0]}")
        t_ours, t_theirs = (sum(r.get("duration_us") or 0.0 for r in newest[v]) for v in (ours, theirs))
        if t_ours and t_theirs:
            ratio = t_theirs / t_ours
            verdict = (f"{theirs}'s kernel takes {ratio:.2f}x {ours}'s time: "
                       + (f"{theirs} is ahead" if ratio < 1 else f"{ours} is ahead" if ratio > 1 else "level"))
        else:
            verdict = f"no duration recorded for {ours} or {theirs}: no ratio"
        grid = max((_dims(r.get("grid")) or 0 for r in newest[ours]), default=0)
        if sm_count and grid:
            fill = (f"{ours} launches {grid} blocks for {sm_count} SMs: at least {sm_count - grid} SMs get no block"
                    if grid < sm_count else f"{ours} launches {grid} blocks for {sm_count} SMs: none is left without one")
        else:
            fill = f"{ours} launches {grid or '?'} blocks; SMs n/a"
        lines.append(f"  newest runs: {verdict}; {fill}")
    return "\n".join(lines)


# ---- what the compilers emitted ------------------------------------------------------------------------------------
def _cuobjdump() -> str:
    """The CUDA toolkit's cuobjdump, else the copy triton ships (a toolkit of nvcc alone has none)."""
    tool = build.cuda_tool("cuobjdump")
    spec = importlib.util.find_spec("triton")
    bundled = [Path(p) / "backends" / "nvidia" / "bin" / "cuobjdump" for p in (spec.submodule_search_locations or [])] \
        if spec else []
    tool = tool or next((str(p) for p in bundled if p.exists()), None)
    if tool is None:
        raise RuntimeError("cuobjdump not found (set CUDA_HOME or put the CUDA toolkit's bin on PATH)")
    return tool


def _sass_of(cubin: Path) -> str:
    tool = _cuobjdump()
    r = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, timeout=120)
    if r.returncode:
        raise RuntimeError(f"cuobjdump -sass {cubin.name} failed: {(r.stdout + r.stderr).strip()[-500:]}")
    return r.stdout


def cuda_sass(family: str, unit: str, arch: str = "sm_90", flags: tuple[str, ...] = ("-O3",)) -> str:
    """cuobjdump -sass of cuda_src/<family>/<unit> compiled alone to a cubin for `arch` (nvcc; no GPU needed). The
    unit is compiled as the builds see it (-std=c++17, cuda_src, cpp_src and the family's folder on the include path);
    a unit that needs torch's headers is not supported here."""
    cc = build.nvcc_path()
    if cc is None:
        raise RuntimeError("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    src = env.CUDA_SRC / family / unit
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "unit.cubin"
        cmd = [cc, "-std=c++17", "-cubin", f"-arch={arch}", *flags, "-I", str(env.CUDA_SRC), "-I", str(env.CPP_SRC),
               "-I", str(src.parent), str(src), "-o", str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode:
            raise RuntimeError(f"nvcc {unit} failed: {(r.stdout + r.stderr).strip()[-800:]}")
        return _sass_of(out)


def triton_sass(kernel, signature: dict[str, str], constexprs: dict[str, object], num_warps: int = 4,
                arch: int = 90, aligned: tuple[str, ...] = ()) -> str:
    """cuobjdump -sass of a @triton.jit kernel compiled ahead of time for sm_<arch> (triton.compile with a target:
    no GPU needed). signature: {argument: type} for the runtime arguments ('*fp32', 'i64', ...); constexprs:
    {argument: value}; aligned: the arguments Triton would find 16-divisible at launch (a pointer 16-byte aligned, an
    integer a multiple of 16), which is what lets it emit wide accesses."""
    import triton   # optional dependency (lab/kernels/_triton): only this function needs it
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    names = list(kernel.arg_names)
    sig = {a: ("constexpr" if a in constexprs else signature[a]) for a in names}
    consts = {(names.index(a),): v for a, v in constexprs.items()}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    compiled = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs),
                              target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        return _sass_of(cubin)


_GLOBAL_OP = re.compile(r"\b((?:LDG|STG|LDGSTS|ATOMG|RED)(?:\.[A-Z0-9_]+)*)\s")


def memory_ops(sass: str, kernel: str | None = None) -> dict[str, dict[str, int]]:
    """Per function of a cuobjdump -sass listing (those whose name contains `kernel`, demangled when c++filt is
    there): how many global-memory instructions of each form its code holds (LDG.E.128 is a 16-byte load per
    thread, LDG.E a 4-byte one; .CONSTANT marks the read-only path). Static counts: an unrolled loop body counts
    once per copy, a loop's trips not at all."""
    out: dict[str, dict[str, int]] = {}
    for chunk in sass.split("Function : ")[1:]:
        name, body = chunk.split("\n", 1)
        name = _demangle(name.strip())
        if kernel and kernel not in name:
            continue
        ops = Counter(m.group(1) for m in _GLOBAL_OP.finditer(body))
        out[name] = dict(sorted(ops.items()))
    return out


def _demangle(name: str) -> str:
    try:
        r = subprocess.run(["c++filt", name], capture_output=True, text=True, timeout=10)
        return r.stdout.strip() or name
    except (OSError, subprocess.SubprocessError):
        return name
