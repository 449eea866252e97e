// optim/optim.cpp — the binding of the optim family: torch-facing Adam/AdamW steps over lists of tensors, their
// input checks, and the plan. No kernel code here: the CUDA versions are the units in cuda_src/optim/ (byvalue.cu:
// v1, v2; v3.cu; v4.cu; table.cu: the table upload), the C++ CPU version is cpp_src/optim/cpu.cpp, and all of them
// are called through lab::launcher by name ("adam_byvalue@v1", "adam_v4@bf16", "adam_cpu_f32", ...).
//
// Two entry points share one path (validate everything -> pack pointers -> run):
//   adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, ...)   the functional step
//   AdamPlan (plan_new / plan_prepare / plan_launch)                                     what lab's optimizer uses
// The plan holds the parameter and state tensors of one param group, reads each param's .grad in C++ (a Python loop
// over 2000 params costs more than the whole GPU step), keeps the device pointer table between steps and uploads it
// again only when a pointer changed. Every check runs before the first launch, so bad input leaves every parameter
// as it was. version: 0 = the C++ CPU code (CPU tensors), 1..4 = the CUDA versions in cuda_src/optim/.
#include "lab_common.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>


namespace {

constexpr int kMaxVersion = 4;
enum Slot { kP = 0, kG, kM, kV, kS, kVmax, kNPtr };
constexpr int kDtypes = 3;  // param dtype index: 0 fp32, 1 bf16, 2 fp16 (optim.cuh's enum)

int dtype_index(at::ScalarType t) { return t == at::kBFloat16 ? 1 : t == at::kHalf ? 2 : 0; }
// The name part of a param dtype index: the variant of v3.cu / v4.cu ("adam_v4@bf16"), the CPU unit's suffix.
const char* dtype_name(int d) { return d == 1 ? "bf16" : d == 2 ? "f16" : "f32"; }

// ---- the units' launchers (signatures as cuda_src/optim/*.cu and cpp_src/optim/cpu.cpp define them) -----------
// ptrs: n x kNPtr host array (p, g, m, v, step, vmax); numel: n; all tensors of one param dtype.
using AdamCpuFn = void (*)(const void* const* ptrs, const int64_t* numel, int n, bool amsgrad, double lr,
                           double beta1, double beta2, double eps, double wd, bool decoupled, bool maximize,
                           int64_t chunk);
#ifdef LAB_WITH_CUDA
// "adam_byvalue@v1" / "@v2"
using AdamByValueFn = cudaError_t (*)(int dtype, bool amsgrad, const void* const* ptrs, const int64_t* numel, int n,
                                      int64_t chunk, float lr, const float* lr_ptr, double beta1, double beta2,
                                      float eps, float wd, bool decoupled, bool maximize, int* counter,
                                      cudaStream_t stream, int* launches);
// "byvalue_caps@v1" / "@v2"
using ByValueCapsFn = void (*)(bool amsgrad, int64_t* bytes, int64_t* max_tensors, int64_t* max_blocks);
// "table_bytes_v3@f32", "table_fill_v4@bf16", "adam_v4@f16", ...: the table of v3/v4, per param dtype
using TableBytesFn = int64_t (*)(bool amsgrad, const int64_t* numel, int n, int64_t chunk);
using TableFillFn = void (*)(bool amsgrad, const void* const* ptrs, const int64_t* numel, int n, int64_t chunk,
                             void* host);
using AdamTableFn = cudaError_t (*)(bool amsgrad, const void* dev, const void* host, float lr, const float* lr_ptr,
                                    double beta1, double beta2, float eps, float wd, bool decoupled, bool maximize,
                                    cudaStream_t stream, int* launches);
// "table_upload"
using TableUploadFn = cudaError_t (*)(void* dev, const void* host, int64_t bytes, cudaStream_t stream, int* launches);
#endif

struct Hyper {
  double lr = 0;
  std::optional<at::Tensor> lr_tensor;  // read on the device at run time (CUDA) / read now (CPU)
  double beta1 = 0, beta2 = 0, eps = 0, wd = 0;
  bool decoupled = false, maximize = false;
};

// The tensors of one param dtype, as the kernels want them.
struct Group {
  std::vector<const void*> ptrs;  // n x kNPtr: p, g, m, v, step, vmax (null without amsgrad)
  std::vector<int64_t> numel;
  int n() const { return int(numel.size()); }
};

// One validated step: pointers grouped by param dtype, all on one device.
struct Batch {
  at::Device device{at::kCPU};
  bool amsgrad = false;
  std::array<Group, kDtypes> groups;
  std::vector<at::Tensor> keep;   // the grads the pointers refer to, alive until the launch
};

// ---- names in messages ----------------------------------------------------------------------------------------
// The functional step names its lists ("grads[3]"); the optimizer names a param and its state ("params[3].grad").
struct Names {
  bool plan;
  std::string operator()(int slot, int64_t i) const {
    static const char* lists[kNPtr] = {"params", "grads", "exp_avgs", "exp_avg_sqs", "state_steps", "max_exp_avg_sqs"};
    static const char* keys[kNPtr] = {"", ".grad", "exp_avg", "exp_avg_sq", "step", "max_exp_avg_sq"};
    if (!plan || slot == kP) return lab::cat(lists[slot], "[", i, "]");
    if (slot == kG) return lab::cat("params[", i, "].grad");
    return lab::cat("state['", keys[slot], "'] of params[", i, "]");
  }
};

// ---- input checks (all of them run before anything is launched) -----------------------------------------------
// Same order of elements in memory: equal strides on every dimension longer than 1.
bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}

// The address of element 0, without data_ptr()'s checks (a quarter of a step's host time at 2000 params). Only for
// tensors already known to be dense, to compare with an address data_ptr() gave when they were checked, and for grads.
inline const void* addr(const at::Tensor& t) {
  const c10::TensorImpl* i = t.unsafeGetTensorImpl();
  return static_cast<const char*>(i->storage().data()) + i->storage_offset() * int64_t(i->itemsize());
}

void check_like_param(const at::Tensor& t, const at::Tensor& p, int slot, int64_t i, const Names& nm) {
  LAB_CHECK_VALUE(t.device() == p.device(), nm(slot, i), " must be on the same device as ", nm(kP, i), " (",
                    p.device().str(), "), got ", t.device().str());
  LAB_CHECK_VALUE(t.sizes() == p.sizes(), nm(slot, i), " must have the same shape as ", nm(kP, i), " = ",
                    lab::shape_str(p.sizes()), ", got ", lab::shape_str(t.sizes()));
  LAB_CHECK_VALUE(same_layout(t, p), nm(slot, i), " must have the same strides as ",
                    nm(kP, i), " = ", lab::shape_str(p.strides()), ", got ", lab::shape_str(t.strides()),
                    " (make it with torch.zeros_like(param) or call .contiguous() on both)");
}

void check_state(const at::Tensor& t, const at::Tensor& p, int slot, int64_t i, const Names& nm) {
  LAB_CHECK_VALUE(t.defined(), nm(slot, i), " must be a tensor, got None");
  LAB_CHECK_VALUE(t.layout() == at::kStrided, nm(slot, i), " must be a dense tensor, got layout ", t.layout());
  LAB_CHECK_TYPE(t.scalar_type() == at::kFloat, nm(slot, i), " must be Float (the optimizer state is fp32 for ",
                   "every param dtype), got ", c10::toString(t.scalar_type()));
  check_like_param(t, p, slot, i, nm);
}

void check_entry(int64_t i, const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                 const at::Tensor* vmax, const at::Tensor& s, const at::Device& dev, const Names& nm) {
  LAB_CHECK_VALUE(p.defined(), nm(kP, i), " must be a tensor, got None");
  LAB_CHECK_VALUE(p.layout() == at::kStrided, nm(kP, i), " must be a dense tensor, got layout ", p.layout());
  LAB_CHECK_TYPE(p.scalar_type() == at::kFloat || p.scalar_type() == at::kBFloat16 || p.scalar_type() == at::kHalf,
                   nm(kP, i), " must be Float, BFloat16 or Half, got ", c10::toString(p.scalar_type()));
  LAB_CHECK_VALUE(p.device() == dev, nm(kP, i), " must be on the same device as ", nm(kP, 0), " (", dev.str(),
                    "), got ", p.device().str(), " (all the params of one step or param group must be on one device)");
  LAB_CHECK_VALUE(p.is_non_overlapping_and_dense(), nm(kP, i), " must be dense (no overlapping elements, no gaps) "
                    "so it can be updated as one block of memory, got strides ", lab::shape_str(p.strides()),
                    " for shape ", lab::shape_str(p.sizes()));
  LAB_CHECK_VALUE(g.defined(), nm(kG, i), " is None: every param in the list needs a gradient");
  LAB_CHECK_VALUE(!g.is_sparse() && g.layout() == at::kStrided, nm(kG, i), " is sparse (layout ", g.layout(),
                    "): this Adam updates dense gradients only (torch.optim.SparseAdam takes sparse ones)");
  LAB_CHECK_TYPE(g.scalar_type() == p.scalar_type(), nm(kG, i), " must have the same dtype as ", nm(kP, i), " (",
                   c10::toString(p.scalar_type()), "), got ", c10::toString(g.scalar_type()));
  check_like_param(g, p, kG, i, nm);
  check_state(m, p, kM, i, nm);
  check_state(v, p, kV, i, nm);
  if (vmax) check_state(*vmax, p, kVmax, i, nm);
  LAB_CHECK_VALUE(s.defined(), nm(kS, i), " must be a tensor, got None");
  LAB_CHECK_TYPE(s.scalar_type() == at::kFloat, nm(kS, i), " must be Float (a float32 step count), got ",
                   c10::toString(s.scalar_type()));
  LAB_CHECK_VALUE(s.numel() == 1 && s.device() == dev, nm(kS, i), " must hold one element on ", dev.str(),
                    " (the step count lives on the params' device), got shape ", lab::shape_str(s.sizes()), " on ",
                    s.device().str());
}

// Two params sharing memory would each be updated twice (and race on the GPU).
void check_no_overlap(const std::vector<at::Tensor>& params, const std::vector<int64_t>& idx, const Names& nm) {
  std::vector<std::array<int64_t, 3>> r;  // [begin, end) bytes, index
  r.reserve(idx.size());
  for (int64_t i : idx) {
    const auto& p = params[size_t(i)];
    if (p.numel() == 0) continue;
    const int64_t b = reinterpret_cast<int64_t>(p.data_ptr());
    r.push_back({b, b + p.numel() * int64_t(p.element_size()), i});
  }
  std::sort(r.begin(), r.end());
  for (size_t k = 1; k < r.size(); ++k)
    LAB_CHECK_VALUE(r[k][0] >= r[k - 1][1], nm(kP, r[k - 1][2]), " and ", nm(kP, r[k][2]), " share memory (the "
                      "same tensor twice, or overlapping views): each would be updated twice");
}

void check_hyper(const Hyper& h, const at::Device& dev, int64_t version, int64_t chunk) {
  LAB_CHECK_VALUE(h.lr >= 0, "lr must be >= 0, got ", h.lr);
  LAB_CHECK_VALUE(h.beta1 >= 0 && h.beta1 < 1, "beta1 must be in [0, 1), got ", h.beta1);
  LAB_CHECK_VALUE(h.beta2 >= 0 && h.beta2 < 1, "beta2 must be in [0, 1), got ", h.beta2);
  LAB_CHECK_VALUE(h.eps >= 0, "eps must be >= 0, got ", h.eps);
  LAB_CHECK_VALUE(h.wd >= 0, "weight_decay must be >= 0, got ", h.wd);
  if (h.lr_tensor) {
    const at::Tensor& t = *h.lr_tensor;
    LAB_CHECK_TYPE(t.scalar_type() == at::kFloat, "lr (a tensor) must be Float, got ", c10::toString(t.scalar_type()));
    LAB_CHECK_VALUE(t.numel() == 1 && t.device() == dev, "lr (a tensor) must hold one element on the params' device ",
                      dev.str(), ", got shape ", lab::shape_str(t.sizes()), " on ", t.device().str());
  }
  LAB_CHECK_VALUE(chunk >= 4 && chunk % 4 == 0 && chunk <= (int64_t(1) << 30), "chunk must be a multiple of 4 in "
                    "[4, 2^30], got ", chunk);
  lab::check_version(dev, "the params are", version, 1, kMaxVersion, "adam");
}

// Checks the entries `idx` and packs their pointers. grads[i] is the grad of params[i].
Batch pack(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
           const std::vector<at::Tensor>& m, const std::vector<at::Tensor>& v, const std::vector<at::Tensor>& vmax,
           const std::vector<at::Tensor>& steps, const std::vector<int64_t>& idx, bool amsgrad, int64_t chunk,
           const Names& nm) {
  Batch b;
  b.amsgrad = amsgrad;
  if (idx.empty()) return b;
  LAB_CHECK_VALUE(params[size_t(idx[0])].defined(), nm(kP, idx[0]), " must be a tensor, got None");
  b.device = params[size_t(idx[0])].device();
  for (int64_t i : idx) {
    const size_t k = size_t(i);
    check_entry(i, params[k], grads[k], m[k], v[k], amsgrad ? &vmax[k] : nullptr, steps[k], b.device, nm);
    LAB_CHECK_VALUE(lab::ceil_div(params[k].numel(), chunk) < (int64_t(1) << 31), nm(kP, i), " has ",
                      params[k].numel(), " elements: more than 2^31 chunks of ", chunk);
  }
  LAB_CHECK_VALUE(idx.size() < (size_t(1) << 31), "too many tensors: ", idx.size());
  for (int64_t i : idx) {
    const size_t k = size_t(i);
    Group& G = b.groups[size_t(dtype_index(params[k].scalar_type()))];
    G.ptrs.insert(G.ptrs.end(), {params[k].data_ptr(), grads[k].data_ptr(), m[k].data_ptr(), v[k].data_ptr(),
                                 steps[k].data_ptr(), amsgrad ? vmax[k].data_ptr() : nullptr});
    G.numel.push_back(params[k].numel());
  }
  return b;
}

// ---- running a validated batch ------------------------------------------------------------------------------------
// Device buffers an AdamPlan keeps between steps: the pointer table (with the image last uploaded, to skip uploads
// that change nothing) and the ticket of the by-value versions. A CUDA graph captured from a step gets its own
// table and ticket (kept alive here), so replaying it never disturbs eager steps and vice versa.
struct Buffers {
  struct Table {
    at::Tensor dev;
    std::vector<uint8_t> host;            // the image last uploaded to dev
    std::vector<const void*> ptrs;        // ... and what it was made from
    std::vector<int64_t> numel;
    int64_t version = -1, chunk = -1;
    bool amsgrad = false;
  };
  std::array<Table, kDtypes> tables;
  std::array<at::Tensor, kDtypes> counters;
  std::vector<at::Tensor> captured;
};

int run(Batch& b, const Hyper& h, int64_t version, int64_t chunk, Buffers* buf) {
  int launches = 0;
  if (b.device.is_cpu()) {
    const double lr = h.lr_tensor ? double(h.lr_tensor->item<float>()) : h.lr;
    for (int d = 0; d < kDtypes; ++d) {
      const Group& G = b.groups[size_t(d)];
      if (G.n() == 0) continue;
      auto fn = lab::launcher<AdamCpuFn>(lab::cat("adam_cpu_", dtype_name(d)));
      fn(G.ptrs.data(), G.numel.data(), G.n(), b.amsgrad, lr, h.beta1, h.beta2, h.eps, h.wd, h.decoupled,
         h.maximize, chunk);
    }
    return 0;
  }
#ifdef LAB_WITH_CUDA
  c10::cuda::CUDAGuard guard(b.device);
  cudaStream_t stream = LAB_STREAM();
  const bool capturing = lab::stream_capturing(stream);
  const float* lr_ptr = h.lr_tensor ? h.lr_tensor->data_ptr<float>() : nullptr;
  const float lr = float(h.lr), eps = float(h.eps), wd = float(h.wd);
  for (int d = 0; d < kDtypes; ++d) {
    Group& G = b.groups[size_t(d)];
    if (G.n() == 0) continue;
    if (version <= 2) {
      at::Tensor counter;
      if (buf && !capturing) {
        if (!buf->counters[size_t(d)].defined())
          buf->counters[size_t(d)] = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(b.device));
        counter = buf->counters[size_t(d)];
      } else {
        counter = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(b.device));
        if (buf) buf->captured.push_back(counter);
      }
      auto fn = lab::launcher<AdamByValueFn>(lab::cat("adam_byvalue@v", version));
      LAB_CUDA_CHECK(fn(d, b.amsgrad, G.ptrs.data(), G.numel.data(), G.n(), chunk, lr, lr_ptr, h.beta1, h.beta2, eps,
                        wd, h.decoupled, h.maximize, counter.data_ptr<int>(), stream, &launches),
                     lab::cat("adam kernel (v", version, ", pointers by value)"));
      continue;
    }
    // the table is a function of the pointers, sizes, version and chunk: rebuild and upload only when one changed
    const std::string unit = lab::cat("_v", version, "@", dtype_name(d));  // v3.cu / v4.cu, this dtype's build
    Buffers::Table* T = (buf && !capturing) ? &buf->tables[size_t(d)] : nullptr;
    const bool reuse = T && T->dev.defined() && T->version == version && T->chunk == chunk &&
                       T->amsgrad == b.amsgrad && T->numel == G.numel && T->ptrs == G.ptrs;
    std::vector<uint8_t> image;
    at::Tensor dev;
    if (reuse) {
      dev = T->dev;
    } else {
      auto nbytes = lab::launcher<TableBytesFn>("table_bytes" + unit);
      const int64_t bytes = nbytes(b.amsgrad, G.numel.data(), G.n(), chunk);
      image.resize(static_cast<size_t>(bytes));
      lab::launcher<TableFillFn>("table_fill" + unit)(b.amsgrad, G.ptrs.data(), G.numel.data(), G.n(), chunk,
                                                      image.data());
      if (T) {
        if (!T->dev.defined() || T->dev.numel() < bytes)
          T->dev = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(b.device));
        dev = T->dev;
      } else {  // a functional call, or a capture: a table of its own (a graph keeps its table alive in `captured`)
        dev = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(b.device));
        if (buf) buf->captured.push_back(dev);
      }
      auto upload = lab::launcher<TableUploadFn>("table_upload");
      LAB_CUDA_CHECK(upload(dev.data_ptr(), image.data(), bytes, stream, &launches), "adam pointer-table upload");
      if (T) {
        T->host = std::move(image);
        T->ptrs = G.ptrs;
        T->numel = G.numel;
        T->version = version, T->chunk = chunk, T->amsgrad = b.amsgrad;
      }
    }
    const void* host = T ? T->host.data() : image.data();
    auto fn = lab::launcher<AdamTableFn>("adam" + unit);
    LAB_CUDA_CHECK(fn(b.amsgrad, dev.data_ptr(), host, lr, lr_ptr, h.beta1, h.beta2, eps, wd, h.decoupled,
                      h.maximize, stream, &launches),
                   lab::cat("adam kernel (v", version, ", table in device memory)"));
  }
#else
  (void)h, (void)version, (void)chunk, (void)buf;
  LAB_NO_CUDA_BUILD("adam");
#endif
  return launches;
}

Hyper make_hyper(double lr, std::optional<at::Tensor> lr_tensor, double beta1, double beta2, double eps, double wd,
                 bool decoupled, bool maximize) {
  Hyper h;
  h.lr = lr;
  h.lr_tensor = std::move(lr_tensor);
  h.beta1 = beta1, h.beta2 = beta2, h.eps = eps, h.wd = wd, h.decoupled = decoupled, h.maximize = maximize;
  return h;
}

// ---- the functional step ----------------------------------------------------------------------------------------
// Updates params, exp_avgs, exp_avg_sqs (max_exp_avg_sqs) and state_steps in place; returns the number of kernel
// launches it took (0 on the CPU).
int64_t adam_step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                  const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                  const std::vector<at::Tensor>& max_exp_avg_sqs, const std::vector<at::Tensor>& state_steps,
                  double lr, std::optional<at::Tensor> lr_tensor, double beta1, double beta2, double eps,
                  double weight_decay, bool decoupled, bool amsgrad, bool maximize, int64_t version, int64_t chunk) {
  const size_t n = params.size();
  auto same = [&](const std::vector<at::Tensor>& l, const char* name) {
    LAB_CHECK_VALUE(l.size() == n, name, " has ", l.size(), " tensors, params has ", n);
  };
  same(grads, "grads");
  same(exp_avgs, "exp_avgs");
  same(exp_avg_sqs, "exp_avg_sqs");
  same(state_steps, "state_steps");
  if (amsgrad) same(max_exp_avg_sqs, "max_exp_avg_sqs (amsgrad=True)");
  if (n == 0) return 0;
  const Names nm{false};
  std::vector<int64_t> idx(n);
  for (size_t i = 0; i < n; ++i) idx[i] = int64_t(i);
  const Hyper h = make_hyper(lr, std::move(lr_tensor), beta1, beta2, eps, weight_decay, decoupled, maximize);
  Batch b = pack(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, idx, amsgrad, chunk, nm);
  check_hyper(h, b.device, version, chunk);
  check_no_overlap(params, idx, nm);
  return run(b, h, version, chunk, nullptr);
}

// ---- the plan: one param group of lab's optimizer ---------------------------------------------------------------
struct AdamPlan {
  std::vector<at::Tensor> params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;  // undefined: no state yet
  bool amsgrad = false;
  // Per param, what passed every named check last time: the addresses of p, m, v, step, vmax (slot kG unused), the
  // param's size and dtype. A step re-checks a param by address (a moved or replaced tensor has a new one) and runs
  // the named checks again only when it changed; grads are checked every step (zero_grad(set_to_none=True) makes
  // new ones). Touching fewer tensor objects is what makes a step over 2000 params cheap on the host.
  struct Seen {
    std::array<const void*, kNPtr> ptr{};
    int64_t numel = -1;
    at::ScalarType dtype = at::kFloat;
  };
  std::vector<Seen> seen;
  // set by plan_prepare, used by plan_launch
  bool prepared = false;
  Batch batch;
  Hyper hyper;
  int64_t version = 0, chunk = 0;
  Buffers buffers;
  int64_t last_launches = 0;
};

std::shared_ptr<AdamPlan> plan_new(std::vector<at::Tensor> params, std::vector<std::optional<at::Tensor>> exp_avgs,
                                   std::vector<std::optional<at::Tensor>> exp_avg_sqs,
                                   std::vector<std::optional<at::Tensor>> max_exp_avg_sqs,
                                   std::vector<std::optional<at::Tensor>> state_steps, bool amsgrad) {
  const size_t n = params.size();
  auto unwrap = [&](std::vector<std::optional<at::Tensor>>& l, const char* name, std::vector<at::Tensor>& out) {
    LAB_CHECK_VALUE(l.size() == n, name, " has ", l.size(), " entries, params has ", n);
    out.resize(n);
    for (size_t i = 0; i < n; ++i)
      if (l[i]) out[i] = *l[i];
  };
  auto pl = std::make_shared<AdamPlan>();
  pl->params = std::move(params);
  unwrap(exp_avgs, "exp_avgs", pl->exp_avgs);
  unwrap(exp_avg_sqs, "exp_avg_sqs", pl->exp_avg_sqs);
  unwrap(max_exp_avg_sqs, "max_exp_avg_sqs", pl->max_exp_avg_sqs);
  unwrap(state_steps, "state_steps", pl->steps);
  pl->amsgrad = amsgrad;
  pl->seen.assign(n, AdamPlan::Seen{});
  return pl;
}

// Reads every param's .grad, checks everything (params, grads, state, hyperparameters) and packs the pointers.
// Returns the indices of params that have a grad but no state yet (nothing is packed then: the caller creates their
// state, makes a new plan and prepares again). Params whose .grad is None are skipped, as torch.optim skips them.
std::vector<int64_t> plan_prepare(AdamPlan& pl, double lr, std::optional<at::Tensor> lr_tensor, double beta1,
                                  double beta2, double eps, double weight_decay, bool decoupled, bool maximize,
                                  int64_t version, int64_t chunk) {
  pl.prepared = false;
  pl.batch = Batch();
  const size_t n = pl.params.size();
  std::vector<at::Tensor> grads;   // of the active params, in order
  std::vector<int64_t> active, missing;
  grads.reserve(n);
  active.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    LAB_CHECK_VALUE(pl.params[i].defined(), "params[", i, "] must be a tensor, got None");
    const at::Tensor& g = pl.params[i].grad();
    if (!g.defined()) continue;
    const bool has_state = pl.exp_avgs[i].defined() && pl.exp_avg_sqs[i].defined() && pl.steps[i].defined() &&
                           (!pl.amsgrad || pl.max_exp_avg_sqs[i].defined());
    if (has_state) {
      active.push_back(int64_t(i));
      grads.push_back(g);
    } else {
      missing.push_back(int64_t(i));
    }
  }
  if (!missing.empty()) return missing;
  pl.hyper = make_hyper(lr, std::move(lr_tensor), beta1, beta2, eps, weight_decay, decoupled, maximize);
  Batch b;
  b.amsgrad = pl.amsgrad;
  if (!active.empty()) {
    const Names nm{true};
    b.device = pl.params[size_t(active[0])].device();
    check_hyper(pl.hyper, b.device, version, chunk);
    bool rechecked = false;
    for (size_t a = 0; a < active.size(); ++a) {
      const size_t i = size_t(active[a]);
      const at::Tensor &p = pl.params[i], &g = grads[a], &m = pl.exp_avgs[i], &v = pl.exp_avg_sqs[i],
                       &s = pl.steps[i];
      const at::Tensor* vm = pl.amsgrad ? &pl.max_exp_avg_sqs[i] : nullptr;
      AdamPlan::Seen& S = pl.seen[i];
      // the state tensors were checked with their param and are the plan's own: updated in place, never moved, so
      // only the param (which a user may move or replace with `.data =`) is re-checked by address
      const bool same = S.numel >= 0 && S.numel == p.numel() && S.dtype == p.scalar_type() &&
                        p.layout() == at::kStrided && p.device() == b.device && addr(p) == S.ptr[kP];
      const bool grad_ok = g.layout() == at::kStrided && g.scalar_type() == p.scalar_type() &&
                           g.device() == b.device && g.sizes() == p.sizes() && same_layout(g, p);
      if (!same || !grad_ok) {
        check_entry(int64_t(i), p, g, m, v, vm, s, b.device, nm);  // throws the named error, or all is well
        if (!same) {
          S.ptr = {p.data_ptr(), nullptr, m.data_ptr(), v.data_ptr(), s.data_ptr(), vm ? vm->data_ptr() : nullptr};
          S.numel = p.numel();
          S.dtype = p.scalar_type();
          rechecked = true;
        }
      }
      LAB_CHECK_VALUE(lab::ceil_div(S.numel, chunk) < (int64_t(1) << 31), nm(kP, int64_t(i)), " has ", S.numel,
                        " elements: more than 2^31 chunks of ", chunk);
      Group& G = b.groups[size_t(dtype_index(S.dtype))];
      G.ptrs.insert(G.ptrs.end(), {S.ptr[kP], addr(g), S.ptr[kM], S.ptr[kV], S.ptr[kS], S.ptr[kVmax]});
      G.numel.push_back(S.numel);
    }
    if (rechecked) {
      try {
        check_no_overlap(pl.params, active, nm);
      } catch (...) {
        for (int64_t i : active) pl.seen[size_t(i)].numel = -1;  // check them all again next time
        throw;
      }
    }
  }
  b.keep = std::move(grads);
  pl.batch = std::move(b);
  pl.version = version;
  pl.chunk = chunk;
  pl.prepared = true;
  return {};
}

// Runs the step plan_prepare checked; returns the number of kernel launches.
int64_t plan_launch(AdamPlan& pl) {
  LAB_CHECK(pl.prepared, "plan_launch: call plan_prepare first (it checks the grads and packs the pointers)");
  pl.prepared = false;
  pl.last_launches = run(pl.batch, pl.hyper, pl.version, pl.chunk, &pl.buffers);
  pl.batch.keep.clear();
  return pl.last_launches;
}

// The by-value metadata struct of v1/v2: (bytes, tensor slots, block slots) per launch.
std::vector<int64_t> byvalue_caps(int64_t version, bool amsgrad) {
  LAB_CHECK_VALUE(version == 1 || version == 2, "byvalue_caps: version must be 1 or 2, got ", version);
#ifdef LAB_WITH_CUDA
  int64_t bytes = 0, t = 0, b = 0;
  lab::launcher<ByValueCapsFn>(lab::cat("byvalue_caps@v", version))(amsgrad, &bytes, &t, &b);
  return {bytes, t, b};
#else
  LAB_NO_CUDA_BUILD("byvalue_caps");
  return {};
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.doc() = "multi-tensor-apply Adam/AdamW: functional step, AdamPlan for lab's optimizer; version 0 = C++ CPU code";
  m.def("adam_step", lab::bind(adam_step),
        "adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, lr_tensor, beta1, beta2, "
        "eps, weight_decay, decoupled, amsgrad, maximize, version, chunk) -> launches; updates in place");
  py::class_<AdamPlan, std::shared_ptr<AdamPlan>>(m, "AdamPlan")
      .def_property_readonly("size", [](const AdamPlan& p) { return p.params.size(); })
      .def_property_readonly("last_launches", [](const AdamPlan& p) { return p.last_launches; })
      .def_property_readonly("captured_buffers", [](const AdamPlan& p) { return p.buffers.captured.size(); });
  m.def("plan_new", lab::bind(plan_new),
        "plan_new(params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, amsgrad) -> AdamPlan (None = no state)");
  m.def("plan_prepare", lab::bind(plan_prepare),
        "plan_prepare(plan, lr, lr_tensor, beta1, beta2, eps, weight_decay, decoupled, maximize, version, chunk) -> "
        "indices of params with a grad but no state (empty: ready)");
  m.def("plan_launch", lab::bind(plan_launch), "plan_launch(plan) -> kernel launches");
  m.def("byvalue_caps", lab::bind(byvalue_caps),
        "byvalue_caps(version, amsgrad) -> [struct bytes, tensors per launch, blocks per launch]");
  LAB_BIND_UNITS(m);
}
