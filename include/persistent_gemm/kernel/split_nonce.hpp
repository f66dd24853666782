// The per-launch values of the split reductions' flags (Sm90GemmPersistent::split_fixup and
// the MX decode GEMV, sm90_mx_gemv.hpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <random>

namespace persistent_gemm::kernel {

// Split-K flags' per-launch values (Sm90GemmPersistent::split_fixup): a random 64-bit start per
// process (no earlier process's leftovers match, nor do small integers or float bit patterns
// by more than chance, 2^-64), then one step per launch; never 0 (the cleared state).
inline uint64_t next_split_nonce() {
  static std::atomic<uint64_t> counter{0};
  static uint64_t const seed = [] {
    std::random_device rd;
    return uint64_t(rd()) << 32 | rd();
  }();
  uint64_t const n = seed + counter.fetch_add(1, std::memory_order_relaxed);
  return n != 0 ? n : 1;
}

}  // namespace persistent_gemm::kernel
