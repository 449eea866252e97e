"""lab.survey: the trace is read right (each kernel under the operator that launched it, runtime calls counted inside
the profiled calls only, syncs and GPU idle gaps), the launch rules predicted from PyTorch's sources are computed
right, the rows round-trip through survey.csv into the figures; on the GPU, real traces carry kernel names, launch
configurations and the calls the notebook reads."""
import math

import pytest
import torch

from lab.studies import survey as S
from lab.models.seq2seq import Config

from conftest import needs_gpu

SMALL = Config(src_vocab=61, tgt_vocab=53, enc_emb=16, dec_emb=12, hidden=24, layers=1, src_len=5, max_len=4)
STAMP = {"device": "cuda", "device_name": "Synthetic GPU", "torch": "x", "cuda": "y", "commit": "c",
         "timestamp": "2026-01-01T00:00:00", "run_id": "r1"}


def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def synthetic_trace():
    """Two profiled calls of a 'linear' (aten::linear > aten::addmm, which launches a GEMM through the driver and a
    bias copy through the runtime), the second followed inside its window by an .item() (cudaMemcpyAsync +
    cudaStreamSynchronize, then one more kernel after the wait); a cudaDeviceSynchronize outside the windows."""
    ev = []
    for i, t0 in enumerate((0.0, 1000.0)):
        ev.append(_x("user_annotation", S.LABEL, t0, 400.0, **{"External id": 100 + i}))
        ev.append(_x("cpu_op", "aten::linear", t0 + 10, 60, **{"External id": 10 * i + 1,
                                                              "Input Dims": [[2, 8], [16, 8], [16]]}))
        ev.append(_x("cpu_op", "aten::t", t0 + 12, 5, **{"External id": 10 * i + 2}))
        ev.append(_x("cpu_op", "aten::addmm", t0 + 20, 45, **{"External id": 10 * i + 3,
                                                             "Input Dims": [[16], [2, 8], [8, 16]]}))
        ev.append(_x("cuda_runtime", "cudaMemcpyAsync", t0 + 25, 4, **{"External id": 10 * i + 3,
                                                                      "correlation": 50 * i + 1, "cbid": 41}))
        ev.append(_x("cuda_driver", "cuLaunchKernelEx", t0 + 35, 6, **{"External id": 10 * i + 3,
                                                                      "correlation": 50 * i + 2, "cbid": 307}))
        ev.append(_x("gpu_memcpy", "Memcpy DtoD (Device -> Device)", t0 + 30, 2, tid=7,
                     **{"External id": 10 * i + 3, "correlation": 50 * i + 1, "bytes": 128}))
        ev.append(_x("kernel", "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, "
                     "false>(float*, float const*)", t0 + 40, 8, tid=7,
                     **{"External id": 10 * i + 3, "correlation": 50 * i + 2, "grid": [4, 1, 1],
                        "block": [128, 1, 1], "registers per thread": 40, "shared memory": 1024,
                        "blocks per SM": 0.03, "warps per SM": 0.12, "est. achieved occupancy %": 6}))
    t0 = 1000.0
    ev.append(_x("cpu_op", "aten::item", t0 + 100, 80, **{"External id": 40}))
    ev.append(_x("cuda_runtime", "cudaMemcpyAsync", t0 + 105, 5, **{"External id": 40, "correlation": 90}))
    ev.append(_x("cuda_runtime", "cudaStreamSynchronize", t0 + 112, 60, **{"External id": 40, "correlation": 91}))
    ev.append(_x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", t0 + 110, 1, tid=7,
                 **{"External id": 40, "correlation": 90, "bytes": 1}))
    ev.append(_x("cuda_runtime", "cudaLaunchKernel", t0 + 190, 5, **{"correlation": 92}))
    ev.append(_x("kernel", "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                 "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
                 t0 + 197, 2, tid=7, **{"correlation": 92, "grid": [1, 1, 1], "block": [128, 1, 1],
                                        "registers per thread": 16, "shared memory": 0}))
    ev.append(_x("cuda_runtime", "cudaDeviceSynchronize", 1500.0, 10, correlation=99))   # outside both calls
    ev.append({"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}})
    return {"traceEvents": ev, "survey_reps": 2}


def test_short_names():
    assert S.short_name("void gemv2T_kernel_val<int, int, float>(float*, float const*)") == "gemv2T_kernel_val"
    assert S.short_name("void at::native::(anonymous namespace)::CatArrayBatchedCopy_vectorized<at::native::"
                        "(anonymous namespace)::OpaqueType<4u>, unsigned int, 3, 128, 1, 16, 4>(char*, ...)") \
        == "CatArrayBatchedCopy_vectorized"
    assert S.short_name("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
                        "std::array<char*, 3ul> >(int, ...)") == "vectorized_elementwise_kernel[CUDAFunctor_add]"
    assert S.short_name("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_coopB_TNT") == "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_coopB_TNT"
    assert S.short_name("Memcpy DtoD (Device -> Device)") == "Memcpy DtoD"
    assert S.short_name("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, false, 7>"
                        "(cublasGemvParamsEx<int>)") == "gemvx::kernel"
    assert S.short_name("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_"
                        "alignc4_execute_split_k_kernel__5x_cublas") == "sm80_xmma_gemm..tilesize64x64x8..split_k"
    assert S.short_name("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps"
                        "<float>, unsigned int, long, 4, 4> >(at::native::ReduceOp<float>)") == "reduce_kernel[ArgMaxOps]"
    assert S.parse_dim3("128x2x1") == (128, 2, 1) and S.parse_dim3(None) is None


def test_trace_attribution_counts_and_syncs():
    tr = S.parse(synthetic_trace())
    assert tr.reps == 2 and len(tr.windows) == 2
    assert {e["name"]: e["_top"] for e in tr.ops}["aten::addmm"] == "aten::linear"

    kr = S.kernel_rows(tr, "reference", "step", 2, STAMP)
    by = {S.short_name(r["kernel"]): r for r in kr}
    gemv = by["gemv2T_kernel_val"]
    assert (gemv["top_op"], gemv["op"]) == ("aten::linear", "aten::addmm")        # under the operator, once
    assert gemv["calls"] == 1 and gemv["device_us"] == 8.0
    assert (gemv["grid"], gemv["block"], gemv["regs"], gemv["smem"]) == ("4x1x1", "128x1x1", 40, 1024)
    assert gemv["elements"] == 2 * 16                                             # addmm's output (M, N)
    assert by["Memcpy DtoD"]["calls"] == 1 and by["Memcpy DtoD"]["grid"] is None
    assert by["Memcpy DtoH"]["op"] == "aten::item" and by["Memcpy DtoH"]["calls"] == 0.5
    fill = by["vectorized_elementwise_kernel[FillFunctor]"]                       # launched outside any operator
    assert (fill["top_op"], fill["op"], fill["calls"]) == (S.NO_OP, S.NO_OP, 0.5)
    assert sum(r["device_us"] for r in kr) == pytest.approx((2 * (8 + 2) + 1 + 2) / 2)

    by_op = S.api_rows(tr, "reference", "step", 2, STAMP)
    assert {(r["api"], r["top_op"]) for r in by_op if r["api"] == "cudaMemcpyAsync"} == {
        ("cudaMemcpyAsync", "aten::linear"), ("cudaMemcpyAsync", "aten::item")}
    assert next(r for r in by_op if r["api"] == "cudaLaunchKernel")["top_op"] == S.NO_OP
    assert next(r for r in by_op if r["api"] == "cuLaunchKernelEx")["category"] == "cuda_driver"
    api = {r["api"]: r for r in S._api_totals(by_op)}
    assert api["cuLaunchKernelEx"]["calls"] == 1
    assert api["cudaMemcpyAsync"]["calls"] == 1.5                                 # 2 bias copies + 1 item, 2 calls
    assert api["cudaStreamSynchronize"]["calls"] == 0.5
    assert api["cudaStreamSynchronize"]["host_us"] == 30.0
    assert "cudaDeviceSynchronize" not in api                                     # outside the profiled calls
    assert api[S.KERNELS]["calls"] == (4 + 2) / 2

    host = {(r["top_op"], r["op"]): r for r in S.host_rows(tr, "reference", "step", 2, STAMP)}
    assert host[("aten::linear", "aten::linear")]["host_us"] == 60 - 5 - 45        # self time
    assert host[("aten::linear", "aten::addmm")]["calls"] == 1

    call, sync = S.call_rows(tr, "reference", "step", 2, STAMP)
    assert call["calls"] == 3 and call["host_us"] == 400.0
    # call 1: device events 30-32, 40-48 -> busy 10, span 18; call 2: + DtoH 1110-1111 and the fill 1197-1199
    assert call["device_us"] == pytest.approx((10 + 13) / 2)
    assert call["span_us"] == pytest.approx((18 + 169) / 2)
    assert call["idle_us"] == pytest.approx((8 + 156) / 2)
    assert sync["api"] == "cudaStreamSynchronize" and sync["calls"] == 0.5
    assert sync["idle_us"] == pytest.approx((1197 - 1172) / 2)                     # the wait's end -> next kernel


def test_launch_rules_from_the_sources():
    # cat: 16-byte vectors (4 floats) per thread, 128 threads a block, one grid row per input, capped at 32/SM
    assert S.cat_launch([(1, 128, 256), (1, 128, 512)], 132) == ((128, 2, 1), (128, 1, 1))
    assert S.cat_launch([(1, 1, 256), (1, 1, 512)], 132) == ((1, 2, 1), (128, 1, 1))
    assert S.cat_launch([(10 ** 6, 512)], 132) == ((32 * 132, 1, 1), (128, 1, 1))
    # gather (the embedding): one block per index, a 16-byte vector per thread, up to 256 threads a row
    assert S.gather_launch(3840, 1024) == ((3840, 1, 1), (64, 1, 1))
    assert S.gather_launch(1, 4 * 12) == ((1, 1, 1), (32, 1, 1))          # 3 vectors, rounded up to a warp
    assert S.gather_launch(5, 4 * 5000) == ((5, 5, 1), (256, 1, 1))
    assert S.index_select_small_launch(256, 132) == ((2, 1, 1), (128, 1, 1))      # up to 16 indices
    pred = S.predicted_launches(Config(), 128, 132)
    assert {p["phase"] for p in pred} == {"decoder step", "forward"} and all(p["grid"] and p["block"] for p in pred)
    rows = [S._row("op_kernels", "reference", "decoder step", 128, STAMP, op="aten::cat",
                   kernel="void at::native::CatArrayBatchedCopy_vectorized<>()", grid="128x2x1", block="128x1x1")]
    checked = S.check_predictions(pred, rows)
    hit = [c for c in checked if c["match"]]
    assert len(hit) == 1 and hit[0]["what"].startswith("cat(embedded, context)")
    assert "match" in S.format_predictions(checked)


def test_csv_round_trip_into_the_figures(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    tr = S.parse(synthetic_trace())
    rows = []
    for model in ("reference", "lab"):
        for f in (S.kernel_rows, S.host_rows, S.api_rows):
            rows += f(tr, model, "forward", 2, STAMP)
        rows += S.call_rows(tr, model, "forward", 2, STAMP)
    rows.append(S._row("ladder", "-", "python call", 1, STAMP, host_us=0.05, calls=0))
    rows.append(S._row("ladder", "-", "torch.empty(0)", 1, STAMP, host_us=2.0, calls=0))
    rows.append(S._row("ladder", "-", "tiny add", 1, STAMP, host_us=5.0, device_us=2.0, calls=1,
                       kernel="vectorized_elementwise_kernel[CUDAFunctor_add]", api="cudaLaunchKernel x1"))
    path = S.record(rows)
    assert path == tmp_path / "synthetic-gpu" / S.SURVEY
    back = S.load("Synthetic GPU")
    assert len(back) == len(rows)
    k = [r for r in back if r["section"] == "op_kernels" and r["model"] == "reference"]
    assert {r["grid"] for r in k} >= {"4x1x1"} and all(isinstance(r["device_us"], float) for r in k)
    for p in (S.plot_operator_kernels(back, "forward"), S.plot_api_calls(back), S.plot_ladder(back)):
        assert p is not None and p.exists() and p.stat().st_size > 0
    assert "gemv2T_kernel_val" in S.format_kernels(back, "reference", "forward", 2)
    assert "cuLaunchKernelEx" in S.format_api(back)
    tiles = [S._row("op_kernels", "reference", "step", 128, STAMP, top_op="aten::linear", op="aten::addmm",
                    kernel="sm80_xmma_gemm_f32f32_tn_n_tilesize128x64x8_stage3_execute_kernel__5x_cublas",
                    grid="1x93x1", block="128x1x1", calls=1.0, elements=128 * 5893)]
    assert "761856" in S.format_tiles(tiles, "reference", "step", 128)                  # 93 blocks x 128 x 64
    assert "TensorIterator, allocation, one launch" in S.format_ladder(back) and "+3.00 us" in S.format_ladder(back)
    # a newer run of the same phase replaces the older one in load()
    S.record([{**r, "timestamp": "2026-01-02T00:00:00", "run_id": "r2", "host_us": 1.0}
              for r in rows if r["section"] == "ladder"])
    assert [r["host_us"] for r in S.load("Synthetic GPU") if r["section"] == "ladder"] == [1.0] * 3


def test_cpu_survey_of_a_small_model():
    """On the CPU: operators only, no kernels and no runtime calls, and the tables say so."""
    rows = S.survey("cpu", batch=2, step_batches=(1,), cfg=SMALL, reps=1, record_rows=False)
    assert not [r for r in rows if r["section"] in ("op_kernels", "api")]
    fwd = {(r["top_op"], r["op"]): r for r in rows if r["section"] == "op_host"
           and (r["model"], r["phase"]) == ("reference", "forward")}
    assert fwd[("aten::gru", "aten::gru")]["calls"] == 1 + SMALL.max_len            # encoder + each decoder step
    assert ("aten::linear", "aten::addmm") in fwd and ("aten::cat", "aten::cat") in fwd
    assert all(r["host_us"] > 0 for r in fwd.values() if r["op"] in ("aten::gru", "aten::addmm"))
    lab = {r["top_op"] for r in rows if r["section"] == "op_host" and (r["model"], r["phase"]) == ("lab", "forward")}
    assert "aten::cat" not in lab and "aten::gru" not in lab                        # the lab model has neither
    phases = {(r["model"], r["phase"], int(r["batch"])) for r in rows if r["section"] == "call"}
    assert ("reference", "greedy decode, stop check", 2) in phases and ("lab", "decoder step", 1) in phases
    assert S.CPU_NOTE in S.format_kernels(rows, "reference", "forward", 2)


def test_cpu_ladder_and_tree():
    rows = S.dispatch_ladder("cpu", batch=1, cfg=SMALL, reps=50, record_rows=False)
    names = [r["phase"] for r in rows]
    assert names[:3] == ["python call", "torch.empty(0)", "tiny add"] and "F.linear, recording autograd" in names
    assert all(r["host_us"] > 0 and r["device_us"] is None for r in rows)
    lin = next(r for r in rows if r["phase"] == "F.linear, no_grad")
    assert "aten::linear" in lin["op"] and "aten::addmm" in lin["op"]
    tree = S.dispatch_tree("cpu", batch=1, cfg=SMALL, record_rows=False)
    depth = {r["op"]: r["depth"] for r in tree}
    assert depth["aten::linear"] == 0 and depth["aten::addmm"] == 1
    assert "aten::addmm" in S.format_tree(tree)


def test_greedy_with_stop_check_matches_greedy():
    from lab.models.seq2seq import build_model, random_src
    model = build_model(SMALL, "cpu")
    src = random_src(SMALL, 3)
    with torch.no_grad():
        assert torch.equal(S.greedy_with_stop_check(model, src), model.greedy(src))


# ---- on the GPU ------------------------------------------------------------------------------------------------
@needs_gpu
def test_gpu_survey_reads_real_traces():
    rows = S.survey("cuda", batch=8, step_batches=(1,), cfg=SMALL, reps=2, record_rows=False)
    k = [r for r in rows if r["section"] == "op_kernels" and r["category"] == "kernel"]
    assert k and all(r["kernel"] for r in k)
    for r in k:
        g, b = S.parse_dim3(r["grid"]), S.parse_dim3(r["block"])
        assert g and b and all(isinstance(v, int) and v > 0 for v in g + b)
        assert isinstance(r["regs"], int) and r["regs"] > 0 and isinstance(r["smem"], int) and r["smem"] >= 0
    ref_fwd = {r["top_op"] for r in k if (r["model"], r["phase"]) == ("reference", "forward")}
    assert {"aten::gru", "aten::linear", "aten::cat", "aten::embedding"} <= ref_fwd

    def api(model, phase, name, batch=8):
        rs = [r for r in rows if r["section"] == "api" and (r["model"], r["phase"], int(r["batch"])) ==
              (model, phase, batch) and (r["api"] == name or (name.endswith("*") and r["api"].startswith(name[:-1])))]
        return sum(r["calls"] for r in rs)

    assert api("reference", "decoder step", "cudaLaunchKernel") > 0
    assert api("reference", "decoder step, graph replay", "cudaGraphLaunch") == 1
    assert api("reference", "decoder step, graph replay", "cudaLaunchKernel") == 0
    assert api("lab", "decoder step, graph replay", "cudaGraphLaunch") == 1
    # the lab's timer adds exactly its two event records (cuDNN records events of its own inside the GRU)
    assert (api("reference", "decoder step, between CUDA events", "cudaEventRecord*")
            - api("reference", "decoder step", "cudaEventRecord*")) == 2
    assert api("reference", "greedy decode, stop check", "cudaStreamSynchronize") == SMALL.max_len
    assert api("reference", "greedy decode", "cudaStreamSynchronize") == 0
    assert api("reference", "forward, cold allocator", "cudaMalloc") > 0
    assert api("reference", "forward", "cudaMalloc") == 0
    sync = next(r for r in rows if r["section"] == "sync" and r["phase"] == "greedy decode, stop check")
    assert sync["host_us"] > 0 and sync["idle_us"] > 0
    # the launch rules read from PyTorch's sources hold for the cat and embedding launches measured
    pred = S.predicted_launches(SMALL, 8, torch.cuda.get_device_properties(0).multi_processor_count)
    checked = S.check_predictions(pred, rows)
    assert all(c["match"] for c in checked), S.format_predictions(checked)


@needs_gpu
def test_gpu_ladder_tree_and_gemv():
    rows = S.dispatch_ladder("cuda", batch=1, cfg=SMALL, reps=200, record_rows=False)
    by = {r["phase"]: r for r in rows}
    assert by["tiny add"]["calls"] == 1 and "cudaLaunchKernel" in by["tiny add"]["api"]
    assert "cudaGraphLaunch x1" in by["F.linear, graph replay"]["api"]
    assert by["F.linear, no_grad"]["device_us"] > 0 and by["torch.empty(0)"]["device_us"] is None
    tree = S.dispatch_tree("cuda", batch=1, cfg=SMALL, record_rows=False)
    gpu = [r for r in tree if r["category"] == "kernel"]
    assert gpu and all(r["depth"] >= 2 and S.parse_dim3(r["grid"]) for r in gpu)   # under addmm's launch call
    g = S.gemv_compare("cuda", batch=1, cfg=SMALL, record_rows=False)
    times = {r["model"]: r["device_us"] for r in g if r["section"] == "gemv"}
    assert set(times) == {"cuBLAS (F.linear)", "lab GEMV"} and all(math.isfinite(t) and t > 0
                                                                     for t in times.values())
