"""Recorded profile tables (results/<device>/profiles.csv) and the figure drawn from them (issue 18, the CPU part):
kernel categories by name, a CPU profile run that records rows, and lab.plot.plot_profile reading only those rows."""
import torch

from lab import plot, profile, registry, steps

H100 = "NVIDIA H100 80GB HBM3"
OURS = frozenset({"square_v2", "gemv_v1", "gru_v3_kernel", "reduce_kernel"})


def test_kernel_categories_by_name_and_by_version():
    cat = profile.kernel_category
    # copies and fills, whoever launched them
    assert cat("Memcpy DtoD (Device -> Device)", True, OURS) == "copy"
    assert cat("Memcpy HtoD (Pageable -> Device)", False, OURS) == "copy"
    assert cat("void at::native::vectorized_elementwise_kernel<4, at::native::direct_copy_kernel_cuda(at::"
               "TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}, ...>(int, ...)",
               False, OURS) == "copy"
    assert cat("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 2, 128, 1>(...)",
               False, OURS) == "copy"
    assert cat("Memset (Device)", True, OURS) == "memset"
    # ours by the names our sources define, even where a library rule would match (gemv_v1 is not cuBLAS's)
    assert cat("void square_v2<float>(const float *, float *, long)", True, OURS) == "ours"
    assert cat("gemv_v1(float const*, float const*, float*, int, int)", True, OURS) == "ours"
    # ...but never a PyTorch kernel that shares a name with one of ours
    assert cat("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, ...>>(...)", True, OURS) == "other"
    # cuBLAS (cuBLASLt's nvjet/xmma/cutlass included) and cuDNN
    assert cat("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off"
               "_kernel__5x_cublas", False, OURS) == "cublas"
    assert cat("nvjet_tst_128x64_64x8_1x1_v_bz_TNN", True, OURS) == "cublas"
    assert cat("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, "
               "cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, ...>, float>(...)",
               False, OURS) == "cublas"
    assert cat("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(...)", False,
               OURS) == "cublas"
    assert cat("RNN_blockPersist_fp_GRU<float, float, float, 128, 1, true>(RNNPersistentArgs<float>)", False,
               OURS) == "cudnn"
    assert cat("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true>(...)", False,
               OURS) == "cudnn"
    # PyTorch's elementwise kernels, and its other kernels
    assert cat("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, "
               "1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)", True, OURS) == "elementwise"
    assert cat("vectorized_elementwise_kernel", True, OURS) == "elementwise"   # ncu's bare function name
    assert cat("void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, "
               "true>(...)", False, OURS) == "other"
    assert cat("triton_poi_fused_add_mul_0", False, OURS) == "elementwise"
    assert cat("triton_red_fused_sum_1", False, OURS) == "other"
    # a kernel no rule names: ours under one of our versions (a binding's helper), else other
    assert cat("void embedding::copy_rows<float>(...)", True, OURS) == "ours"
    assert cat("void some_library_kernel<float>(...)", False, OURS) == "other"


def test_our_kernels_are_read_from_the_sources():
    names = profile.our_kernels(profile.env.CUDA_SRC)
    assert {"square_v1", "square_v2", "gemv_v1", "gru_v3_kernel"} <= names   # incl. __launch_bounds__ declarations
    assert "__launch_bounds__" not in names


def test_kernel_identifier_and_short_names():
    name = ("void at::native::(anonymous namespace)::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
            "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)")
    assert profile.kernel_identifier(name) == "vectorized_elementwise_kernel"
    assert profile.kernel_identifier("square_v1(float const*, float*, long)") == "square_v1"
    assert profile.short_kernel_name("Memcpy DtoD (Device -> Device)", 40) == "Memcpy DtoD (Device -> Device)"
    assert profile.short_kernel_name(name, 12) == "vectorized_…"


def test_kernel_stats_count_each_device_event_once():
    """GPU: the device events per call (time and launches); the CPU events (operators, runtime calls) are not
    kernels. CPU: the operators' self time; the schedule's step scope is left out, the call's own scope named."""
    from types import SimpleNamespace as NS
    from torch.autograd import DeviceType

    def dev(name, us):
        return NS(name=name, device_type=DeviceType.CUDA, time_range=NS(elapsed_us=lambda: us))

    def cpu(name, self_us):
        return NS(name=name, device_type=DeviceType.CPU, self_cpu_time_total=self_us)

    step = NS(name="ProfilerStep#2", device_type=DeviceType.CUDA, is_user_annotation=True,
              time_range=NS(elapsed_us=lambda: 60.0))          # the step scope's span on the GPU: not a kernel
    evs = [cpu("aten::mm", 7.0), cpu("cudaLaunchKernel", 3.0), dev("sm90_gemm", 10.0), dev("sm90_gemm", 12.0),
           dev("Memset (Device)", 1.0), dev("gru_v3_kernel", 30.0), step]
    got = profile.kernel_stats(evs, "cuda", reps=2)
    assert got == [{"kernel": "gru_v3_kernel", "us_per_call": 15.0, "calls_per_call": 0.5},
                   {"kernel": "sm90_gemm", "us_per_call": 11.0, "calls_per_call": 1.0},
                   {"kernel": "Memset (Device)", "us_per_call": 0.5, "calls_per_call": 0.5}]
    evs = [cpu("ProfilerStep#2", 50.0), cpu(profile.CALL_SCOPE, 8.0), cpu("aten::pow", 20.0), cpu("aten::pow", 22.0)]
    got = profile.kernel_stats(evs, "cpu", reps=2)
    assert got == [{"kernel": "aten::pow", "us_per_call": 21.0, "calls_per_call": 1.0},
                   {"kernel": profile.OUTSIDE_ATEN, "us_per_call": 4.0, "calls_per_call": 0.5}]


def test_profile_on_the_cpu_records_rows_and_the_figure_draws_them(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    fam = registry.get("basics")
    op = fam.op("square")
    dev = torch.device("cpu")
    out = steps.profile_op(fam, op, dev, shape={"n": 4096})
    versions = [v.name for v in op.versions_for(dev, op.dtypes[0])]
    assert [t.split()[1] for t, _, _ in out] == versions
    rows = profile.read_profiles(family="basics", op="square")
    assert rows and {r["version"] for r in rows} == set(versions)
    assert {r["category"] for r in rows} == {"cpu-op"}                 # no kernels on a CPU: operators' self time
    assert {r["shape"] for r in rows} == {"n=4096"} and all(r["us_per_call"] > 0 for r in rows)
    assert {r["role"] for r in rows if r["version"] == "torch"} == {"baseline"}
    assert any(r["kernel"] == "aten::pow" or r["kernel"] == "aten::square" for r in rows if r["version"] == "torch")
    # the figure, drawn from the table just recorded: one bar per version, the baseline above ours
    fig = plot.plot_profile("basics", "square", save=False)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["torch", "cpu"]
    path = plot.plot_profile("basics", "square")
    assert path.exists() and path.name == "basics_square_float32_kernels.png"
    assert path.is_relative_to(tmp_path)
    # lab plot redraws it with the family's figures
    assert path in plot.plot_family(fam, rows[0]["device_name"])


def _gpu_rows(version, role, kernels, ts="2026-01-01T00:00:00", run="r1"):
    key = {"family": "gru", "op": "gru", "version": version, "role": role, "shape": "T=64 B=64 H=512",
           "dtype": "float32", "precision": "float32", "mode": "eager", "device": "cuda", "device_name": H100,
           "torch": "2.11.0", "cuda": "12.8", "commit": "abc1234", "timestamp": ts, "run_id": run}
    return [{**key, "kernel": k, "category": profile.kernel_category(k, role == "ours", OURS), "us_per_call": us,
             "calls_per_call": n, "reps": 3} for k, us, n in kernels]


def test_the_figure_reads_a_recorded_gpu_table_each_versions_newest_run(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    rows = (_gpu_rows("torch", "baseline", [("RNN_blockPersist_fp_GRU<float, float, float, 128, 1, true>(...)", 300, 1),
                                            ("nvjet_tst_128x64_64x8_1x1_v_bz_TNN", 200, 2),
                                            ("Memcpy DtoD (Device -> Device)", 5, 2)])
            + _gpu_rows("v1", "ours", [("void gates_kernel<float>(float const*, float*, int)", 900, 64),
                                       ("nvjet_tst_128x64_64x8_1x1_v_bz_TNN", 600, 64)], run="old")
            + _gpu_rows("v1", "ours", [("void gates_kernel<float>(float const*, float*, int)", 800, 64),
                                       ("nvjet_tst_128x64_64x8_1x1_v_bz_TNN", 500, 64)],
                        ts="2026-01-02T00:00:00", run="new")
            + _gpu_rows("v10", "ours", [("void gru_v3_kernel<float, 512>(...)", 380, 1)])
            + _gpu_rows("v3", "ours", [("void gru_v3_kernel<float, 512>(...)", 380, 1),
                                       ("void at::native::vectorized_elementwise_kernel<4, ...>(...)", 30, 2)]))
    profile.record(rows)
    got = plot.profile_rows("gru", "gru")
    assert {r["run_id"] for r in got if r["version"] == "v1"} == {"new"}     # a bar is one run, never two mixed
    assert sum(r["us_per_call"] for r in got if r["version"] == "v1") == 1300
    fig = plot.plot_profile("gru", "gru", save=False)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["torch", "v1", "v3", "v10"]   # natural ladder order
    assert len(ax.patches) == 3 + 2 + 2 + 1                                               # one segment per kernel
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["ours", "cublas", "cudnn", "elementwise", "copy"]
    path = plot.plot_profile("gru", "gru")
    assert path.exists() and path.parent == tmp_path / "nvidia-h100-80gb-hbm3" / "plots"
    assert plot.plot_profile("gru", "gru", dtype="bfloat16") is None                      # no rows: no figure
