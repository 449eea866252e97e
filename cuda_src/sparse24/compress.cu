// sparse24/compress.cu — a dense weight already pruned to 2:4 -> the lab's compressed format (values, meta; the
// format is in sparse24.cuh). One thread per (row, 32-column word): it reads the word's 32 elements (zeros past K),
// writes 16 values and one int32 of metadata, and records the first group with more than 2 nonzeros (row-major
// position, by atomicMin) so that the binding can name it: a weight that is not 2:4 is an error, never a silent
// truncation. Run once per weight (at load time), not per call; bytes: read 2·N·K, write 1.125·N·K.
// lab:variants dtype=bf16,f16
#include "sparse24.cuh"

namespace sparse24 {

// The two kept positions of one group of 4 (v = the 4 elements; false = zero): the nonzeros in increasing order,
// topped up with the lowest free positions. Returns how many nonzeros there were (> 2: not 2:4).
__device__ __forceinline__ int kept_pair(const bool nz[4], int& i0, int& i1) {
  int count = 0, first = -1, second = -1;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (nz[i]) {
      if (count == 0) first = i;
      else if (count == 1) second = i;
      ++count;
    }
  if (first < 0) { first = 0; second = 1; }                       // all zero: keep 0, 1
  else if (second < 0) { second = first == 3 ? 3 : first + 1;      // one nonzero: pair it with a free neighbour
                         if (first == 3) first = 2; }
  i0 = first;
  i1 = second;
  return count;
}

__global__ void compress_kernel(const T* __restrict__ w, T* __restrict__ values, int32_t* __restrict__ meta, int N,
                                int K, int words, unsigned long long* __restrict__ bad) {
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= int64_t(N) * words) return;
  const int n = int(item / words), wd = int(item % words);
  const T* row = w + int64_t(n) * K;
  T* vout = values + int64_t(n) * (words * 16) + wd * 16;
  uint32_t word = 0;
  const T zero = from_f<T>(0.f);
  for (int g = 0; g < kGroupsPerWord; ++g) {
    const int c0 = wd * 32 + g * 4;
    T v[4];
    bool nz[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[i] = c0 + i < K ? row[c0 + i] : zero;
      nz[i] = to_f(v[i]) != 0.f;   // NaN counts as nonzero; -0 as zero
    }
    int i0, i1;
    if (kept_pair(nz, i0, i1) > 2) atomicMin(bad, (unsigned long long)(int64_t(n) * (words * 8) + wd * 8 + g));
    vout[2 * g] = i0 == 0 ? v[0] : (i0 == 1 ? v[1] : v[2]);   // selects: a run-time index would put v in local memory
    vout[2 * g + 1] = i1 == 1 ? v[1] : (i1 == 2 ? v[2] : v[3]);
    word |= uint32_t(i0 | (i1 << 2)) << (4 * g);
  }
  meta[int64_t(n) * words + wd] = int32_t(word);
}

cudaError_t compress(const T* w, T* values, int32_t* meta, int N, int K, unsigned long long* bad, cudaStream_t s) {
  const int words = int(padded_k(K) / 32);
  const int64_t items = int64_t(N) * words;
  if (items == 0) return cudaSuccess;
  compress_kernel<<<unsigned(lab::ceil_div(items, 256)), 256, 0, s>>>(w, values, meta, N, K, words, bad);
  return cudaGetLastError();
}

}  // namespace sparse24

LAB_EXPORTS(LAB_EXPORT("compress", sparse24::compress))
