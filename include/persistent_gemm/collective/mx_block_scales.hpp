// Arch-neutral pieces of the MX (1x32 e8m0 block-scaled) mainloops: the blocked scale layout's
// atom geometry, the exact e8m0 -> fp32 expansion and the e2m1 -> e4m3 register conversion.
// Device code that is not tensor-core specific, shared by the SM90 collective (and meant for the
// SM100 block-scaled path's scale handling).
#pragma once

#include <cstdint>

#include "cutlass/cutlass.h"

namespace persistent_gemm::collective {

namespace mx_detail {

constexpr int kBlockK = 32;       // elements per e8m0 scale
constexpr int kTileK = 128;       // K-tile: 4 blocks = one blocked-layout atom column
constexpr int kBlocksPerTile = kTileK / kBlockK;
constexpr int kAtomRows = 128;
constexpr int kAtomBytes = 512;

// e8m0 code -> its exact fp32 value 2^(code - 127); 255 is NaN.
CUTLASS_DEVICE float e8m0_to_float(uint32_t code) {
  uint32_t bits = code << 23;
  bits = code == 0u ? 0x00400000u : bits;
  bits = code == 255u ? 0x7FC00000u : bits;
  return __uint_as_float(bits);
}

// Byte offset of (row, block % 4) inside a 512-byte atom: rows interleave in 32-row groups.
CUTLASS_HOST_DEVICE constexpr int atom_offset(int row_in_atom) {
  return (row_in_atom % 32) * 16 + (row_in_atom / 32) * 4;
}

// Eight e2m1 codes (code i in nibble i of x) -> eight exact e4m3 bytes: lo holds codes 0..3,
// hi codes 4..7. |v| comes from a positive and a negative 8-entry byte LUT indexed by the
// code's low 3 bits; a third permute picks, per byte, the LUT the sign bit names.
CUTLASS_DEVICE void e2m1x8_to_e4m3x8(uint32_t x, uint32_t& lo, uint32_t& hi) {
  constexpr uint32_t kPos0 = 0x3C383000u, kPos1 = 0x4C484440u;  // 0, .5, 1, 1.5 | 2, 3, 4, 6
  constexpr uint32_t kNeg0 = kPos0 | 0x80808080u, kNeg1 = kPos1 | 0x80808080u;
  uint32_t const idx = x & 0x77777777u;
  // selector nibble i = i + 4 * sign_i: byte i of the positive (0..3) or negative (4..7) result
  uint32_t const sel = ((x & 0x88888888u) | 0x64206420u) >> 1;
  uint32_t const idx_hi = idx >> 16, sel_hi = sel >> 16;
  lo = __byte_perm(__byte_perm(kPos0, kPos1, idx), __byte_perm(kNeg0, kNeg1, idx), sel);
  hi = __byte_perm(__byte_perm(kPos0, kPos1, idx_hi), __byte_perm(kNeg0, kNeg1, idx_hi), sel_hi);
}

}  // namespace mx_detail

}  // namespace persistent_gemm::collective
