// Host side shared by the SM100 builders (Sm100Gemm, Sm100MxGemm): the persistent grid's worker
// count (sm100_map::workers, capped by max_active_clusters) and the launch.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "persistent_gemm/kernel/cluster_launch.hpp"
#include "persistent_gemm/kernel/sm100_tile_mapping.hpp"

namespace persistent_gemm::kernel {

// Fills sm_count and max_workers (sm100_map::workers) and launches the persistent grid.
template <class Kernel>
cudaError_t launch_sm100_persistent(void const* entry, typename Kernel::Arguments args, cudaStream_t stream) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (args.sm_count <= 0 &&
      (err = cudaDeviceGetAttribute(&args.sm_count, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess)
    return err;
  args.max_workers = sm100_map::workers(args.sm_count, Kernel::ClusterSize,
                                        args.max_workers > 0 ? 0 : max_active_clusters<Kernel>(entry, device),
                                        args.max_workers);
  return launch_on_clusters<Kernel>(entry, Kernel::to_underlying_arguments(args), stream);
}

}  // namespace persistent_gemm::kernel
