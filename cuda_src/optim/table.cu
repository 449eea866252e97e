// optim/table.cu — the upload of v3's and v4's pointer table (its layout and host side: optim.cuh), shared by both
// versions: its own unit, so an edit of v3.cu or v4.cu does not rebuild it.
#include "optim.cuh"

namespace optim {

// Uploads the table through kernel arguments: stream-ordered like any launch, capturable in a CUDA graph (where
// the graph keeps the bytes), and no pinned staging buffer to keep alive.
constexpr int kWords = 4000;  // 32000 bytes per launch: indexed, so it must end below bank offset 0x8000 (as in
                              // byvalue.cu: kIndexableParamBytes)
struct Words {
  unsigned long long w[kWords];
};
__global__ void write_words_kernel(const __grid_constant__ Words src, unsigned long long* __restrict__ dst, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src.w[i];
}

// ---- the launcher cpp_src/optim/optim.cpp calls (as "table_upload") ---------------------------------------------
// Write `bytes` (a multiple of 8) of host data to device memory with kernel launches on `stream`.
cudaError_t table_upload(void* dev, const void* host, int64_t bytes, cudaStream_t stream, int* launches) {
  const auto* src = static_cast<const unsigned long long*>(host);
  auto* dst = static_cast<unsigned long long*>(dev);
  const int64_t words = bytes / 8;
  auto w = std::make_unique<Words>();
  for (int64_t off = 0; off < words; off += kWords) {
    const int cnt = int(std::min<int64_t>(kWords, words - off));
    std::memcpy(w->w, src + off, size_t(cnt) * 8);
    write_words_kernel<<<1, 1024, 0, stream>>>(*w, dst + off, cnt);
    ++*launches;
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace optim

LAB_EXPORTS(LAB_EXPORT("table_upload", optim::table_upload))
