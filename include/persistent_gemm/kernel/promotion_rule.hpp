// Which promoting FP8 mainloop an SM90 tile gets, and the registers it holds: one rule for the
// builder (sm90_gemm_builder.hpp) and the sliced mainloop, which sizes the kernel's register
// split by it; config_rules.py's promoted_slice_n() mirrors it (test_accum checks the two agree).
// No CUTLASS here.
#pragma once

namespace persistent_gemm::kernel::promotion {

// fp32 accumulator registers one consumer thread holds for a tile: a cooperative tile is split
// over 256 threads, a ping-pong tile belongs to one 128-thread warpgroup.
constexpr int accumulator_registers(int tile_m, int tile_n, bool coop) { return tile_m * tile_n / (coop ? 256 : 128); }

// Registers the sliced mainloop (collective/sm90_fp8_sliced_promotion_mma.hpp) holds per consumer
// thread besides the accumulator: two slice temporaries (64 x slice_n fp32 over a warpgroup's 128
// threads) and one or two A fragments of a K-tile (64 x tile_k e4m3 over 128 threads).
constexpr int sliced_extra_registers(int slice_n, int tile_k, bool double_a) {
  return 2 * (64 * slice_n / 128) + (double_a ? 2 : 1) * (64 * tile_k / 128 / 4);
}

// The sliced mainloop's choice for a 128-row cooperative tile: the widest of 64, 32 and 16
// columns (an even number of slices) whose registers fit `sliced_budget` with one A fragment;
// two fragments (every slice RS) where those fit too, else the last slice of a K-tile reads A
// from shared memory (SS). Packed as slice_n * 2 + double_a; -1: none fits.
constexpr int sliced_choice(int tile_n, int tile_k, int acc, int sliced_budget) {
  constexpr int kWidths[] = {64, 32, 16};
  for (int slice : kWidths)
    if (tile_n % slice == 0 && (tile_n / slice) % 2 == 0 && acc + sliced_extra_registers(slice, tile_k, false) <= sliced_budget)
      return slice * 2 + (acc + sliced_extra_registers(slice, tile_k, true) <= sliced_budget ? 1 : 0);
  return -1;
}

// 0: the whole-tile mainloop (the accumulator and two whole-tile temporaries fit `budget`).
// > 0: the sliced mainloop, sliced_choice()'s packed value. -1: neither.
constexpr int choice(int tile_m, int tile_n, int tile_k, bool coop, int budget, int sliced_budget) {
  int const acc = accumulator_registers(tile_m, tile_n, coop);
  if (3 * acc <= budget) return 0;
  if (!coop || tile_m != 128) return -1;
  return sliced_choice(tile_n, tile_k, acc, sliced_budget);
}

}  // namespace persistent_gemm::kernel::promotion
