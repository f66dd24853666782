// The device side of the parity check: every CTA of a persistent grid walks its scheduler on
// the GPU, exactly as a kernel's roles do, and records the tile it would own at each step.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "persistent_gemm/host/arch_module.h"  // kDeviceWalkColumns
#include "persistent_gemm/host/catalogue.h"    // schedule_params
#include "persistent_gemm/scheduler/tile_scheduler.hpp"

namespace persistent_gemm::host {

// out: int32 [workers][ClusterM*ClusterN][steps][7] = (batch, m_idx, n_idx, in_bounds, split,
// k_tile_begin, k_tile_end), steps = Scheduler::max_steps; entries past a worker's last id
// stay as the caller set them.
template <class Scheduler>
__global__ void device_schedule_kernel(typename Scheduler::Params params, int steps, int32_t* out) {
  if (threadIdx.x != 0) return;
  Scheduler sched(params);
  int const rank = int(blockIdx.x) * Scheduler::ClusterN + int(blockIdx.y) % Scheduler::ClusterN;
  int32_t* row = out + (size_t(sched.worker()) * Scheduler::ClusterM * Scheduler::ClusterN + rank) * steps *
                           kDeviceWalkColumns;
  for (auto w = sched.initial_work(); w.is_valid(); w = sched.next_work(w), row += kDeviceWalkColumns) {
    row[0] = w.l_idx;
    row[1] = w.m_idx;
    row[2] = w.n_idx;
    row[3] = w.in_bounds ? 1 : 0;
    row[4] = w.split_idx;
    row[5] = w.k_tile_begin;
    row[6] = w.k_tile_end;
  }
}

template <class Scheduler>
cudaError_t launch_device_schedule(int m, int n, int l, int k_tiles, int workers, int sm_count, int32_t* out,
                                   cudaStream_t stream) {
  auto const p = schedule_params<Scheduler>(m, n, l, k_tiles, workers, sm_count);
  // Launch all W workers, idle ones included, so the layout of `out` does not depend on
  // launched_workers(); a plain grid suffices: the walk needs blockIdx, not cluster hardware.
  dim3 grid(Scheduler::ClusterM, Scheduler::ClusterN * workers, 1);
  device_schedule_kernel<Scheduler><<<grid, 32, 0, stream>>>(p, Scheduler::max_steps(p), out);
  return cudaGetLastError();
}

}  // namespace persistent_gemm::host
