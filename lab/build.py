"""Kernel sources on disk -> `torch.utils.cpp_extension.load_inline` -> a binding module plus units, fast and never stale.

A family lives in folders that share its name:

    cpp_src/<family>/<family>.cpp   the binding: torch-facing functions, named input checks, pybind11 (rarely edited)
    cpp_src/<family>/*.cpp          CPU units: the C++ CPU versions, plain pointers, no torch headers
    cuda_src/<family>/*.cu          CUDA units: kernels + plain-C launchers, no torch headers (one version, or a few
                                    that share a kernel, per file); cuda_src/<family>/<family>.cuh holds what they share

Each unit is its own `load_inline(..., is_python_module=False, no_implicit_headers=True)` build: a small shared
library loaded with ctypes, whose launchers reach the binding as function pointers (`lab_unit.h`: the unit's export
table; `lab_common.h`: `lab::launcher<Fn>(name)`). Why this design (measured on the H100 machine, 16 cores):
load_inline writes all of a call's sources into one `cuda.cu`, so with one module per family every edit recompiled the
whole family (a one-line GRU edit: 26 s; nvcc alone on gru.cu: 24.5 s). A unit is one small nvcc run (1.3-1.9 s for a
small kernel), units build in parallel, and an edit rebuilds and reloads only the unit it touched while the binding and
every other unit stay loaded. A unit that declares `// lab:variants dtype=f32,f16,bf16` is built once per value (with
-DLAB_VARIANT_dtype_f32 ...), so each build instantiates one configuration; `only=` / $LAB_ONLY builds a subset while
developing (e.g. LAB_ONLY=dtype=f32).

A family may also be a single file pair, `cpp_src/<family>.cpp` (+ `cuda_src/<family>.cu`), built as one module:
the simple layout for a small family (the build tests use it).

What this adds to a bare load_inline call, and why:

1. Never stale. dlopen and CPython's extension cache key on a path, so the same process would get the old code back
   after an edit. Every artifact is copied to a path named by a content key (every source byte, every project header
   it includes, transitively, the flags, arch, torch and Python versions) and loaded from there. `load()` stats the
   family's files on every call (a few us), so a save is seen by the very next call.
2. Only what changed is compiled: each target (binding, unit, variant) has its own key and build directory; a header
   edit rebuilds exactly the targets that include it.
3. No hang after a killed build: builds of a target are serialised with `flock` (the kernel drops it when a process
   dies), torch's leftover `lock` file is removed, and compiler processes a killed build left running in the build
   directory are waited for (then stopped) before a new build starts there.
4. Errors name the real file: sources are compiled behind `#line` directives, and a failed build raises `BuildError`
   whose message leads with `cuda_src/gru/v3.cu:42: error: ...` (one form for nvcc and g++) and the source line.
5. Warm start without a compiler: a key built before, in any process, is loaded directly (milliseconds).
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import importlib.util
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import env, timing

BUILD_FORMAT = 4  # bump when this file changes how targets are built
CPP_FLAGS = ["-O3"]
# A binding is glue: named checks, a launcher lookup, pybind11. Optimizing it at -O3 is ~3 s of a binding edit spent
# on pybind11's dispatcher (2-core machine, with the PCH: rope.cpp 8.7 s at -O3, 5.7 s at -O1, and 4.8 s of that is
# lab_common.h alone). The kernels and the CPU versions are in units, built with CPP_FLAGS/CUDA_FLAGS.
# $LAB_BINDING_OPT (e.g. -O3) overrides it: .ci/binding_opt.py times a host-bound step both ways.
BINDING_FLAGS = ["-O1"]
CUDA_FLAGS = ["-O3", "-lineinfo", "--use_fast_math"]
# Bindings include lab_common.h (ATen + pybind11): most of their compile time. One precompiled header of it, per
# flavor and configuration, shared by every family's binding, halves a binding edit (15.6 -> 7.7 s on the 2-core
# CPU machine). $LAB_PCH=0 turns it off.
PCH_HEADER = "lab_common.h"
MIN_TORCH = (2, 8)  # load_inline(no_implicit_headers=...) first shipped in torch 2.8 (not in 2.6/2.7)

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
_VARIANTS_RE = re.compile(r"^\s*//\s*lab:variants\s+(.+)$", re.M)
_lock = threading.RLock()


class BuildError(RuntimeError):
    """A family failed to build. `str(err)` leads with the first compiler error; `err.log` holds everything."""

    def __init__(self, family: str, summary: str, log: str = "", log_path: Path | None = None):
        self.family, self.summary, self.log, self.log_path = family, summary, log, log_path
        tail = f"\n(full log: {log_path})" if log_path else ""
        super().__init__(f"building '{family}' failed: {summary}{tail}")


def check_torch(version: str | None = None) -> None:
    """The build needs load_inline(no_implicit_headers=...): torch >= 2.8. Say so plainly on an older torch."""
    v = version or torch.__version__
    nums = tuple(int(x) for x in re.findall(r"\d+", v)[:2])
    if nums < MIN_TORCH:
        raise BuildError("(torch)", f"torch {v} is too old: the lab builds with load_inline(no_implicit_headers=...), "
                                    f"which needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (pip install -U torch)")


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


def families_on_disk() -> list[str]:
    return sorted({p.stem for p in env.CPP_SRC.glob("*.cpp")} |
                  {p.name for p in env.CPP_SRC.iterdir() if p.is_dir() and (p / f"{p.name}.cpp").exists()}
                  if env.CPP_SRC.exists() else set())


def is_folder_family(family: str) -> bool:
    return (env.CPP_SRC / family / f"{family}.cpp").exists()


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


def variants_of(src: Path) -> list[tuple[str, list[str]]]:
    """The unit's variant axes from `// lab:variants key=a,b key2=c,d`: [(key, [values])]."""
    m = _VARIANTS_RE.search(src.read_text())
    if not m:
        return []
    axes = []
    for item in m.group(1).split():
        key, _, vals = item.partition("=")
        values = [v for v in vals.split(",") if v]
        if not re.fullmatch(r"[A-Za-z_]\w*", key) or not values or not all(re.fullmatch(r"\w+", v) for v in values):
            raise BuildError(src.parent.name, f"{_rel(src)}: cannot read '// lab:variants {m.group(1)}' "
                                              "(expected key=a,b,c ..., names of letters, digits and _)")
        axes.append((key, values))
    return axes


def parse_only(only) -> dict[str, set[str]]:
    """only={'dtype': 'f32'} / {'dtype': ['f32', 'bf16']} / 'dtype=f32,bf16 rb=2' -> {'dtype': {'f32', 'bf16'}}."""
    if not only:
        return {}
    if isinstance(only, str):
        out: dict[str, set[str]] = {}
        for item in only.replace(";", " ").split():
            key, _, vals = item.partition("=")
            if not vals:
                raise ValueError(f"cannot read only={only!r}: expected key=value[,value] (e.g. dtype=f32)")
            out.setdefault(key, set()).update(v for v in vals.split(",") if v)
        return out
    return {k: {v} if isinstance(v, str) else set(v) for k, v in dict(only).items()}


@dataclass
class Target:
    """One load_inline build: the binding (a Python module), a unit, or one variant of a unit."""
    family: str
    kind: str                      # 'binding' | 'cuda' | 'cpu' | 'module' (single-file family)
    name: str                      # unit name ('v3', 'cpu'), or the family for bindings
    sources: list[Path]
    headers: list[Path]
    cflags: list[str]
    cuda_cflags: list[str]
    arch: str
    variant: tuple[tuple[str, str], ...] = ()
    key: str = field(init=False)

    def __post_init__(self):
        h = hashlib.sha256()
        for p in self.sources + self.headers:
            h.update(_rel(p).encode())
            h.update(p.read_bytes())
        h.update(json.dumps([self.kind, self.variant, self._config()]).encode())
        self.key = h.hexdigest()[:16]

    def _config(self):
        return [self.cflags, self.cuda_cflags, self.arch, torch.__version__, sys.version, BUILD_FORMAT]

    @property
    def label(self) -> str:
        return ",".join(v for _, v in self.variant)

    @property
    def module_name(self) -> str:
        if self.kind in ("binding", "module"):
            flavor = "cuda" if self.cuda_cflags or "-DLAB_WITH_CUDA" in self.cflags else "cpu"
            return f"lab_{self.family}_{flavor}"
        slug = "".join(f"_{v}" for _, v in self.variant)
        return f"lab_{self.family}_{self.kind}_{self.name}{slug}"

    @property
    def build_dir(self) -> Path:
        # One directory per target, configuration and checkout: a rebuild after an edit reuses it (ninja sees what
        # changed). The checkout is part of it because torch's build.ninja there names its include directories (and
        # the PCH reads its flags back from it): two clones of the same sources sharing one cache once left a
        # build.ninja naming a deleted clone, and the other clone's PCH failed on <ATen/ATen.h>.
        cfg = hashlib.sha256(json.dumps(self._config() + [str(env.SRC_ROOT)]).encode()).hexdigest()[:8]
        return env.cache_dir() / f"{self.module_name}-{cfg}"

    @property
    def artifact(self) -> Path:
        return self.build_dir / "loaded" / f"{self.module_name}.{self.key}.so"

    @property
    def display(self) -> str:
        src = _rel(self.sources[0]) if self.kind != "module" else ", ".join(_rel(p) for p in self.sources)
        return src + (f" [{self.label}]" if self.variant else "")

    @property
    def is_python_module(self) -> bool:
        return self.kind in ("binding", "module")


@dataclass
class Spec:
    """Everything `family` builds for `flavor`: the binding (or single module) and its units."""
    family: str
    flavor: str
    binding: Target
    units: list[Target]
    skipped_cuda: list[Path]       # CUDA units not built in this flavor (cpu), so a caller can say so
    filtered: list[str]            # unit variants left out by only=

    @property
    def targets(self) -> list[Target]:
        return [self.binding] + self.units

    @property
    def files(self) -> list[Path]:
        seen: dict[Path, None] = {}
        for t in self.targets:
            for p in t.sources + t.headers:
                seen.setdefault(p, None)
        for p in self.skipped_cuda:
            seen.setdefault(p, None)
        return list(seen)

    @property
    def key(self) -> str:
        return hashlib.sha256(" ".join(t.key for t in self.targets).encode()).hexdigest()[:16]

    # single-file layout compatibility
    @property
    def sources(self) -> list[Path]:
        return [p for t in self.targets for p in t.sources]

    @property
    def headers(self) -> list[Path]:
        return sorted({p for t in self.targets for p in t.headers})

    @property
    def artifact(self) -> Path:
        return self.binding.artifact

    @property
    def build_dir(self) -> Path:
        return self.binding.build_dir


@functools.lru_cache(maxsize=None)
def _no_gnu_unique() -> list[str]:
    """["-fno-gnu-unique"] when the host compiler is GCC. GCC emits an `inline` function's static (a device-facts
    cache, a registry) as an STB_GNU_UNIQUE symbol, which the dynamic linker merges across every module of the
    process whatever RTLD_LOCAL says: a unit rebuilt after an edit would then share -- or, after a header edit that
    changes its layout, misread -- the statics of the copy it replaces, and two families' bindings would share one
    table. Each module keeps its own with this flag (clang does not emit such symbols)."""
    cxx = os.environ.get("CXX", "c++")
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [] if "clang" in out.lower() else ["-fno-gnu-unique"]


def _flags(flavor: str) -> tuple[list[str], list[str], str]:
    cflags = list(CPP_FLAGS) + _no_gnu_unique() + (["-DLAB_WITH_CUDA"] if flavor == "cuda" else [])
    if flavor != "cuda":
        return cflags, [], ""
    flags, arch = cuda_arch()
    return cflags, list(CUDA_FLAGS) + [f"-Xcompiler={f}" for f in _no_gnu_unique()] + flags, arch


def spec(family: str, flavor: str | None = None, only=None) -> Spec:
    flavor = flavor or default_flavor()
    if flavor not in ("cpu", "cuda"):
        raise ValueError(f"flavor must be 'cpu' or 'cuda', got {flavor!r}")
    check_torch()
    if only is None:
        only = os.environ.get("LAB_ONLY") or None
    want = parse_only(only)
    cflags, cuda_cflags, arch = _flags(flavor)
    if not is_folder_family(family):
        cpp = env.CPP_SRC / f"{family}.cpp"
        if not cpp.exists():
            known = families_on_disk()
            raise BuildError(family, f"no source {_rel(env.CPP_SRC / family / (family + '.cpp'))} (or "
                                     f"{_rel(cpp)}); families on disk: {', '.join(known) or 'none'}")
        cu = env.CUDA_SRC / f"{family}.cu"
        srcs = [cpp] + ([cu] if flavor == "cuda" else [])
        if flavor == "cuda" and not cu.exists():
            raise BuildError(family, f"no CUDA source {_rel(cu)}")
        t = Target(family, "module", family, srcs, headers(srcs), cflags, cuda_cflags, arch)
        return Spec(family, flavor, t, [], [cu] if flavor == "cpu" and cu.exists() else [], [])
    bsrc = env.CPP_SRC / family / f"{family}.cpp"
    opt = os.environ.get("LAB_BINDING_OPT", "").split() or list(BINDING_FLAGS)
    bflags = opt + cflags[len(CPP_FLAGS):]   # the PCH is built with these flags too (same -O)
    binding = Target(family, "binding", family, [bsrc], headers([bsrc]), bflags, [], arch if flavor == "cuda" else "")
    units: list[Target] = []
    filtered: list[str] = []
    for p in sorted((env.CPP_SRC / family).glob("*.cpp")):
        if p != bsrc:
            units += _unit_targets(family, "cpu", p, list(CPP_FLAGS) + _no_gnu_unique(), [], "", want, filtered)
    cus = sorted((env.CUDA_SRC / family).glob("*.cu"))
    if flavor == "cuda":
        for p in cus:
            units += _unit_targets(family, "cuda", p, list(CPP_FLAGS) + _no_gnu_unique(), cuda_cflags, arch, want,
                                   filtered)
    return Spec(family, flavor, binding, units, cus if flavor == "cpu" else [], filtered)


def _unit_targets(family, kind, src, cflags, cuda_cflags, arch, want, filtered) -> list[Target]:
    hdrs = headers([src])
    axes = variants_of(src)
    out = []
    for combo in itertools.product(*[[(k, v) for v in vals] for k, vals in axes]) if axes else [()]:
        if any(k in want and v not in want[k] for k, v in combo):
            filtered.append(f"{_rel(src)} [{','.join(v for _, v in combo)}]")
            continue
        defs = [f"-DLAB_VARIANT_{k}_{v}" for k, v in combo]
        out.append(Target(family, kind, src.stem, [src], hdrs, cflags + defs,
                          cuda_cflags + defs if kind == "cuda" else [], arch, tuple(combo)))
    return out


# --------------------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------------------
RECHECK_SECONDS = 0.0  # a loaded family's files are stat'ed on every call, so a save is seen by the next one


@dataclass
class _Loaded:
    spec: Spec
    module: types.ModuleType
    libs: dict                     # target key -> (Target, ctypes.CDLL)
    owners: dict                   # launcher name -> the unit (display name) that exports it
    files: list[str]               # the paths load() stats, as strings (see _signature)
    sig: tuple
    checked: float
    frozen_epoch: int = -1         # the frozen() block in which its files were last checked (-1: none)


_loaded: dict = {}                 # (family, flavor, source dirs, only) -> _Loaded
_frozen = threading.local()


@contextlib.contextmanager
def frozen():
    """Inside: load() checks a loaded family's files once, at its first call in the block (an edit saved before the
    block is built and loaded, never a stale kernel), then returns it without looking at them (timing loops call the
    wrappers, and so load(), thousands of times; a file check costs tens of us, which eager host timings would
    count). lab.timing runs every measurement inside one."""
    depth = getattr(_frozen, "depth", 0)
    if depth == 0:
        _frozen.epoch = getattr(_frozen, "epoch", 0) + 1
    _frozen.depth = depth + 1
    try:
        yield
    finally:
        _frozen.depth = depth
timing.TIMED_CONTEXTS.append(frozen)   # every lab.timing measurement runs frozen (a timed wrapper: no file check)
_libs_alive: list = []             # every unit library ever loaded: never unloaded (a graph may still hold a kernel)


def _signature(files: list) -> tuple:
    # load()'s per-call check (every kernel call outside a frozen() block): os.stat on the paths as strings, ~40% less
    # than Path.stat (17 files of kron's CPU build: 31 us against 52 on the CI machine)
    out = []
    for p in files:
        try:
            st = os.stat(p)
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def _dir_signature(family: str) -> tuple:
    # A new or removed unit file changes its folder's mtime.
    out = []
    for d in (env.CPP_SRC / family, env.CUDA_SRC / family):
        try:
            out.append(d.stat().st_mtime_ns)
        except OSError:
            out.append(None)
    return tuple(out)


def load(family: str, flavor: str | None = None, *, verbose: bool = True, force: bool = False,
         max_age: float = RECHECK_SECONDS, only=None) -> types.ModuleType:
    """The family's binding module with every unit's launchers registered, rebuilding whatever changed on disk.

    flavor: 'cuda' (CUDA units + CPU units; default when a GPU is visible) or 'cpu' (CPU units only).
    verbose: print build progress (what is compiled, a heartbeat, the time each unit took).
    only: build only these variants, e.g. {'dtype': 'f32'} or 'dtype=f32' (default: $LAB_ONLY, else all).

    Called on every kernel call, so it is cheap when nothing changed: it stats the family's files (a few us) and
    does more only if one changed; then only the targets whose content key changed are compiled (in parallel) and
    reloaded. If a build fails, BuildError is raised and the last good module and units stay loaded.
    """
    flavor = flavor or default_flavor()
    only_key = json.dumps(sorted((k, sorted(v)) for k, v in parse_only(only).items())) if only else \
        os.environ.get("LAB_ONLY", "")
    k = (family, flavor, env.CPP_SRC, env.CUDA_SRC, only_key)
    hit = _loaded.get(k)
    epoch = _frozen.epoch if getattr(_frozen, "depth", 0) else -1
    if hit and not force:
        if epoch >= 0 and hit.frozen_epoch == epoch:
            return hit.module
        now = time.monotonic()
        if max_age and now - hit.checked < max_age:
            return hit.module
        if _signature(hit.files) == hit.sig:
            hit.checked, hit.frozen_epoch = now, epoch
            return hit.module
    with _lock:
        s = spec(family, flavor, only)
        files = [str(p) for p in (s.files + [env.CPP_SRC / family, env.CUDA_SRC / family] if is_folder_family(family)
                                  else s.files)]
        hit = _loaded.get(k)
        if hit and hit.spec.key == s.key and not force:
            hit.files, hit.sig, hit.checked, hit.frozen_epoch = files, _signature(files), time.monotonic(), epoch
            hit.spec = s
            return hit.module
        todo = [t for t in s.targets if force or not t.artifact.exists()]
        if todo:
            _compile_many(todo, verbose, what=f"{family} ({flavor}{', ' + s.binding.arch if s.binding.arch else ''})")
        old_libs = hit.libs if hit else {}
        module = hit.module if hit and hit.spec.binding.key == s.binding.key and not force else _import(s.binding)
        libs = {}
        for t in s.units:
            libs[t.key] = old_libs.get(t.key) or (t, _load_unit(t))
        owners = _register(module, libs.values()) if s.units else {}
        _loaded[k] = _Loaded(s, module, libs, owners, files, _signature(files), time.monotonic(), epoch)
        return module


def _import(t: Target) -> types.ModuleType:
    # A fresh path per key, so dlopen and CPython's extension cache load the new code; and a fresh dotted name per key,
    # because pybind11 >= 3 caches modules by spec name and would hand back the old one. The init symbol is looked
    # up by the last component (PyInit_lab_<family>_<flavor>), which stays the same.
    spec_ = importlib.util.spec_from_file_location(f"lab_ext_{t.key}.{t.module_name}", t.artifact)
    mod = importlib.util.module_from_spec(spec_)
    try:
        spec_.loader.exec_module(mod)
    except ImportError as e:
        raise BuildError(t.family, f"built, but the module does not load: {e} (an undefined symbol usually means a "
                                   "function declared in the binding has no definition)") from e
    mod.__lab_key__ = t.key
    return mod


class _LabExport(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("fn", ctypes.c_void_p)]


def _load_unit(t: Target) -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(str(t.artifact), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as e:
        raise BuildError(t.family, f"{t.display}: built, but it does not load: {e}") from e
    _libs_alive.append(lib)
    return lib


def unit_exports(lib: ctypes.CDLL, t: Target) -> dict[str, int]:
    """{registered name: address} of a loaded unit: its table, names suffixed '@variant' for variant builds."""
    try:
        fn = lib.lab_exports
    except AttributeError:
        raise BuildError(t.family, f"{t.display} exports no launchers: end it with LAB_EXPORTS(LAB_EXPORT(\"name\", "
                                   "fn), ...) from lab_unit.h") from None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ctypes.POINTER(_LabExport))]
    table = ctypes.POINTER(_LabExport)()
    n = fn(ctypes.byref(table))
    suffix = f"@{t.label}" if t.variant else ""
    return {table[i].name.decode() + suffix: table[i].fn for i in range(n)}


def _register(module: types.ModuleType, libs) -> None:
    if not hasattr(module, "_lab_register"):
        raise BuildError(module.__name__, "the binding has no _lab_register: call LAB_BIND_UNITS(m) in its "
                                          "PYBIND11_MODULE (lab_common.h)")
    table: dict[str, int] = {}
    owner: dict[str, str] = {}
    rt = None
    for t, lib in libs:
        for name, addr in unit_exports(lib, t).items():
            if name in table:
                raise BuildError(t.family, f"launcher '{name}' is exported by both {owner[name]} and {t.display}")
            table[name], owner[name] = addr, t.display
        if t.kind == "cpu":  # hand the CPU unit torch's thread pool (lab::parallel_for)
            rt = rt if rt is not None else module._lab_cpu_runtime()
            hook = lib.lab_set_cpu_runtime
            hook.argtypes, hook.restype = [ctypes.c_void_p], None
            hook(rt or None)
    module._lab_register(table, True)
    return owner


def exports(family: str, flavor: str | None = None) -> dict[str, str]:
    """{launcher name: unit that exports it} of the loaded family (loading it if needed)."""
    load(family, flavor, verbose=False)
    flavor = flavor or default_flavor()
    for k, v in _loaded.items():
        if k[:4] == (family, flavor, env.CPP_SRC, env.CUDA_SRC):
            return dict(v.owners)
    return {}


# --------------------------------------------------------------------------------------------------------------
# Compiling
# --------------------------------------------------------------------------------------------------------------
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


def leftover_processes(bdir: Path) -> list[tuple[int, str]]:
    """Processes (pid, command) whose working directory is `bdir`: ninja and the compilers of a build whose Python
    process was killed keep running there. Linux /proc; empty elsewhere."""
    out = []
    try:
        target = os.path.realpath(bdir)
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == os.getpid():
                continue
            try:
                if os.readlink(f"/proc/{d}/cwd") == target:
                    cmd = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                    out.append((int(d), os.path.basename(cmd)))
            except OSError:
                continue
    except OSError:
        pass
    return out


def _settle_leftovers(bdir: Path, what: str, verbose: bool, wait_s: float = 60.0) -> None:
    """Under the target's lock: let a killed build's compilers finish (they hold no lock), stop them after wait_s."""
    left = leftover_processes(bdir)
    if not left:
        return
    if verbose:
        print(f"[lab] a killed build of {what} left {', '.join(f'{c} (pid {p})' for p, c in left)} running; "
              f"waiting up to {wait_s:.0f} s for it ...", flush=True)
    t0 = time.monotonic()
    while left and time.monotonic() - t0 < wait_s:
        time.sleep(0.2)
        left = leftover_processes(bdir)
    for pid, _ in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


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
    for root in (env.SRC_ROOT, env.ROOT):
        try:
            return str(Path(p).relative_to(root))
        except ValueError:
            continue
    return str(p)


def _line_directive(p: Path) -> str:
    return f'#line 1 "{p}"\n' + p.read_text()


_tls = threading.local()


def _install_build_only_hook(cpp_extension) -> None:
    """load_inline has no build-only mode: it always loads <build>/<name>.so, which in a process that loaded an
    earlier build is the stale module (and for a plain library, torch.ops.load_library would load it globally).
    While this thread builds, that load is skipped and we load the content-keyed copy ourselves; other callers of
    load_inline are unaffected."""
    if getattr(cpp_extension, "_lab_hooked", False):
        return
    real = cpp_extension._import_module_from_library

    def import_unless_building(*args, **kwargs):
        return None if getattr(_tls, "build_only", False) else real(*args, **kwargs)

    cpp_extension._import_module_from_library = import_unless_building
    cpp_extension._lab_hooked = True


_last_build_seconds: dict[tuple[str, str], float] = {}
_unit_build_seconds: dict[str, float] = {}


def _compile_many(targets: list[Target], verbose: bool, what: str) -> None:
    """Compile targets in parallel (each is one load_inline/ninja run); raise the first BuildError after all ended."""
    if verbose:
        names = ", ".join(t.display.split("/")[-1] for t in targets)
        print(f"[lab] building {what}: {len(targets)} target(s): {names}", flush=True)
    t0 = time.perf_counter()
    workers = max(1, min(len(targets), os.cpu_count() or 2))
    errors: list[BuildError] = []
    with _heartbeat(what, verbose):
        if workers == 1:
            results = [_try_compile(t, verbose) for t in targets]
        else:
            with ThreadPoolExecutor(max_workers=workers) as ex:
                results = list(ex.map(lambda t: _try_compile(t, verbose), targets))
    errors = [r for r in results if isinstance(r, BuildError)]
    seconds = time.perf_counter() - t0
    fam = targets[0].family
    flavor = "cuda" if "(cuda" in what else "cpu"
    if any(r is True for r in results):  # something was compiled here (not by another process we waited for)
        _last_build_seconds[(fam, flavor)] = seconds
    if errors:
        raise errors[0]
    if verbose:
        print(f"[lab] built {what} in {seconds:.1f} s", flush=True)


def _try_compile(t: Target, verbose: bool):
    try:
        return _compile(t, verbose)
    except BuildError as e:
        return e


def _compile(t: Target, verbose: bool) -> bool:
    """Compile one target (under its flock) and publish the keyed copy of its library; does not load it.
    Returns False when another process built it while this one waited for the lock."""
    from torch.utils import cpp_extension  # on first compile, not at `import lab` (~0.13 s; a cached load skips it)

    bdir = t.build_dir
    bdir.mkdir(parents=True, exist_ok=True)
    with _flock(bdir / ".lab-build.lock", t.display, verbose):
        if t.artifact.exists():  # another process built it while we waited
            return False
        _settle_leftovers(bdir, t.display, verbose)
        # torch's FileBaton: nobody else can be building here while we hold the flock, so a leftover is stale.
        (bdir / "lock").unlink(missing_ok=True)
        # torch builds only when its in-process versioner sees a change, and renames the module (name_v1, ...) when
        # it does, which changes -DTORCH_EXTENSION_NAME and recompiles everything. Forget the entry: our key decides.
        cpp_extension.JIT_EXTENSION_VERSIONER.entries.pop(t.module_name, None)
        if os.environ.get("CUDA_HOME") and cpp_extension.CUDA_HOME != os.environ["CUDA_HOME"]:
            cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"]  # imported before env.py could point it at the toolkit
        _install_build_only_hook(cpp_extension)
        cpp = [_line_directive(p) for p in t.sources if p.suffix == ".cpp"]
        cu = [_line_directive(p) for p in t.sources if p.suffix == ".cu"]
        with_cuda = bool(cu) or "-DLAB_WITH_CUDA" in t.cflags
        includes = [str(env.CPP_SRC), str(env.CUDA_SRC)] + [str(p.parent) for p in t.sources]
        pch = pch_dir(t)
        if pch is not None:
            includes.insert(0, str(pch))  # searched first: g++ takes lab_common.h.gch there when it is valid
        t0 = time.perf_counter()
        _tls.build_only = True
        try:
            cpp_extension.load_inline(
                name=t.module_name, cpp_sources=cpp, cuda_sources=cu or None,
                extra_cflags=t.cflags, extra_cuda_cflags=t.cuda_cflags or None,
                extra_include_paths=includes,
                build_directory=str(bdir), with_cuda=with_cuda, verbose=False, no_implicit_headers=True,
                is_python_module=t.is_python_module)
        except (RuntimeError, OSError) as e:
            log = str(e)
            log_path = bdir / "last-error.log"
            log_path.write_text(log)
            raise BuildError(t.family, summarize_log(log), log, log_path) from None
        finally:
            _tls.build_only = False
        seconds = time.perf_counter() - t0
        built = bdir / f"{t.module_name}.so"
        t.artifact.parent.mkdir(exist_ok=True)
        tmp = t.artifact.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
        shutil.copy2(built, tmp)
        os.replace(tmp, t.artifact)  # atomic: a concurrent reader sees no file or the whole file
        _prune(t)
        _unit_build_seconds[t.display] = seconds
        if verbose:
            print(f"[lab]   compiled {t.display} in {seconds:.1f} s", flush=True)
        if t.kind == "binding" and pch is None:
            start_pch(t)
        return True


def _pch_flags(t: Target) -> list[str] | None:
    """The flags torch's ninja file gave this binding's main.cpp (read back from the build.ninja it wrote: they vary
    with the torch version -- -std, -D_GLIBCXX_USE_CXX11_ABI, pybind11's ABI macros -- and g++ rejects a PCH built
    with other macros or dialect), less the module name, which differs per family and which lab_common.h does not
    use. None before the binding was first built."""
    ninja = t.build_dir / "build.ninja"
    if not ninja.exists():
        return None
    vals = {}
    for ln in ninja.read_text().splitlines():
        k, sep, v = ln.partition(" = ")
        if sep and k in ("cflags", "post_cflags"):
            vals[k] = shlex.split(v)
    if "cflags" not in vals:
        return None
    return [f for f in vals["cflags"] + vals.get("post_cflags", []) if not f.startswith("-DTORCH_EXTENSION_NAME=")]


def _pch_key_dir(t: Target) -> Path | None:
    hdr = env.CPP_SRC / PCH_HEADER
    if t.kind not in ("binding", "module") or os.environ.get("LAB_PCH", "1") == "0":
        return None
    if not hdr.exists() or hdr not in t.headers:
        return None
    # pch-<configuration>-<content>: what decides torch's flags (the binding's flags, torch, Python, the source root),
    # then the header files' bytes. A new content replaces the old PCH of its configuration, no other.
    cfg = hashlib.sha256(json.dumps([t.cflags, t.arch, torch.__version__, sys.version, BUILD_FORMAT,
                                     str(env.CPP_SRC)]).encode()).hexdigest()[:8]
    h = hashlib.sha256()
    for p in [hdr] + headers([hdr]):
        h.update(p.read_bytes())
    return env.cache_dir() / f"pch-{cfg}-{h.hexdigest()[:8]}"


def pch_dir(t: Target) -> Path | None:
    """For a binding: the folder holding a lab_common.h.gch that g++ was seen to accept with this binding's flags, or
    None (PCH off, not a binding, not built yet, or rejected: the binding then compiles the header as usual)."""
    d = _pch_key_dir(t)
    if d is None or not (d / "accepted").exists():
        return None
    return d


def start_pch(t: Target) -> None:
    """After a binding was compiled: build the PCH for its configuration in the background (once per process), for
    the next binding build. Waiting for it would put it on the cold build's critical path."""
    d = _pch_key_dir(t)
    if d is None or (d / "accepted").exists() or (d / "rejected.log").exists():
        return
    flags = _pch_flags(t)
    if flags is None:
        return
    with _pch_lock:  # not _lock: load() holds that while the build pool's threads get here
        if d in _pch_started:
            return
        _pch_started.add(d)
        threading.Thread(target=_build_pch, args=(d, flags, env.CPP_SRC / PCH_HEADER), daemon=True).start()


_pch_started: set = set()
_pch_lock = threading.Lock()


def _build_pch(d: Path, flags: list[str], hdr: Path) -> None:
    from torch.utils import cpp_extension  # (lazy, as in _compile)
    gch = d / f"{PCH_HEADER}.gch"
    d.mkdir(parents=True, exist_ok=True)
    with _flock(d / ".lab-build.lock", "the precompiled header", False):
        if (d / "accepted").exists() or (d / "rejected.log").exists():
            return
        cfg = d.name.split("-")[1]
        for old in env.cache_dir().glob("pch-*"):   # a stale PCH is ~0.5 GB: one per configuration
            mine = old.name.startswith(f"pch-{cfg}-") or old.name.count("-") == 1   # (or of the older naming)
            if mine and old != d and time.time() - old.stat().st_mtime > 600:
                shutil.rmtree(old, ignore_errors=True)
        cxx = cpp_extension.get_cxx_compiler() if hasattr(cpp_extension, "get_cxx_compiler") else \
            os.environ.get("CXX", "c++")
        tmp = d / f"{PCH_HEADER}.gch.tmp{os.getpid()}"
        t0 = time.perf_counter()
        r = subprocess.run([cxx, *flags, "-x", "c++-header", str(hdr), "-o", str(tmp)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            tmp.unlink(missing_ok=True)
            if r.returncode < 0:   # killed (a signal, e.g. the OOM killer): not a verdict on the flags, try again later
                return
            (d / "rejected.log").write_text(f"building the PCH failed (g++ exit status {r.returncode}):\n" + r.stderr)
            return
        os.replace(tmp, gch)
        _unit_build_seconds[f"{PCH_HEADER}.gch"] = time.perf_counter() - t0
        # g++ drops a PCH it finds unfit without a word (and parses the header instead): ask it. With -H it prints
        # "! <path>.gch" for a PCH it uses; -Winvalid-pch says why not. ~0.5 s when it is accepted.
        probe = d / "probe.cpp"
        probe.write_text(f'#include "{PCH_HEADER}"\n')
        r = subprocess.run([cxx, f"-I{d}", *flags, "-H", "-Winvalid-pch", "-fsyntax-only", str(probe)],
                           capture_output=True, text=True)
        if r.returncode == 0 and any(ln.startswith("! ") and ln.rstrip().endswith(".gch")
                                     for ln in r.stderr.splitlines()):
            (d / "flags.json").write_text(json.dumps(flags))
            (d / "accepted").write_text("")
        else:
            gch.unlink(missing_ok=True)
            (d / "rejected.log").write_text("g++ did not use the PCH:\n" + "\n".join(
                ln for ln in r.stderr.splitlines() if not ln.startswith(". ")))


def wait_for_pch(timeout: float = 600) -> None:
    """Block until background PCH builds of this process ended (the build-time benchmark uses it)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        busy = [t for t in threading.enumerate() if getattr(t, "_target", None) is _build_pch and t.is_alive()]
        if not busy:
            return
        time.sleep(0.2)


def last_build_seconds(family: str, flavor: str | None = None) -> float | None:
    """Wall time of the last compile of `family` in this process (None if it came from the cache)."""
    return _last_build_seconds.get((family, flavor or default_flavor()))


def _prune(t: Target, keep: int = 6) -> None:
    """Keep the newest few keyed copies; older ones only cost disk (a loaded one stays mapped if deleted)."""
    olds = sorted(t.artifact.parent.glob(f"{t.module_name}.*.so"), key=lambda p: p.stat().st_mtime, reverse=True)
    for p in olds[keep:]:
        p.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------------------------
# Error mapping
# --------------------------------------------------------------------------------------------------------------
_ERR_RE = re.compile(r"^(?P<file>[^\s:][^:\n]*?)(?::(?P<line>\d+)(?::(?P<col>\d+))?|\((?P<pline>\d+)\)):\s*"
                     r"(?:fatal\s+)?error\b:?\s*(?P<msg>[^\n]*)", re.M)


def summarize_log(log: str) -> str:
    """The first compiler error as `path:LINE: error: message` (the same form for nvcc's `path(LINE)` and g++'s
    `path:LINE:COL`), then that source line, marked; else the log's last lines."""
    m = _ERR_RE.search(log)
    if not m:
        for line in log.splitlines():
            if "undefined reference" in line or "ld returned" in line or "error" in line.lower():
                return line.strip()
        return "\n".join(log.strip().splitlines()[-15:])
    path, line = m.group("file").strip(), int(m.group("line") or m.group("pline"))
    msg = f"{_rel(Path(path).resolve())}:{line}: error: {m.group('msg').strip()}"
    try:
        src = Path(path).read_text().splitlines()[line - 1]
        msg += f"\n  > {line:4d} | {src.rstrip()}"
        col = m.group("col")
        if col:
            msg += "\n         | " + " " * (int(col) - 1) + "^"
    except (OSError, IndexError):
        pass
    return msg


# --------------------------------------------------------------------------------------------------------------
# The CUDA toolkit's programs, and standalone programs outside the family builds
# --------------------------------------------------------------------------------------------------------------
def cuda_tool(name: str) -> str | None:
    """Path of a CUDA toolkit program (nvcc, cuobjdump, ...): $CUDA_HOME/bin first (the toolkit the builds use;
    env.py points CUDA_HOME at it), then PATH; None when neither has it."""
    home = os.environ.get("CUDA_HOME")
    cands = ([os.path.join(home, "bin", name)] if home else []) + [shutil.which(name) or ""]
    return next((c for c in cands if c and os.path.exists(c)), None)


def nvcc_path() -> str | None:
    """The nvcc the builds use, or None (no CUDA toolkit: set CUDA_HOME or put nvcc on PATH)."""
    return cuda_tool("nvcc")


def compile_standalone(src: Path | str, out: Path | str, defines: list[str] | tuple[str, ...] = (),
                       flags: list[str] | tuple[str, ...] = ("-O2",), timeout: float = 300) -> tuple[bool, str]:
    """nvcc one standalone program (its own main(), no torch) into the executable `out`, for this machine's arch
    (cuda_arch(); sm_90 when there is neither a GPU nor TORCH_CUDA_ARCH_LIST: such a program is then only compiled).
    defines: ["N=4", ...] -> -DN=4. Returns (built, the compiler's output)."""
    cc = nvcc_path()
    if cc is None:
        return False, "nvcc not found (set CUDA_HOME or put nvcc on PATH)"
    try:
        arch = cuda_arch()[0]
    except BuildError:
        arch = ["-arch=sm_90"]
    cmd = [cc, *arch, *flags, *[f"-D{d}" for d in defines], str(src), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return r.returncode == 0, (r.stdout + r.stderr).strip()


def run_standalone(binary: Path | str, *args: str, timeout: float = 120) -> tuple[int, str]:
    """Run a standalone program in its own process (a fault there leaves this process's CUDA context intact):
    (exit status, stdout + stderr)."""
    r = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=timeout)
    return r.returncode, (r.stdout + r.stderr).strip()


def resource_usage(family: str) -> str:
    """Registers, shared memory, stack and spills per kernel, read off the built units by cuobjdump."""
    s = spec(family, "cuda")
    load(family, "cuda")
    cuobjdump = cuda_tool("cuobjdump") or "cuobjdump"   # not found: the run below says so
    arts = [t.artifact for t in s.targets if t.kind in ("cuda", "module")]
    out = []
    for a in arts:
        r = subprocess.run([cuobjdump, "--dump-resource-usage", str(a)], capture_output=True, text=True)
        out.append(r.stdout or r.stderr)
    return "\n".join(out)


def build_all(families: list[str], flavor: str | None = None, jobs: int | None = None,
              verbose: bool = True) -> dict[str, object]:
    """Build several families at once: every target of every family goes into one parallel pool, then each family
    is loaded. Returns {family: module or BuildError}."""
    flavor = flavor or default_flavor()
    out: dict[str, object] = {}
    todo: list[Target] = []
    for f in families:
        try:
            s = spec(f, flavor)
            todo += [t for t in s.targets if not t.artifact.exists()]
        except BuildError as e:
            out[f] = e
    if todo:
        workers = jobs or max(1, os.cpu_count() or 2)
        if verbose:
            print(f"[lab] building {len(todo)} target(s) of {len(families)} families ({flavor}) on {workers} "
                  "workers ...", flush=True)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers) as ex:
            list(ex.map(lambda t: _try_compile(t, verbose), todo))
        if verbose:
            print(f"[lab] compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    for f in families:
        if f in out:
            continue
        try:
            out[f] = load(f, flavor, verbose=verbose)
        except BuildError as e:
            out[f] = e
    return out


def skipped_cuda_sources(family: str, flavor: str | None = None) -> list[Path]:
    """The CUDA sources a `flavor` build of the family does not compile (all of them in the cpu flavor)."""
    try:
        return spec(family, flavor).skipped_cuda
    except BuildError:
        return []
