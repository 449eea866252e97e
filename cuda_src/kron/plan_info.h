// kron/plan_info.h — the fields of v2's and v3's launch plans, named once: v2_plan.cu and v3.cu fill an array in this order, the binding
// (cpp_src/kron/kron.cpp, fused_plan) hands it to Python as a dict under these names. Plain C++, no CUDA.
#pragma once

namespace kron {
enum PlanField {
  kFits,         // 1: v2's fused kernel runs; 0: it does not fit and version 2 runs v1's per-factor forward
  kCfg,          // block configuration (0..2: threads and register tile, cfg_shape in v2_plan.cu)
  kC,            // columns of W_K per block (the slice width)
  kSlices,       // column slices per sample (blocks per sample)
  kSmemBytes,    // dynamic shared memory per block
  kBlocksPerSm,  // resident blocks per SM (occupancy API)
  kThreads,      // threads per block
  kTM,           // register tile rows per thread
  kTN,           // register tile columns per thread
  kCost,         // the cost model's estimate the configuration was picked by
  kSmemLimit,    // the device's opt-in shared memory per block
  kStages,       // cp.async pipeline stages (v2: 2; v3: planned, stages - 1 chunks in flight per block)
  kPlanFields
};
inline constexpr const char* kPlanFieldNames[kPlanFields] = {
    "fits", "cfg", "c", "slices", "smem_bytes", "blocks_per_sm", "threads", "TM", "TN", "cost", "smem_limit", "stages"};
}  // namespace kron
