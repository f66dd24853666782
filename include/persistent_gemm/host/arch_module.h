// What an arch module (_C_sm90a, _C_sm100a) exports to _C: its kernel table and the device
// scheduler walks of its configs (generated: <arch>/kernel_table.cpp).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "persistent_gemm/registry.h"

namespace persistent_gemm::host {

// A device walk's row: batch, m_idx, n_idx, in_bounds, split, k_tile_begin, k_tile_end.
constexpr int kDeviceWalkColumns = 7;
using DeviceScheduleFn = cudaError_t (*)(int m, int n, int l, int k_tiles, int workers, int sm_count,
                                         int32_t* out, cudaStream_t stream);
struct ScheduleEntry {
  char const* config;
  DeviceScheduleFn walk;
};

// Handed to _C in a PyCapsule named kArchCapsule.
struct ArchExport {
  KernelTable const* table;
  ScheduleEntry const* schedules;
};
constexpr char const* kArchCapsule = "persistent_gemm.ArchExport";

extern KernelTable const kKernelTable;
ScheduleEntry const* schedule_entries();  // terminated by {nullptr, nullptr}

}  // namespace persistent_gemm::host
