// Which promoting FP8 mainloop an SM90 tile gets, and the registers it holds: one rule for the
// builder (sm90_gemm_builder.hpp), the sliced mainloop and the cost model; config_rules.py's
// promoted_slice_n() mirrors it (test_accum checks the two agree). No CUTLASS here: host code
// includes it too.
#pragma once

namespace persistent_gemm::kernel::promotion {

// fp32 accumulator registers one consumer thread holds for a tile: a cooperative tile is split
// over 256 threads, a ping-pong tile belongs to one 128-thread warpgroup.
constexpr int accumulator_registers(int tile_m, int tile_n, bool coop) { return tile_m * tile_n / (coop ? 256 : 128); }

// Registers the sliced mainloop (collective/sm90_fp8_sliced_promotion_mma.hpp) holds per consumer
// thread besides the accumulator: two slice temporaries (64 x slice_n fp32 over a warpgroup's 128
// threads) and the K-tile's A fragment (64 x tile_k e4m3 over 128 threads).
constexpr int sliced_extra_registers(int slice_n, int tile_k) { return 2 * (64 * slice_n / 128) + 64 * tile_k / 128 / 4; }

// 0: the whole-tile mainloop (the accumulator and two whole-tile temporaries fit `budget`).
// > 0: the sliced mainloop with that slice width, for 128-row cooperative tiles: the widest of
//      64, 32 and 16 columns, an even number of slices, whose registers fit `sliced_budget`.
// -1: neither.
constexpr int slice_n(int tile_m, int tile_n, int tile_k, bool coop, int budget, int sliced_budget) {
  int const acc = accumulator_registers(tile_m, tile_n, coop);
  if (3 * acc <= budget) return 0;
  if (!coop || tile_m != 128) return -1;
  constexpr int kWidths[] = {64, 32, 16};
  for (int slice : kWidths)
    if (tile_n % slice == 0 && (tile_n / slice) % 2 == 0 && acc + sliced_extra_registers(slice, tile_k) <= sliced_budget)
      return slice;
  return -1;
}

}  // namespace persistent_gemm::kernel::promotion
