// What dispatch needs to know about a GPU, read once per device. (ATen's CUDAContext.h would
// do, but it drags in cuBLAS/cuSPARSE headers that a minimal CUDA toolkit does not ship.)
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

namespace persistent_gemm {

struct DeviceInfo {
  int major = 0, minor = 0, sm_count = 0;
  std::string name;
};

inline DeviceInfo const& device_info(int device) {
  static std::mutex mu;
  static std::vector<DeviceInfo> cache;
  static std::vector<bool> known;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= int(cache.size())) cache.resize(device + 1), known.resize(device + 1, false);
  if (!known[device]) {
    cudaDeviceProp prop;
    cudaError_t err = cudaGetDeviceProperties(&prop, device);
    TORCH_CHECK(err == cudaSuccess, "persistent_gemm: cannot query CUDA device ", device, ": ",
                cudaGetErrorString(err));
    cache[device] = {prop.major, prop.minor, prop.multiProcessorCount, prop.name};
    known[device] = true;
  }
  return cache[device];
}

}  // namespace persistent_gemm
