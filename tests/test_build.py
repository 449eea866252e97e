"""lab.build: JIT from disk that is never stale, maps errors to the real file, and never hangs.

These tests build a toy family in a scratch source tree and cache (pybind11 only, no torch headers, so each build
takes seconds), and edit it the way a notebook user would.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from lab import build, env

ROOT = Path(__file__).resolve().parents[1]

TOY_CPP = textwrap.dedent("""\
    #include <pybind11/pybind11.h>
    #include "toy.h"
    int value() { return TOY_VALUE * 10 + 1; }
    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("value", &value); }
    """)
TOY_H = "#pragma once\n#define TOY_VALUE 4\n"


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A scratch tree with cpp_src/toy.cpp + toy.h, its own cache; lab.build reads sources from there."""
    cpp, cu = tmp_path / "cpp_src", tmp_path / "cuda_src"
    cpp.mkdir()
    cu.mkdir()
    (cpp / "toy.cpp").write_text(TOY_CPP)
    (cpp / "toy.h").write_text(TOY_H)
    monkeypatch.setattr(env, "SRC_ROOT", tmp_path)
    monkeypatch.setattr(env, "CPP_SRC", cpp)
    monkeypatch.setattr(env, "CUDA_SRC", cu)
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LAB_SRC_ROOT", str(tmp_path))
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_two_checkouts_do_not_share_a_build_directory(toy, monkeypatch, tmp_path_factory):
    # the same sources in another folder (a second clone) build in their own directories of a shared cache: torch's
    # build.ninja names the checkout's include paths, and the precompiled header reads its flags back from it
    t = build.spec("toy", "cpu").binding
    here = t.build_dir
    other = tmp_path_factory.mktemp("clone")
    monkeypatch.setattr(env, "SRC_ROOT", other)
    assert t.build_dir != here and t.build_dir.parent == here.parent
    monkeypatch.setattr(env, "SRC_ROOT", toy)
    assert t.build_dir == here


def test_build_cache_and_hot_reload(toy):
    m = build.load("toy", "cpu", verbose=False, max_age=0)
    assert m.value() == 41
    assert build.load("toy", "cpu", verbose=False, max_age=0) is m                  # same key: no rebuild, same module

    _edit(toy / "cpp_src" / "toy.cpp", "* 10 + 1", "* 10 + 2")           # edit the source, same process
    m2 = build.load("toy", "cpu", verbose=False, max_age=0)
    assert m2.value() == 42 and m2 is not m

    _edit(toy / "cpp_src" / "toy.h", "TOY_VALUE 4", "TOY_VALUE 5")        # header-only change
    assert build.load("toy", "cpu", verbose=False, max_age=0).value() == 52

    _edit(toy / "cpp_src" / "toy.h", "TOY_VALUE 5", "TOY_VALUE 4")        # back to a key built before: cached
    _edit(toy / "cpp_src" / "toy.cpp", "* 10 + 2", "* 10 + 1")
    build._last_build_seconds.clear()
    assert build.load("toy", "cpu", verbose=False, max_age=0).value() == 41
    assert build.last_build_seconds("toy", "cpu") is None


def test_key_covers_sources_headers_and_flags(toy, monkeypatch):
    k0 = build.spec("toy", "cpu").key
    assert build.spec("toy", "cpu").key == k0
    _edit(toy / "cpp_src" / "toy.h", "TOY_VALUE 4", "TOY_VALUE 4 ")
    k1 = build.spec("toy", "cpu").key
    assert k1 != k0
    monkeypatch.setattr(build, "CPP_FLAGS", ["-O2"])
    assert build.spec("toy", "cpu").key != k1
    assert [p.name for p in build.spec("toy", "cpu").headers] == ["toy.h"]


def test_compile_error_names_real_file_and_line_then_fix_rebuilds(toy):
    src = toy / "cpp_src" / "toy.cpp"
    _edit(src, "return TOY_VALUE * 10 + 1;", "return TOY_VALUE * 10 + undefined_name;")
    with pytest.raises(build.BuildError) as ei:
        build.load("toy", "cpu", verbose=False, max_age=0)
    msg = str(ei.value)
    assert "toy.cpp:3" in msg and "error" in msg                   # the real file and line, not build/main.cpp
    assert "undefined_name" in msg                                 # the offending source line is quoted
    assert "main.cpp" not in msg.splitlines()[0]
    assert ei.value.log_path.exists() and "undefined_name" in ei.value.log
    _edit(src, "undefined_name", "3")                              # fix it: the next load builds
    assert build.load("toy", "cpu", verbose=False, max_age=0).value() == 43


def test_missing_family_is_a_clear_error(toy):
    with pytest.raises(build.BuildError, match=r"no source cpp_src/nope/nope\.cpp \(or cpp_src/nope\.cpp\); "
                                               r"families on disk: toy"):
        build.load("nope", "cpu", verbose=False, max_age=0)


def test_stale_torch_lock_file_does_not_hang(toy):
    # torch's FileBaton leaves <build>/lock behind when a build is killed; the next torch build waits forever.
    s = build.spec("toy", "cpu")
    s.build_dir.mkdir(parents=True)
    (s.build_dir / "lock").write_text("")
    t0 = time.monotonic()
    assert build.load("toy", "cpu", verbose=False, max_age=0).value() == 41
    assert time.monotonic() - t0 < 300  # a hang would be stopped here, not by CI's limit


def _probe_env(toy):
    return {**os.environ, "LAB_SRC_ROOT": str(toy), "LAB_CACHE_DIR": str(toy / "cache"),
            "PYTHONPATH": str(ROOT)}


PROBE = ("import lab.build as b, sys; m = b.load('toy', 'cpu', verbose=False, max_age=0); "
         "print('VALUE', m.value(), 'BUILT', b.last_build_seconds('toy', 'cpu') is not None)")


def test_two_processes_building_at_once_both_succeed(toy):
    procs = [subprocess.Popen([sys.executable, "-c", PROBE], env=_probe_env(toy), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "VALUE 41" in out
    # exactly one of them compiled; the other waited on the lock and imported the result
    assert sum("BUILT True" in o for o, _ in outs) == 1


def test_warm_start_in_a_new_process_does_not_compile(toy):
    build.load("toy", "cpu", verbose=False, max_age=0)
    out = subprocess.run([sys.executable, "-c", PROBE], env=_probe_env(toy), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "VALUE 41 BUILT False" in out.stdout


def test_cuda_build_without_gpu_or_arch_list_says_what_to_do(toy, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the arch comes from the device")
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    (toy / "cuda_src" / "toy.cu").write_text("int cu_value() { return 7; }\n")
    with pytest.raises(build.BuildError, match="TORCH_CUDA_ARCH_LIST"):
        build.load("toy", "cuda", verbose=False, max_age=0)


def test_arch_list_parsing(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
    flags, label = build.cuda_arch()
    assert label == "sm_80,sm_90a"
    assert "-gencode=arch=compute_90a,code=sm_90a" in flags
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "hopper")
    with pytest.raises(build.BuildError, match="cannot read arch"):
        build.cuda_arch()


def _can_build_cuda() -> str | None:
    if torch.version.cuda is None:
        return "this torch is a CPU build: CUDA extensions need a CUDA build of torch"
    if not torch.cuda.is_available() and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return "no GPU and no TORCH_CUDA_ARCH_LIST: nothing to compile CUDA for"
    return None


@pytest.mark.skipif(_can_build_cuda() is not None, reason=str(_can_build_cuda()))
def test_cuda_flavor_edit_rebuilds_only_what_changed(toy):
    cu = toy / "cuda_src" / "toy.cu"
    cu.write_text('#include "lab_cuda.cuh"\n__global__ void k(int* p) { *p = 1; }\nint cu_value() { return 7; }\n')
    (toy / "cuda_src" / "lab_cuda.cuh").write_text((ROOT / "cuda_src" / "lab_cuda.cuh").read_text())
    (toy / "cpp_src" / "lab_unit.h").write_text((ROOT / "cpp_src" / "lab_unit.h").read_text())  # lab_cuda.cuh's
    _edit(toy / "cpp_src" / "toy.cpp", "int value()", "int cu_value();\nint value2() { return cu_value(); }\n"
                                                     "int value()")
    _edit(toy / "cpp_src" / "toy.cpp", 'm.def("value", &value);', 'm.def("value", &value); m.def("value2", &value2);')
    assert build.load("toy", "cuda", verbose=False, max_age=0).value2() == 7
    _edit(cu, "return 7;", "return 8;")
    assert build.load("toy", "cuda", verbose=False, max_age=0).value2() == 8
    _edit(cu, "return 8;", "return 8 +;")
    with pytest.raises(build.BuildError, match=r"toy\.cu[:(]3"):
        build.load("toy", "cuda", verbose=False, max_age=0)


# ---- the unit layout: a binding plus units, each its own build ---------------------------------------------------
# A toy folder family without torch headers (each build takes a second or two): the binding keeps its own launcher
# table (the real families use lab_common.h's, exercised by their own tests).
TOYU_BINDING = textwrap.dedent("""\
    #include <pybind11/pybind11.h>
    #include <pybind11/stl.h>
    #include <cstdint>
    #include <stdexcept>
    #include <string>
    #include <unordered_map>
    #include <vector>
    #include "lab_unit.h"
    static std::unordered_map<std::string, void*>& table() { static std::unordered_map<std::string, void*> t; return t; }
    int call(const std::string& name, int x) {
      auto it = table().find(name);
      if (it == table().end()) throw std::runtime_error("kernel '" + name + "' is not loaded");
      return reinterpret_cast<int (*)(int)>(it->second)(x);
    }
    int binding_version() { return 1; }
    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
      m.def("call", &call);
      m.def("binding_version", &binding_version);
      m.def("_lab_register", [](const std::unordered_map<std::string, uintptr_t>& f, bool clear) {
        if (clear) table().clear();
        for (auto& kv : f) table()[kv.first] = reinterpret_cast<void*>(kv.second);
      });
      m.def("_lab_launchers", [] { std::vector<std::string> v; for (auto& kv : table()) v.push_back(kv.first); return v; });
      m.def("_lab_cpu_runtime", [] { return uintptr_t(0); });  // no thread pool: lab::parallel_for runs serially
    }
    """)
TOYU_CPU = textwrap.dedent("""\
    #include "lab_unit.h"
    #include "toyu_shared.h"
    int value(int x) {
      int s = 0;
      lab::parallel_for(0, 10, 1, [&](int64_t lo, int64_t hi) { s += int(hi - lo); });
      return x * s + TOYU_OFFSET;
    }
    LAB_CPU_UNIT()
    LAB_EXPORTS(LAB_EXPORT("value", value))
    """)
TOYU_VAR = textwrap.dedent("""\
    // lab:variants k=a,b
    #include "lab_unit.h"
    #ifdef LAB_VARIANT_k_a
    int kind(int x) { return x + 100; }
    #else
    int kind(int x) { return x + 200; }
    #endif
    LAB_EXPORTS(LAB_EXPORT("kind", kind))
    """)


@pytest.fixture
def toyu(tmp_path, monkeypatch):
    cpp, cu = tmp_path / "cpp_src", tmp_path / "cuda_src"
    (cpp / "toyu").mkdir(parents=True)
    cu.mkdir()
    (cpp / "lab_unit.h").write_text((ROOT / "cpp_src" / "lab_unit.h").read_text())
    (cpp / "toyu" / "toyu.cpp").write_text(TOYU_BINDING)
    (cpp / "toyu" / "cpu.cpp").write_text(TOYU_CPU)
    (cpp / "toyu" / "var.cpp").write_text(TOYU_VAR)
    (cpp / "toyu" / "toyu_shared.h").write_text("#pragma once\n#define TOYU_OFFSET 1\n")
    monkeypatch.setattr(env, "SRC_ROOT", tmp_path)
    monkeypatch.setattr(env, "CPP_SRC", cpp)
    monkeypatch.setattr(env, "CUDA_SRC", cu)
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LAB_PCH", "0")
    monkeypatch.delenv("LAB_ONLY", raising=False)
    return tmp_path


def _compiled_during(fn) -> set[str]:
    build._unit_build_seconds.clear()
    fn()
    return set(build._unit_build_seconds)


def test_units_are_built_apart_and_handed_to_the_binding(toyu):
    s = build.spec("toyu", "cpu")
    assert [t.display for t in s.units] == ["cpp_src/toyu/cpu.cpp", "cpp_src/toyu/var.cpp [a]",
                                           "cpp_src/toyu/var.cpp [b]"]
    m = build.load("toyu", "cpu", verbose=False)
    assert m.call("value", 4) == 41                                      # 4 * 10 + 1 through the unit's pointer
    assert (m.call("kind@a", 1), m.call("kind@b", 1)) == (101, 201)     # one build per variant
    assert build.exports("toyu", "cpu") == {"value": "cpp_src/toyu/cpu.cpp", "kind@a": "cpp_src/toyu/var.cpp [a]",
                                            "kind@b": "cpp_src/toyu/var.cpp [b]"}


def test_an_edit_rebuilds_exactly_what_depends_on_it(toyu):
    m = build.load("toyu", "cpu", verbose=False)
    d = toyu / "cpp_src" / "toyu"
    # a unit: only that unit is compiled, the binding module stays the same object; the save is seen at once
    _edit(d / "cpu.cpp", "x * s + TOYU_OFFSET", "x * s + TOYU_OFFSET + 1")
    assert _compiled_during(lambda: build.load("toyu", "cpu", verbose=False)) == {"cpp_src/toyu/cpu.cpp"}
    assert build.load("toyu", "cpu", verbose=False) is m and m.call("value", 4) == 42
    # a header: the units that include it, nothing else
    _edit(d / "toyu_shared.h", "TOYU_OFFSET 1", "TOYU_OFFSET 5")
    assert _compiled_during(lambda: build.load("toyu", "cpu", verbose=False)) == {"cpp_src/toyu/cpu.cpp"}
    assert m.call("value", 4) == 46
    # one variant's code: both variants of that unit (they share the file), not the other unit
    _edit(d / "var.cpp", "return x + 200;", "return x + 300;")
    assert _compiled_during(lambda: build.load("toyu", "cpu", verbose=False)) == {"cpp_src/toyu/var.cpp [a]",
                                                                                  "cpp_src/toyu/var.cpp [b]"}
    assert (m.call("kind@a", 1), m.call("kind@b", 1)) == (101, 301)
    # the binding: a new module, and every unit registered into it without being rebuilt
    _edit(d / "toyu.cpp", "return 1; }", "return 2; }")
    assert _compiled_during(lambda: build.load("toyu", "cpu", verbose=False)) == {"cpp_src/toyu/toyu.cpp"}
    m2 = build.load("toyu", "cpu", verbose=False)
    assert m2 is not m and m2.binding_version() == 2 and m2.call("value", 4) == 46
    # a new unit file is picked up by the next call
    (d / "extra.cpp").write_text('#include "lab_unit.h"\nint extra(int x) { return -x; }\n'
                                 'LAB_EXPORTS(LAB_EXPORT("extra", extra))\n')
    assert build.load("toyu", "cpu", verbose=False).call("extra", 3) == -3


def test_a_unit_build_error_keeps_the_last_good_build(toyu):
    m = build.load("toyu", "cpu", verbose=False)
    src = toyu / "cpp_src" / "toyu" / "cpu.cpp"
    _edit(src, "return x * s + TOYU_OFFSET;", "return x * s + TOYU_OFFSET + undefined_name;")
    with pytest.raises(build.BuildError) as ei:
        build.load("toyu", "cpu", verbose=False)
    first = str(ei.value).splitlines()[0]
    assert "cpp_src/toyu/cpu.cpp:6: error:" in first                 # path:LINE: error:, the real file
    assert "undefined_name" in str(ei.value)                          # the offending line is shown
    assert m.call("value", 4) == 41                                   # the old unit is still what runs


def test_only_builds_the_variants_named(toyu):
    s = build.spec("toyu", "cpu", only={"k": "a"})
    assert [t.display for t in s.units] == ["cpp_src/toyu/cpu.cpp", "cpp_src/toyu/var.cpp [a]"]
    assert s.filtered == ["cpp_src/toyu/var.cpp [b]"]
    m = build.load("toyu", "cpu", verbose=False, only="k=a")
    assert m.call("kind@a", 1) == 101
    with pytest.raises(RuntimeError, match="kind@b"):
        m.call("kind@b", 1)
    with pytest.raises(ValueError, match="key=value"):
        build.parse_only("k")


def test_bad_variants_line_is_a_clear_error(toyu):
    _edit(toyu / "cpp_src" / "toyu" / "var.cpp", "k=a,b", "k=a,b-c")
    with pytest.raises(build.BuildError, match=r"var\.cpp: cannot read '// lab:variants"):
        build.spec("toyu", "cpu")


def test_leftover_compilers_of_a_killed_build_are_waited_for_then_stopped(toyu, tmp_path):
    bdir = tmp_path / "fake-build"
    bdir.mkdir()
    p = subprocess.Popen(["sleep", "60"], cwd=bdir)        # stands in for ninja/nvcc of a killed build
    try:
        assert p.pid in [pid for pid, _ in build.leftover_processes(bdir)]
        t0 = time.monotonic()
        build._settle_leftovers(bdir, "toy", verbose=False, wait_s=0.5)
        assert p.wait(timeout=10) is not None and time.monotonic() - t0 < 10
        assert build.leftover_processes(bdir) == []
    finally:
        p.kill()


def test_compiler_errors_have_one_form():
    src = ROOT / "cpp_src" / "lab_unit.h"
    nvcc = f"{src}(3): error: identifier \"x\" is undefined\n"
    gcc = f"{src}:3:7: error: 'x' was not declared in this scope\n"
    for log in (nvcc, gcc):
        msg = build.summarize_log(log)
        head = msg.splitlines()[0]
        assert head.startswith("cpp_src/lab_unit.h:3: error: "), head
        assert src.read_text().splitlines()[2].rstrip() in msg           # the source line, marked
    assert build.summarize_log(gcc).splitlines()[2].endswith("^")       # g++ gives a column: a caret under it


def test_old_torch_is_refused_with_the_floor():
    with pytest.raises(build.BuildError, match=r"torch 2\.3\.1 is too old.*>= "):
        build.check_torch("2.3.1")
    build.check_torch(torch.__version__)


def test_two_families_keep_their_own_launcher_tables():
    """Each binding has its own name -> launcher table. (An `inline` function's static is a GNU-unique symbol that
    the dynamic linker shares across modules: rope's registration then wiped basics' launchers.)"""
    basics = build.load("basics", "cpu", verbose=False)
    rope = build.load("rope", "cpu", verbose=False)
    b, r = set(basics._lab_launchers()), set(rope._lab_launchers())
    assert b and r and not (b & r)
    assert all(n.startswith("rope_") for n in r), sorted(r)[:5]
    x = torch.randn(37, dtype=torch.float64)
    torch.testing.assert_close(basics.square(x, torch.empty_like(x), 0), x * x)  # still its own launchers


def test_the_precompiled_header_is_accepted_by_gcc_with_the_bindings_flags():
    """The PCH is built with the flags torch's ninja file gave a binding, then g++ is asked (-H) whether it uses it.
    (Built from reconstructed flags, it was silently rejected on the H100's torch: binding edits took 22 s there.)"""
    if os.environ.get("LAB_PCH", "1") == "0":
        pytest.skip("LAB_PCH=0")
    build.load("basics", "cpu", verbose=False)
    binding = build.spec("basics", "cpu").binding
    build.start_pch(binding)
    build.wait_for_pch()
    d = build._pch_key_dir(binding)
    assert d is not None
    rejected = d / "rejected.log"
    assert build.pch_dir(binding) == d, rejected.read_text() if rejected.exists() else "no PCH was built"
    assert (d / f"{build.PCH_HEADER}.gch").exists()


def test_every_timing_runs_frozen_so_a_wrapper_pays_no_source_check():
    """lab.timing enters what the layers above register (build.frozen): a timed lab wrapper skips its per-call stat
    of the sources, and nothing outside a timing is frozen."""
    from lab import timing
    seen = []
    timing.time_cpu(lambda: seen.append(getattr(build._frozen, "depth", 0)), min_run_time=0.01)
    assert seen and min(seen) >= 1
    assert getattr(build._frozen, "depth", 0) == 0


def test_a_frozen_block_checks_the_files_once_then_not_again(toy):
    """An edit saved before a timing starts is built at the block's first call (never a stale kernel); an edit inside
    the block is not looked for until the next block (no stat per timed call)."""
    m = build.load("toy", "cpu", verbose=False, max_age=0)
    assert m.value() == 41
    _edit(toy / "cpp_src" / "toy.cpp", "* 10 + 1", "* 10 + 2")
    with build.frozen():
        assert build.load("toy", "cpu", verbose=False, max_age=0).value() == 42        # checked once: rebuilt
        _edit(toy / "cpp_src" / "toy.cpp", "* 10 + 2", "* 10 + 3")
        assert build.load("toy", "cpu", verbose=False, max_age=0).value() == 42        # not looked at again
        with build.frozen():                                                        # (a nested block: the same one)
            assert build.load("toy", "cpu", verbose=False, max_age=0).value() == 42
    with build.frozen():
        assert build.load("toy", "cpu", verbose=False, max_age=0).value() == 43        # the next block sees it
