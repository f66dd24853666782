// The two passes around the SM100 grouped MXFP8 GEMM (kernel/sm100_mx_gemm_builder.hpp, grouped).
//
// tcgen05's block-scaled MMA reads the activations' scales by TMA as whole 128-row bands of
// 128 x 4 atoms (layout/mx_blocked.hpp), and the epilogue stores whole 128-row tiles by TMA. An
// expert whose rows do not start on a band boundary would share its first band's scale atoms,
// and its tiles' stores, with the expert before it. So the kernel runs on band-aligned copies:
//
//   in pass   expert e's rows are copied to the padded rows from band_begin[e] * 128, where
//             band_begin[e] = sum over f < e of ceil(rows_f / 128) -- the grouped walk's tile
//             ids before e divided by the N tiles (1x1 clusters). Its plain e8m0 scales go to
//             those rows of a blocked scale tensor; a band's rows past the expert are zeros.
//   GEMM      walks (expert, band, N tile) with the scheduler's grouped walk (group_m): A and
//             its scales at the padded band, the weight and its scales at the expert (the L
//             coordinate), fp32 D at the padded rows.
//   out pass  each activation row's fp32 D row -> out, alpha * D + beta * bias[expert], rounded
//             once (the fused epilogue of the grouped ops; a bias per expert cannot be added
//             after the kernel without the row -> expert map).
//
// The copies are sized on the host, before the rows are known: ceil(R / 128) + min(E, R) bands
// bound the sum (each non-empty expert adds at most one partial band; at most R are non-empty).
// Both passes build the CTA's GroupTable from offs (or the masked form's counts) as the GEMM does,
// and a CTA per band finds its expert in it; the in pass reports malformed offs (a message and a
// trap, as the SM90 grouped pre-pass; the GEMM leaves it to the pass before it).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cutlass/numeric_conversion.h"

#include "persistent_gemm/layout/mx_blocked.hpp"
#include "persistent_gemm/scheduler/grouped_rows.hpp"

namespace persistent_gemm::host {

namespace sm100_bands {

constexpr int kBandRows = 128;  // a UMMA 1-SM tile's rows and a scale atom's
constexpr int kThreads = 256;

// The padded bands the copies hold for `rows` activation rows over `groups` experts.
inline int64_t bands_bound(int64_t rows, int64_t groups) {
  return (rows + kBandRows - 1) / kBandRows + (groups < rows ? groups : rows);
}

// A band's expert and activation rows [row0, row0 + live), from the CTA's table (bands as items).
struct Band {
  int32_t group, row0, live;  // live in [1, 128]
};
__device__ inline Band band_at(scheduler::GroupTable const& t, int32_t groups, int32_t band) {
  scheduler::GroupItem const it = t.locate(band, groups, kBandRows);
  return {it.group, it.row0, it.rows};
}

// Every CTA: one warp builds the table (bands as the items), the CTA syncs; true when `band`
// is one of them and the rows were well formed.
__device__ inline bool enter(scheduler::GroupRows const& rows, scheduler::GroupTable& t, int32_t band,
                             bool report_bad) {
  __shared__ int32_t bad;
  if (threadIdx.x < 32) {
    int32_t const b = t.build(rows, kBandRows, int(threadIdx.x));
    if (threadIdx.x == 0) bad = b;
  }
  __syncthreads();
  if (bad >= 0) {
    scheduler::trap_on_bad_rows(rows, bad, report_bad && blockIdx.x == 0 && threadIdx.x == 0);
    return false;
  }
  return band < t.items(rows.groups);
}

}  // namespace sm100_bands

struct GroupedBandsIn {
  scheduler::GroupRows rows;    // offs or counts (device), the activations' rows
  int32_t k = 0;                // K: e4m3 bytes per row, a multiple of 32
  uint8_t const* a = nullptr;   // (R, K) e4m3, row stride lda bytes
  int64_t lda = 0;
  uint8_t const* scale_a = nullptr;  // (R, K / 32) plain e8m0, row stride ld_scale bytes
  int64_t ld_scale = 0;
  uint8_t* a_pad = nullptr;     // (bands * 128, K), row stride K
  uint8_t* sfa_pad = nullptr;   // blocked, bands x atoms_k(K / 32) atoms
  int64_t bands = 0;            // the grid: bands_bound
};

template <int kThreads>
__global__ void __launch_bounds__(kThreads) sm100_grouped_bands_in_kernel(GroupedBandsIn job) {
  __shared__ scheduler::GroupTable table;
  int32_t const band = int32_t(blockIdx.x);
  if (!sm100_bands::enter(job.rows, table, band, /*report_bad=*/true)) return;
  sm100_bands::Band const b = sm100_bands::band_at(table, job.rows.groups, band);
  int64_t const pad0 = int64_t(band) * sm100_bands::kBandRows;
  // Rows, 16 bytes a thread (K % 32 == 0): the expert's, then zeros to the band's end.
  int32_t const chunks = job.k / 16;
  for (int32_t i = threadIdx.x; i < sm100_bands::kBandRows * chunks; i += kThreads) {
    int32_t const r = i / chunks, c = i % chunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < b.live) v = *reinterpret_cast<uint4 const*>(job.a + (b.row0 + r) * job.lda + 16 * c);
    *reinterpret_cast<uint4*>(job.a_pad + (pad0 + r) * job.k + 16 * c) = v;
  }
  // Scales: every byte of the band's atoms (their padded block columns too), zero past the rows.
  int32_t const blocks = job.k / 32;
  int32_t const cols = int32_t(mx_blocked::atoms_k(blocks)) * mx_blocked::kAtomBlocks;
  for (int32_t i = threadIdx.x; i < sm100_bands::kBandRows * cols; i += kThreads) {
    int32_t const r = i / cols, j = i % cols;
    uint8_t const s = r < b.live && j < blocks ? job.scale_a[(b.row0 + r) * job.ld_scale + j] : uint8_t(0);
    job.sfa_pad[mx_blocked::sf_byte(pad0 + r, j, blocks)] = s;
  }
}

template <class ElementD>
struct GroupedBandsOut {
  scheduler::GroupRows rows;
  int32_t n = 0;
  float const* d_pad = nullptr;  // (bands * 128, N), row stride ld_pad floats
  int64_t ld_pad = 0;
  ElementD* d = nullptr;         // (R, N), row stride ldd
  int64_t ldd = 0;
  ElementD const* bias = nullptr;  // (E, N) or null
  float alpha = 1.0f, beta = 1.0f;
  int64_t bands = 0;
};

template <class ElementD, int kThreads>
__global__ void __launch_bounds__(kThreads) sm100_grouped_bands_out_kernel(GroupedBandsOut<ElementD> job) {
  __shared__ scheduler::GroupTable table;
  int32_t const band = int32_t(blockIdx.x);
  if (!sm100_bands::enter(job.rows, table, band, /*report_bad=*/false)) return;
  sm100_bands::Band const b = sm100_bands::band_at(table, job.rows.groups, band);
  cutlass::NumericConverter<ElementD, float> convert;
  ElementD const* bias = job.bias ? job.bias + int64_t(b.group) * job.n : nullptr;
  for (int32_t r = 0; r < b.live; ++r) {
    float const* src = job.d_pad + (int64_t(band) * sm100_bands::kBandRows + r) * job.ld_pad;
    ElementD* dst = job.d + int64_t(b.row0 + r) * job.ldd;
    for (int32_t c = threadIdx.x; c < job.n; c += kThreads) {
      float const add = bias && job.beta != 0.0f ? job.beta * float(bias[c]) : 0.0f;
      dst[c] = convert(fmaf(job.alpha, src[c], add));
    }
  }
}

inline cudaError_t sm100_grouped_bands_in(GroupedBandsIn const& job, cudaStream_t stream) {
  if (job.bands <= 0) return cudaSuccess;
  sm100_grouped_bands_in_kernel<sm100_bands::kThreads><<<dim3(unsigned(job.bands)), sm100_bands::kThreads, 0, stream>>>(job);
  return cudaGetLastError();
}

template <class ElementD>
cudaError_t sm100_grouped_bands_out(GroupedBandsOut<ElementD> const& job, cudaStream_t stream) {
  if (job.bands <= 0) return cudaSuccess;
  sm100_grouped_bands_out_kernel<ElementD, sm100_bands::kThreads>
      <<<dim3(unsigned(job.bands)), sm100_bands::kThreads, 0, stream>>>(job);
  return cudaGetLastError();
}

}  // namespace persistent_gemm::host
