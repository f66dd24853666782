// Host side shared by the SM100 builders (Sm100Gemm, Sm100MxGemm): the persistent grid's worker
// count from the occupancy query, and the launch.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "cutlass/device_kernel.h"

#include "persistent_gemm/kernel/cluster_launch.hpp"
#include "persistent_gemm/kernel/sm100_tile_mapping.hpp"

namespace persistent_gemm::kernel {

// Clusters of this kernel the device can hold at once (0 if the query fails), asked once per
// (kernel, device): GPC shape can make it smaller than sm_count / cluster size for clusters > 1.
template <class Kernel>
int max_active_clusters(void const* entry, int device) {
  static std::atomic<int> cached[64] = {};  // 0: not asked yet; -1: the query failed
  if (device >= 0 && device < 64) {
    int const c = cached[device].load(std::memory_order_acquire);
    if (c != 0) return c > 0 ? c : 0;
  }
  int clusters = 0;
  if (opt_in_smem<Kernel>(entry, device) == cudaSuccess) {
    cudaLaunchAttribute attr[1] = {cluster_attribute(Kernel::get_cluster_shape())};
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = Kernel::get_cluster_shape();
    cfg.blockDim = Kernel::get_block_shape();
    cfg.dynamicSmemBytes = size_t(Kernel::SharedStorageSize);
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&clusters, cutlass::device_kernel<Kernel>, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();  // not a sticky error; clear it
      clusters = 0;
    }
  }
  if (device >= 0 && device < 64) cached[device].store(clusters > 0 ? clusters : -1, std::memory_order_release);
  return clusters;
}

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
