"""Kernel sources on disk -> `torch.utils.cpp_extension.load_inline` -> a Python module, fast and never stale.

A family `name` is `cpp_src/<name>.cpp` (torch bindings + the CPU version) and, on a GPU build,
`cuda_src/<name>.cu` (kernels and launchers, no torch headers), plus the project headers they `#include "..."`.

What this adds to a bare `load_inline(name=...)` call, and why:

1. Never stale. load_inline imports `<build_dir>/<name>.so`; dlopen and CPython's extension-module cache both key on
   that path, so after an edit the same process would get the old module back. We keep one build directory and one
   module name per family (so ninja recompiles only the file that changed: a one-line `.cu` edit is a ~1.5 s nvcc run,
   not a 20 s recompile of torch headers), then import a copy of the `.so` named by a content key.
2. The key covers every byte the build depends on: both sources, every project header they include (transitively),
   the flags, the arch list, the torch and Python versions. torch's own versioner hashes only main.cpp/cuda.cu, so a
   header-only edit would not rebuild in the same process.
3. No hang after a killed build. torch's `lock` file (a FileBaton) survives a killed build and the next one waits on
   it forever. We serialise builds of a family with `flock` (the kernel drops it when a process dies) and remove a
   leftover baton while we hold it.
4. Errors name the real file. Sources go in behind `#line 1 "<path>"`, so the compiler reports `cuda_src/gru.cu:42`,
   and a failed build raises `BuildError` whose message leads with the first error and its source line; the full
   log is kept (`err.log`, and a file next to the build).
5. Warm start without a compiler. If a module for the key was built before (this process or another), it is
   imported directly: no ninja, no compiler, no lock (a few ms).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import env

BUILD_FORMAT = 3  # bump when this file changes how modules are built
CPP_FLAGS = ["-O3"]
CUDA_FLAGS = ["-O3", "-lineinfo", "--use_fast_math"]


_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
_loaded: dict = {}  # (family, flavor, source dirs) -> _Loaded
_lock = threading.Lock()


class BuildError(RuntimeError):
    """A family failed to build. `str(err)` leads with the first compiler error; `err.log` holds everything."""

    def __init__(self, family: str, summary: str, log: str = "", log_path: Path | None = None):
        self.family, self.summary, self.log, self.log_path = family, summary, log, log_path
        tail = f"\n(full log: {log_path})" if log_path else ""
        super().__init__(f"building '{family}' failed: {summary}{tail}")


# --------------------------------------------------------------------------------------------------------------
# What gets built
# --------------------------------------------------------------------------------------------------------------
def cuda_arch() -> tuple[list[str], str]:
    """nvcc -gencode flags and a label, from $TORCH_CUDA_ARCH_LIST or else the GPU that is present.

    9.0 builds `sm_90a`: the same chips, plus Hopper's wgmma/setmaxnreg (HOPPER.md). Raises BuildError with what to
    do when there is neither a GPU nor an arch list (torch itself would die on an IndexError there).
    """
    arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if arch_list and arch_list != "native":
        archs = [a.strip().replace("+PTX", "") for a in re.split(r"[;\s]+", arch_list) if a.strip()]
    elif torch.cuda.is_available():
        archs = sorted({"%d.%d" % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    else:
        raise BuildError("(cuda)", "no GPU is visible and TORCH_CUDA_ARCH_LIST is not set; set it (e.g. "
                                   "TORCH_CUDA_ARCH_LIST=9.0) to compile CUDA sources without a GPU")
    flags, labels = [], []
    for a in archs:
        if not re.fullmatch(r"\d+\.\d+a?", a):
            raise BuildError("(cuda)", f"cannot read arch {a!r} in TORCH_CUDA_ARCH_LIST={arch_list!r}; "
                                       "expected entries like 9.0 or 8.6 separated by ';'")
        num = a.replace(".", "").rstrip("a")
        sm = num + ("a" if num == "90" or a.endswith("a") else "")
        flags.append(f"-gencode=arch=compute_{sm},code=sm_{sm}")
        labels.append(f"sm_{sm}")
    return flags, ",".join(labels)


_DEFAULT_FLAVOR: list[str] = []


def default_flavor() -> str:
    if not _DEFAULT_FLAVOR:
        _DEFAULT_FLAVOR.append("cuda" if torch.cuda.is_available() else "cpu")
    return _DEFAULT_FLAVOR[0]


def sources(family: str, flavor: str) -> list[Path]:
    """The family's source files for a flavor ('cpu': the .cpp; 'cuda': the .cpp and the .cu)."""
    cpp = env.CPP_SRC / f"{family}.cpp"
    if not cpp.exists():
        known = sorted(p.stem for p in env.CPP_SRC.glob("*.cpp"))
        raise BuildError(family, f"no source {_rel(cpp)}; families on disk: {', '.join(known) or 'none'}")
    if flavor == "cpu":
        return [cpp]
    cu = env.CUDA_SRC / f"{family}.cu"
    if not cu.exists():
        raise BuildError(family, f"no CUDA source {_rel(cu)}")
    return [cpp, cu]


def headers(srcs: list[Path]) -> list[Path]:
    """Project headers reached by `#include "..."` from the sources, transitively, each once."""
    seen: dict[Path, None] = {}
    todo = list(srcs)
    while todo:
        f = todo.pop()
        for inc in _INCLUDE_RE.findall(f.read_text()):
            for d in (f.parent, env.CPP_SRC, env.CUDA_SRC):
                p = (d / inc).resolve()
                if p.exists():
                    if p not in seen and p not in srcs:
                        seen[p] = None
                        todo.append(p)
                    break
    return sorted(seen)


@dataclass
class Spec:
    family: str
    flavor: str
    sources: list[Path]
    headers: list[Path]
    cflags: list[str]
    cuda_cflags: list[str]
    arch: str
    key: str = field(init=False)

    def __post_init__(self):
        h = hashlib.sha256()
        for p in self.sources + self.headers:
            h.update(_rel(p).encode())
            h.update(p.read_bytes())
        h.update(json.dumps([self.cflags, self.cuda_cflags, self.arch, torch.__version__, sys.version,
                             BUILD_FORMAT]).encode())
        self.key = h.hexdigest()[:16]

    @property
    def module_name(self) -> str:
        return f"lab_{self.family}_{self.flavor}"

    @property
    def build_dir(self) -> Path:
        # One directory per (family, flavor, flags, arch, torch): edits to sources reuse it, so ninja is incremental.
        cfg = hashlib.sha256(json.dumps([self.cflags, self.cuda_cflags, self.arch, torch.__version__,
                                         sys.version, BUILD_FORMAT]).encode()).hexdigest()[:8]
        return env.cache_dir() / f"{self.module_name}-{cfg}"

    @property
    def artifact(self) -> Path:
        return self.build_dir / "loaded" / f"{self.module_name}.{self.key}.so"


def spec(family: str, flavor: str | None = None) -> Spec:
    flavor = flavor or default_flavor()
    if flavor not in ("cpu", "cuda"):
        raise ValueError(f"flavor must be 'cpu' or 'cuda', got {flavor!r}")
    srcs = sources(family, flavor)
    cflags = list(CPP_FLAGS) + (["-DLAB_WITH_CUDA"] if flavor == "cuda" else [])
    cuda_cflags, arch = (list(CUDA_FLAGS) + cuda_arch()[0], cuda_arch()[1]) if flavor == "cuda" else ([], "")
    return Spec(family, flavor, srcs, headers(srcs), cflags, cuda_cflags, arch)


# --------------------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------------------
RECHECK_SECONDS = 0.5  # how stale a loaded module may be before the files are looked at again


@dataclass
class _Loaded:
    key: str
    module: types.ModuleType
    files: list[Path]
    sig: tuple
    checked: float


def _signature(files: list[Path]) -> tuple:
    out = []
    for p in files:
        try:
            st = p.stat()
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def load(family: str, flavor: str | None = None, *, verbose: bool = True, force: bool = False,
         max_age: float = RECHECK_SECONDS) -> types.ModuleType:
    """The compiled module of `family`, rebuilt if any source, header or flag changed since it was last built.

    flavor: 'cuda' (kernels + CPU code; default when a GPU is visible) or 'cpu' (the .cpp alone).
    verbose: print build progress (what is compiled, a heartbeat, the time it took).

    Called on every kernel call, so it is cheap when nothing changed: within `max_age` seconds of the last look it
    returns the module at once (a timing loop pays nothing); after that it stats the files (a few us) and re-hashes
    only if one changed. A notebook user who edits a .cu and re-runs the cell gets the rebuilt module; a script that
    edits and reloads in the same breath passes max_age=0.
    """
    flavor = flavor or default_flavor()
    k = (family, flavor, env.CPP_SRC, env.CUDA_SRC)
    hit = _loaded.get(k)
    if hit and not force:
        now = time.monotonic()
        if now - hit.checked < max_age:
            return hit.module
        if _signature(hit.files) == hit.sig:
            hit.checked = now
            return hit.module
    with _lock:
        s = spec(family, flavor)
        files = s.sources + s.headers
        hit = _loaded.get(k)
        if hit and hit.key == s.key and not force:
            mod = hit.module
        elif s.artifact.exists() and not force:
            mod = _import(s)
        else:
            mod = _build(s, verbose)
        _loaded[k] = _Loaded(s.key, mod, files, _signature(files), time.monotonic())
        return mod


def _import(s: Spec) -> types.ModuleType:
    # A fresh path per key, so dlopen and CPython's extension cache load the new code; and a fresh dotted name per key,
    # because pybind11 >= 3 caches modules by spec name and would hand back the old one. The init symbol is looked
    # up by the last component (PyInit_lab_<family>_<flavor>), which stays the same.
    spec_ = importlib.util.spec_from_file_location(f"lab_ext_{s.key}.{s.module_name}", s.artifact)
    mod = importlib.util.module_from_spec(spec_)
    try:
        spec_.loader.exec_module(mod)
    except ImportError as e:
        raise BuildError(s.family, f"built, but the module does not load: {e} (an undefined symbol usually means a "
                                   "launcher declared in the .cpp has no definition in the .cu)") from e
    mod.__lab_key__ = s.key
    return mod


@contextlib.contextmanager
def _flock(path: Path, what: str, verbose: bool):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if verbose:
                print(f"[lab] waiting for another process that is building {what} ...", flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def _heartbeat(what: str, verbose: bool):
    """Print a line every few seconds while a build runs, so a 20 s build does not look like a hang."""
    stop = threading.Event()
    t0 = time.perf_counter()

    def beat():
        while not stop.wait(10.0):
            print(f"[lab]   ... still building {what} ({time.perf_counter() - t0:.0f} s)", flush=True)

    th = threading.Thread(target=beat, daemon=True) if verbose else None
    if th:
        th.start()
    try:
        yield
    finally:
        stop.set()
        if th:
            th.join()


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(env.ROOT))
    except ValueError:
        return str(p)


def _line_directive(p: Path) -> str:
    return f'#line 1 "{p}"\n' + p.read_text()


def _build(s: Spec, verbose: bool) -> types.ModuleType:
    _compile(s, verbose)
    return _import(s)


_tls = threading.local()


def _install_build_only_hook(cpp_extension) -> None:
    """load_inline has no build-only mode: it always imports <build>/<name>.so, which in a process that loaded an
    earlier build is the stale module. While this thread builds, that import is skipped and we import the
    content-keyed copy ourselves; other callers of load_inline are unaffected."""
    if getattr(cpp_extension, "_lab_hooked", False):
        return
    real = cpp_extension._import_module_from_library

    def import_unless_building(*args, **kwargs):
        return None if getattr(_tls, "build_only", False) else real(*args, **kwargs)

    cpp_extension._import_module_from_library = import_unless_building
    cpp_extension._lab_hooked = True


def _compile(s: Spec, verbose: bool) -> None:
    """Compile `s` (under the family's flock) and publish the keyed copy of the module; does not import it."""
    from torch.utils import cpp_extension

    what = f"{s.family} ({s.flavor}{', ' + s.arch if s.arch else ''})"
    bdir = s.build_dir
    bdir.mkdir(parents=True, exist_ok=True)
    with _flock(bdir / ".lab-build.lock", what, verbose):
        if s.artifact.exists():  # another process built it while we waited
            return
        # torch's FileBaton: nobody else can be building here while we hold the flock, so a leftover is stale.
        (bdir / "lock").unlink(missing_ok=True)
        # torch builds only when its in-process versioner sees a change, and renames the module (name_v1, ...) when
        # it does, which changes -DTORCH_EXTENSION_NAME and recompiles everything. Forget the entry: our key decides.
        cpp_extension.JIT_EXTENSION_VERSIONER.entries.pop(s.module_name, None)
        if s.flavor == "cuda" and os.environ.get("CUDA_HOME") and cpp_extension.CUDA_HOME != os.environ["CUDA_HOME"]:
            cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"]  # imported before env.py could point it at the toolkit
        _install_build_only_hook(cpp_extension)
        cpp = [_line_directive(p) for p in s.sources if p.suffix == ".cpp"]
        cu = [_line_directive(p) for p in s.sources if p.suffix == ".cu"]
        names = ", ".join(_rel(p) for p in s.sources)
        if verbose:
            print(f"[lab] building {what}: {names}", flush=True)
        t0 = time.perf_counter()
        _tls.build_only = True
        try:
            with _heartbeat(what, verbose):
                cpp_extension.load_inline(
                    name=s.module_name, cpp_sources=cpp, cuda_sources=cu or None,
                    extra_cflags=s.cflags, extra_cuda_cflags=s.cuda_cflags or None,
                    extra_include_paths=[str(env.CPP_SRC), str(env.CUDA_SRC)],
                    build_directory=str(bdir), with_cuda=bool(cu), verbose=False, no_implicit_headers=True)
        except (RuntimeError, OSError) as e:
            log = str(e)
            log_path = bdir / "last-error.log"
            log_path.write_text(log)
            raise BuildError(s.family, summarize_log(log), log, log_path) from None
        finally:
            _tls.build_only = False
        seconds = time.perf_counter() - t0
        built = bdir / f"{s.module_name}.so"
        s.artifact.parent.mkdir(exist_ok=True)
        tmp = s.artifact.with_suffix(f".tmp{os.getpid()}")
        shutil.copy2(built, tmp)
        os.replace(tmp, s.artifact)  # atomic: a concurrent reader sees no file or the whole file
        _prune(s)
        if verbose:
            print(f"[lab] built {what} in {seconds:.1f} s", flush=True)
        _last_build_seconds[(s.family, s.flavor)] = seconds


_last_build_seconds: dict[tuple[str, str], float] = {}


def last_build_seconds(family: str, flavor: str | None = None) -> float | None:
    """Wall time of the last compile of `family` in this process (None if it came from the cache)."""
    return _last_build_seconds.get((family, flavor or default_flavor()))


def _prune(s: Spec, keep: int = 6) -> None:
    """Keep the newest few keyed copies; older ones only cost disk (a loaded one stays mapped if deleted)."""
    olds = sorted(s.artifact.parent.glob(f"{s.module_name}.*.so"), key=lambda p: p.stat().st_mtime, reverse=True)
    for p in olds[keep:]:
        p.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------------------------
# Error mapping
# --------------------------------------------------------------------------------------------------------------
_ERR_RE = re.compile(r"^(?P<file>[^\s:][^:\n]*?)(?::(?P<line>\d+)(?::\d+)?|\((?P<pline>\d+)\)):\s*(?:fatal\s+)?"
                     r"error\b[^\n]*", re.M)


def summarize_log(log: str) -> str:
    """First compiler error, as 'path:line: error: ...', followed by that source line; else the log's last lines."""
    m = _ERR_RE.search(log)
    if not m:
        for line in log.splitlines():
            if "undefined reference" in line or "ld returned" in line or "error" in line.lower():
                return line.strip()
        return "\n".join(log.strip().splitlines()[-15:])
    path, line = m.group("file").strip(), int(m.group("line") or m.group("pline"))
    msg = m.group(0).strip()
    msg = msg.replace(path, _rel(Path(path).resolve()), 1)
    try:
        src = Path(path).read_text().splitlines()[line - 1]
        msg += f"\n    {line} | {src.strip()}"
    except (OSError, IndexError):
        pass
    return msg


def resource_usage(family: str) -> str:
    """Registers, shared memory, stack and spills per kernel, read off the built module by cuobjdump."""
    import subprocess
    s = spec(family, "cuda")
    load(family, "cuda")
    cuobjdump = shutil.which("cuobjdump") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin",
                                                            "cuobjdump")
    out = subprocess.run([cuobjdump, "--dump-resource-usage", str(s.artifact)], capture_output=True, text=True)
    return out.stdout or out.stderr


def build_all(families: list[str], flavor: str | None = None, jobs: int | None = None) -> dict[str, object]:
    """Build several families at once (each compile is a ninja subprocess, so threads overlap them), then import.

    Returns {family: module or BuildError}.
    """
    from concurrent.futures import ThreadPoolExecutor
    errors: dict[str, BuildError] = {}

    def compile_one(f):
        try:
            s = spec(f, flavor)
            if not s.artifact.exists():
                _compile(s, verbose=True)
        except BuildError as e:
            errors[f] = e

    workers = jobs or max(1, min(len(families), (os.cpu_count() or 2) // 2))
    with ThreadPoolExecutor(max_workers=workers) as ex:
        list(ex.map(compile_one, families))
    out: dict[str, object] = {}
    for f in families:
        try:
            out[f] = errors[f] if f in errors else load(f, flavor)
        except BuildError as e:
            out[f] = e
    return out


# --------------------------------------------------------------------------------------------------------------
# Build-time figures (results/build_times.csv)
# --------------------------------------------------------------------------------------------------------------
BUILD_TIME_COLUMNS = ["family", "flavor", "event", "seconds", "device_name", "cpus", "torch", "commit", "timestamp"]

_PROBE = r"""
import json, sys, time
from pathlib import Path
family, flavor, edit = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
import lab.build as b
t0 = time.perf_counter(); b.load(family, flavor, verbose=False); rec = {"load": time.perf_counter() - t0}
if edit:
    # a one-line edit of the kernel file, then of a shared header, each followed by a reload in this process
    for event, path in (("edit_source_same_process",
                         b.env.CUDA_SRC / f"{family}.cu" if flavor == "cuda" else b.env.CPP_SRC / f"{family}.cpp"),
                        ("edit_header_same_process",
                         b.env.CUDA_SRC / "lab_cuda.cuh" if flavor == "cuda" else b.env.CPP_SRC / "lab_common.h")):
        path.write_text(path.read_text() + "\n// edited by lab.build.measure_times\n")
        t0 = time.perf_counter(); b.load(family, flavor, verbose=False, max_age=0); rec[event] = time.perf_counter() - t0
print("LAB_TIMES " + json.dumps(rec))
"""


def measure_times(family: str = "basics", flavor: str | None = None, record: bool = True,
                  verbose: bool = True) -> list[dict]:
    """Cold build, warm start in a new process, and edit-to-rerun in the same process, on a scratch copy of the
    sources and an empty cache (the repository's cache and files are untouched)."""
    import subprocess
    import tempfile
    flavor = flavor or default_flavor()
    rows = []
    with tempfile.TemporaryDirectory(prefix="lab-buildtimes-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(env.CPP_SRC, src / "cpp_src")
        shutil.copytree(env.CUDA_SRC, src / "cuda_src")
        penv = {**os.environ, "LAB_CACHE_DIR": str(Path(tmp) / "cache"), "LAB_SRC_ROOT": str(src),
                "PYTHONPATH": os.pathsep.join([str(env.ROOT), os.environ.get("PYTHONPATH", "")])}

        def probe(edit: bool) -> dict:
            r = subprocess.run([sys.executable, "-c", _PROBE, family, flavor, "1" if edit else "0"], env=penv,
                               capture_output=True, text=True)
            line = [ln for ln in r.stdout.splitlines() if ln.startswith("LAB_TIMES ")]
            if r.returncode or not line:
                raise BuildError(family, f"build-time probe failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
            return json.loads(line[0][len("LAB_TIMES "):])

        if verbose:
            print(f"[lab] timing builds of {family} ({flavor}): cold, edits, warm start ...", flush=True)
        first = probe(edit=True)
        second = probe(edit=False)
        events = {"cold_build": first["load"], "edit_source_same_process": first["edit_source_same_process"],
                  "edit_header_same_process": first["edit_header_same_process"],
                  "warm_start_new_process": second["load"]}
    m = env.machine()
    for event, sec in events.items():
        rows.append({"family": family, "flavor": flavor, "event": event, "seconds": round(sec, 3),
                     "device_name": m["device_name"], "cpus": os.cpu_count(), "torch": m["torch"],
                     "commit": m["commit"], "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S")})
        if verbose:
            print(f"[lab]   {event:<28} {sec:7.2f} s", flush=True)
    if record:
        from . import results
        results.append(rows, env.RESULTS / "build_times.csv", BUILD_TIME_COLUMNS)
    return rows
