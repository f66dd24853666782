// Host side shared by the SM90 and SM100 builders: opting a kernel into its dynamic shared
// memory and launching its persistent grid on thread-block clusters.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace persistent_gemm::kernel {

// TMA boxes, bulk copies and vector stores need 16-byte aligned global addresses.
inline bool aligned16(void const* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// cudaFuncSetAttribute is per-(function, device) state: set it once, not per launch. The state
// is keyed by `entry`, not by `Kernel` alone. nvcc gives every translation unit its own host
// stub of a template __global__, so two TUs that instantiate one Kernel type (the MX ops' bf16
// route and the weight-only one share a mainloop, epilogue and schedule) register two entries,
// while a static local of this inline template is one object for both (a GNU unique symbol, one
// even across shared objects, so a JIT module's twin of a catalogue kernel shares it too). Keyed
// by the type, whichever entry launched second skipped its opt-in and failed with "invalid
// argument" (tests/test_gpu_weight_only_kernels.py's order test).
template <class Kernel>
cudaError_t opt_in_smem(void const* entry, int device) {
  constexpr int kEntries = 4;  // TUs or modules per Kernel type we remember; more just re-set it
  static std::atomic<void const*> done[64][kEntries] = {};
  bool const cacheable = device >= 0 && device < 64;
  if (cacheable) {
    for (auto const& slot : done[device])
      if (slot.load(std::memory_order_acquire) == entry) return cudaSuccess;
  }
  cudaError_t const err = cudaFuncSetAttribute(entry, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               Kernel::SharedStorageSize);
  if (err == cudaSuccess && cacheable) {
    for (auto& slot : done[device]) {
      void const* seen = nullptr;
      if (slot.compare_exchange_strong(seen, entry, std::memory_order_acq_rel) || seen == entry) break;
    }
  }
  return err;
}

inline cudaLaunchAttribute cluster_attribute(dim3 cluster) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster.x;
  attr.val.clusterDim.y = cluster.y;
  attr.val.clusterDim.z = 1;
  return attr;
}

// Clusters of this kernel the device can hold at once (0 if the query fails), asked once per
// (kernel, device). GPC shape can make it smaller than sm_count / cluster size for clusters of
// 4 or more. A persistent grid larger than that has workers that start only when others
// finish: each runs its whole walk late, and with split-K or stream-K a reducer spinning on a
// partial such a worker has yet to write never returns its SM to it.
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
    if (cudaOccupancyMaxActiveClusters(&clusters, entry, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();  // not a sticky error; clear it
      clusters = 0;
    }
  }
  if (device >= 0 && device < 64) cached[device].store(clusters > 0 ? clusters : -1, std::memory_order_release);
  return clusters;
}

// cudaLaunchKernelExC rather than CUTLASS's ClusterLauncher: that one sets the smem attribute
// on every launch and returns a Status, losing the cudaError_t the registry contract passes on.
template <class Kernel>
cudaError_t launch_on_clusters(void const* entry, typename Kernel::Params const& params, cudaStream_t stream) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if ((err = opt_in_smem<Kernel>(entry, device)) != cudaSuccess) return err;
  cudaLaunchAttribute attr[1] = {cluster_attribute(Kernel::get_cluster_shape())};
  cudaLaunchConfig_t config{};
  config.gridDim = Kernel::get_grid_shape(params);
  config.blockDim = Kernel::get_block_shape();
  config.dynamicSmemBytes = size_t(Kernel::SharedStorageSize);
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  void* kernel_args[] = {const_cast<typename Kernel::Params*>(&params)};
  return cudaLaunchKernelExC(&config, entry, kernel_args);
}

}  // namespace persistent_gemm::kernel
