// gru/v3_kpt.h — which build of v3.cu runs a hidden size. Plain C++ (no CUDA): the unit and the binding
// (cpp_src/gru/gru.cpp, which picks the variant by name) include it, so the rule is written once.
//
// KPT = columns of W_hh per lane: a lane keeps 3 x KPT weights in registers (KPT 32: 96 of them), and a unit's rows
// are spread over S = ceil(H / KPT) rounded up to a power of two lanes, S in {KPT/2, KPT} -- 2 kernels per KPT.
// v3.cu is built once per KPT (// lab:variants ... kpt=8,16,32): an edit recompiles 18 small builds in parallel
// instead of 6 that each instantiate all 6 (KPT, S) kernels (cicc + ptxas were ~2/3 of such a build's nvcc time).
#pragma once

namespace gru {
// 0: hidden too large for the register-resident design (v3/v4 need hidden <= 1024; use v2).
constexpr int v3_kpt(long long hidden) { return hidden <= 64 ? 8 : hidden <= 256 ? 16 : hidden <= 1024 ? 32 : 0; }
}  // namespace gru
