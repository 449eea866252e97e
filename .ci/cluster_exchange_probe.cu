// What does exchanging h between the blocks of a thread-block cluster cost a step on this GPU? (issue 14: the
// persistent GRU at batch 8 spends ~1 us of a ~2.1-2.3 us step waiting for h_{t-1} through L2, cuda_src/gru/gru.cuh.)
// A slice of the encoder's W_hh (3 MB fp32) fills the registers of 32 blocks; as 16 blocks (half in shared memory)
// it would fit one 16-block cluster, h could travel by distributed shared memory and the step end at one cluster
// barrier. This probe times exactly that exchange, nothing else: each block writes `words` floats into every
// block's shared memory (st.shared::cluster, double-buffered by step parity), then barrier.cluster arrive.release /
// wait.acquire, then reads one word of the tile, 1000 steps; and asks how many such clusters fit at once.
//   usage (on a GPU): nvcc -arch=sm_90a -O3 -o /tmp/cluster_probe .ci/cluster_exchange_probe.cu && /tmp/cluster_probe
#include <cooperative_groups.h>

#include <cstdio>

namespace cg = cooperative_groups;

template <int CS>
__global__ void exchange(int steps, int words, unsigned long long* out) {
  extern __shared__ float tiles[];  // [2][CS * words]: step t writes tile t & 1
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  float acc = 0.f;
  cluster.sync();
  const long long c0 = clock64();
  unsigned long long g0, g1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
  for (int t = 0; t < steps; ++t) {
    float* tile = tiles + (t & 1) * CS * words;
    if (threadIdx.x < words)
      for (int d = 0; d < CS; ++d) cluster.map_shared_rank(tile, d)[rank * words + threadIdx.x] = acc + t;
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    acc += tile[(threadIdx.x * 7) % (CS * words)];  // the next step's values depend on what arrived
  }
  const long long c1 = clock64();
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
  if (threadIdx.x == 0) {
    out[blockIdx.x * 3] = c1 - c0;
    out[blockIdx.x * 3 + 1] = g1 - g0;
    out[blockIdx.x * 3 + 2] = static_cast<unsigned long long>(acc);  // keeps the reads
  }
  cluster.sync();  // no block leaves while another may still write into its shared memory
}

template <int CS>
void probe(int smem_bytes) {
  auto* kernel = exchange<CS>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CS, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.attrs = attr, cfg.numAttrs = 1, cfg.blockDim = dim3(256), cfg.dynamicSmemBytes = smem_bytes,
  cfg.gridDim = dim3(CS);
  int fit = 0;
  cudaError_t e = cudaOccupancyMaxActiveClusters(&fit, reinterpret_cast<void*>(kernel), &cfg);
  printf("clusters of %d blocks, %d KB shared memory a block: at most %d at once (%s)\n", CS, smem_bytes / 1024, fit,
         cudaGetErrorString(e));
  const int steps = 1000;
  for (int words : {16, 32, 64})
    for (int n : {1, 4, 8}) {
      if (n > fit) continue;
      cfg.gridDim = dim3(CS * n);
      unsigned long long* d = nullptr;
      cudaMalloc(&d, sizeof(unsigned long long) * 3 * CS * n);
      for (int rep = 0; rep < 2; ++rep) e = cudaLaunchKernelEx(&cfg, kernel, steps, words, d);  // the second timed
      if (e == cudaSuccess) e = cudaDeviceSynchronize();
      unsigned long long h[3] = {};
      cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);  // block 0's counts
      printf("  %d cluster(s), %2d words a block: %7.1f cycles, %6.1f ns a step (%s)\n", n, words,
             h[0] / double(steps), h[1] / double(steps), cudaGetErrorString(e));
      cudaFree(d);
    }
}

int main() {
  probe<8>(200 * 1024);
  probe<16>(200 * 1024);
  return 0;
}
