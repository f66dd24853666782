// The standalone probes' CUDA error check (benchmarks/*_probe.cu): print the failing call and exit.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime_api.h>

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)
