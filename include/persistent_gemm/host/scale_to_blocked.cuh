// Plain (rows, ceil(K/32)) e8m0 scales -> the blocked layout (layout/mx_blocked.hpp) the MX
// kernels read; padding rows and blocks hold 0x7F (2^0). Arch-neutral CUDA: one thread writes one
// 4-byte word (one row's four blocks of one atom).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "persistent_gemm/layout/mx_blocked.hpp"
#include "persistent_gemm/registry.h"

namespace persistent_gemm::host {

constexpr int kMaxRelayoutJobs = 2;
struct RelayoutBatch {
  ScaleRelayout job[kMaxRelayoutJobs];
  int64_t first_word[kMaxRelayoutJobs + 1];  // prefix sums of the jobs' word counts
  int count;
};

__global__ void scale_to_blocked_kernel(RelayoutBatch batch) {
  int64_t const w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (w >= batch.first_word[batch.count]) return;
  int j = 0;
  while (j + 1 < batch.count && w >= batch.first_word[j + 1]) ++j;
  ScaleRelayout const& s = batch.job[j];
  int64_t const local = w - batch.first_word[j];
  // The word's row and first block (the inverse of sf_byte).
  int64_t row, block0;
  mx_blocked::sf_word_origin(local, s.blocks, row, block0);
  uint32_t word = 0;
  for (int c = 0; c < 4; ++c) {
    int64_t const blk = block0 + c;
    uint32_t const code = (row < s.rows && blk < s.blocks) ? s.src[row * s.ld + blk] : 0x7Fu;
    word |= code << (8 * c);
  }
  reinterpret_cast<uint32_t*>(s.dst)[local] = word;
}

inline int64_t blocked_words(ScaleRelayout const& s) { return mx_blocked::bytes(s.rows, s.blocks) / 4; }

inline cudaError_t scale_to_blocked(ScaleRelayout const* jobs, int count, cudaStream_t stream) {
  if (count < 1 || count > kMaxRelayoutJobs) return cudaErrorInvalidValue;
  RelayoutBatch b{};
  b.count = count;
  b.first_word[0] = 0;
  for (int j = 0; j < count; ++j) {
    b.job[j] = jobs[j];
    b.first_word[j + 1] = b.first_word[j] + blocked_words(jobs[j]);
  }
  int64_t const words = b.first_word[count];
  if (words == 0) return cudaSuccess;
  int const threads = 256;
  scale_to_blocked_kernel<<<unsigned((words + threads - 1) / threads), threads, 0, stream>>>(b);
  return cudaGetLastError();
}

}  // namespace persistent_gemm::host
