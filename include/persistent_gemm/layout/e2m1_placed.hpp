// A prepared layout of packed e2m1 weights whose bits are placed for bf16 (issue 46, step 1 of
// docs/design/fp4_placed_layout.md): each 32-bit word of eight codes of consecutive K is a bit
// permutation of its natural form (code i in nibble i), chosen so that the four bf16x2 pairs a
// bf16 mma wants -- pair j = (code 2j, code 2j + 1), the activations' natural K order, so no
// permute of theirs -- come out of 11 integer operations instead of the natural layout's 15, each
// pair the exact e2m1 values times 2^-126 (one HMUL2 by the scale times 2^126 finishes them).
//
// Placement (triton_kernels' Hopper value layout, bits renamed to our pairs): half h of the word
// (bits 16h .. 16h + 15) holds codes h, 2 + h, 4 + h, 6 + h, the code of pair j at
//   j = 0: sign 15, e1 8, e0 7, m 6     (bf16's sign, exponent's low two bits, mantissa's top bit)
//   j = 1: sign 12, e1 5, e0 4, m 3     (pair 0's bits >> 3)
//   j = 2: sign  9, e1 2, e0 1, m 0     (pair 0's bits >> 6)
//   j = 3: sign 14, e1 11, e0 10, m 13  (the bits left)
// Pairs 0-2 are one mask of a shift; pair 3 gathers three pieces. The exhaustive check of the
// four codes a half holds, placement and decode both: tests/host/e2m1_placed.cu.
//
// Plain arithmetic for host and device code: the kernels' decode, the host's repack
// (python/persistent_gemm/placed.py is its Python twin), the tests.
#pragma once

#include <cstdint>

#include "persistent_gemm/layout/mx_blocked.hpp"  // PGEMM_HD

namespace persistent_gemm::e2m1_placed {

// Where bit b of the code in slot j of a half goes (code bits: m 0, e0 1, e1 2, sign 3).
PGEMM_HD constexpr int position(int slot, int b) {
  if (slot == 3) return b == 0 ? 13 : (b == 3 ? 14 : 9 + b);  // m 13, e0 10, e1 11, sign 14
  return (b == 3 ? 15 : 6 + b) - 3 * slot;                     // slots 0-2: 6, 7, 8, 15, shifted down 3 each
}

// Natural word (code i in nibble i) -> placed word.
PGEMM_HD constexpr uint32_t place(uint32_t natural) {
  uint32_t placed = 0;
  for (int i = 0; i < 8; ++i) {
    uint32_t const code = (natural >> (4 * i)) & 0xFu;
    int const half = i % 2, slot = i / 2;
    for (int b = 0; b < 4; ++b) placed |= ((code >> b) & 1u) << (16 * half + position(slot, b));
  }
  return placed;
}

// Placed word -> natural word.
PGEMM_HD constexpr uint32_t unplace(uint32_t placed) {
  uint32_t natural = 0;
  for (int i = 0; i < 8; ++i) {
    int const half = i % 2, slot = i / 2;
    uint32_t code = 0;
    for (int b = 0; b < 4; ++b) code |= ((placed >> (16 * half + position(slot, b))) & 1u) << b;
    natural |= code << (4 * i);
  }
  return natural;
}

// Pair j of a placed word: codes 2j and 2j + 1 as bf16x2 (code 2j in the low half), each the
// exact e2m1 value times 2^-126 (code 0.5 a bf16 subnormal).
PGEMM_HD constexpr uint32_t pair_bf16x2(uint32_t x, int j) {
  constexpr uint32_t kMask = 0x81C081C0u;  // sign 15, exponent bits 8..7, mantissa bit 6, per half
  if (j < 3) return (x << (3 * j)) & kMask;
  return ((x << 1) & 0x80008000u) | ((x >> 3) & 0x01800180u) | ((x >> 7) & 0x00400040u);
}

}  // namespace persistent_gemm::e2m1_placed
