// Arch-neutral pieces of the MX (1x32 e8m0 block-scaled) mainloops: the K-tile in scale blocks,
// the exact e8m0 -> fp32 expansion and the e2m1 -> e4m3 / bf16 register conversions (the scales'
// blocked layout: layout/mx_blocked.hpp).
// Device code that is not tensor-core specific, shared by the SM90 collective (and meant for the
// SM100 block-scaled path's scale handling).
#pragma once

#include <cstdint>

#include "cutlass/cutlass.h"

#include "persistent_gemm/layout/mx_blocked.hpp"

namespace persistent_gemm::collective {

namespace mx_detail {

constexpr int kBlockK = 32;       // elements per e8m0 scale
constexpr int kTileK = 128;       // K-tile: 4 blocks = one blocked-layout atom column
constexpr int kBlocksPerTile = kTileK / kBlockK;
static_assert(kBlocksPerTile == mx_blocked::kAtomBlocks, "a K-tile's scales are one atom column");

// e8m0 code -> its exact fp32 value 2^(code - 127); 255 is NaN.
CUTLASS_DEVICE float e8m0_to_float(uint32_t code) {
  uint32_t bits = code << 23;
  bits = code == 0u ? 0x00400000u : bits;
  bits = code == 255u ? 0x7FC00000u : bits;
  return __uint_as_float(bits);
}

// Eight e2m1 codes (code i in nibble i of x) -> eight exact e4m3 bytes: lo holds codes 0..3,
// hi codes 4..7. |v| comes from a positive and a negative 8-entry byte LUT indexed by the
// code's low 3 bits; a third permute picks, per byte, the LUT the sign bit names.
// `pos0`/`pos1`: the LUT, e4m3 bytes of the magnitudes 0, .5, 1, 1.5 | 2, 3, 4, 6 (the plain
// conversion's constants, or e2m1_fold_lut's shifted ones).
CUTLASS_DEVICE void e2m1x8_to_e4m3x8(uint32_t x, uint32_t& lo, uint32_t& hi, uint32_t pos0 = 0x3C383000u,
                                     uint32_t pos1 = 0x4C484440u) {
  uint32_t const neg0 = pos0 | 0x80808080u, neg1 = pos1 | 0x80808080u;
  uint32_t const idx = x & 0x77777777u;
  // selector nibble i = i + 4 * sign_i: byte i of the positive (0..3) or negative (4..7) result
  uint32_t const sel = ((x & 0x88888888u) | 0x64206420u) >> 1;
  uint32_t const idx_hi = idx >> 16, sel_hi = sel >> 16;
  lo = __byte_perm(__byte_perm(pos0, pos1, idx), __byte_perm(neg0, neg1, idx), sel);
  hi = __byte_perm(__byte_perm(pos0, pos1, idx_hi), __byte_perm(neg0, neg1, idx_hi), sel_hi);
}

// ---- the exact fold (FP8 x FP4, MxOperandE2m1Fold) -------------------------------------------
// e2m1 * 2^j is an e4m3 value for every j in [kFoldShiftMin, kFoldShiftMax] (6 * 2^6 = 384 <= 448;
// 0.5 * 2^-8 = 2^-9, e4m3's smallest subnormal). A 16-row strip's block folds when its codes
// span <= 14: R = max - 6, each row's j = code - R; python/persistent_gemm/fold.py mirrors it.
constexpr int kFoldShiftMin = -8;
constexpr int kFoldShiftMax = 6;
constexpr int kFoldStripRows = 16;

// The conversion LUT of e2m1 * 2^j (see e2m1x8_to_e4m3x8). From j = -5 up every nonzero
// magnitude only moves its exponent field; below, the small ones become e4m3 subnormals.
CUTLASS_HOST_DEVICE constexpr uint64_t e2m1_fold_lut(int j) {
  return j >= -5 ? (uint64_t(0x4C484440u + uint32_t(j) * 0x08080808u) << 32) | (0x3C383000u + uint32_t(j) * 0x08080800u)
       : j == -6 ? 0x1C1814100C080400ull
       : j == -7 ? 0x14100C0806040200ull
                 : 0x0C08060403020100ull;
}

// fp32 2^e for e in [-149, 127]: normal from -126, subnormal below.
CUTLASS_HOST_DEVICE constexpr uint32_t f32_pow2_bits(int e) {
  return e >= -126 ? uint32_t(e + 127) << 23 : 1u << (e + 149);
}


// ---- the bf16 route (collective/sm90_mx_bf16_mma.hpp) ----------------------------------------
// The weight is converted to bf16 in registers straight from its natural byte order: a thread
// reads 8 consecutive K values of a 32-block (k = 8q .. 8q+7 for lane q = lane % 4) and turns
// them into the four bf16x2 registers its two k16 A fragments hold for that row. Pair j of
// those registers holds the values at 8q + 3 - j and 8q + 7 - j (that is where a shift of the
// packed e2m1 word puts them for free). The tensor core sums over fragment positions, so the
// activations are written by the pre-pass with the same permutation of K inside each 32-block:
// position p holds source element bf16_route_source(p).
//   position p = 16 kk + 8 half + 2 q + i  (k16 step kk, register half, lane q, element i)
//   register j = 2 kk + half,  source = 8 q + 4 i + 3 - j
CUTLASS_HOST_DEVICE constexpr int bf16_route_source(int p) {
  int const kk = p / 16, half = (p / 8) % 2, q = (p / 2) % 4, i = p % 2;
  return 8 * q + 4 * i + 3 - (2 * kk + half);
}

// bf16 bits of 2^e for the operand fold (e <= 127): normal, subnormal down to 2^-133, else 0.
CUTLASS_HOST_DEVICE constexpr uint32_t bf16_pow2_bits(int e) {
  return e >= -126 ? uint32_t(e + 127) << 7 : (e >= -133 ? 1u << (e + 133) : 0u);
}

// Pair j of eight e2m1 codes w (code i in nibble i): codes 3 - j and 7 - j as bf16x2, each the
// exact e2m1 value times 2^-126 (sign to bit 15, exponent and mantissa bits under bf16's
// exponent field's low bits). Nibble 3 - j + 4 t sits at the top of 16-bit lane t after << 4j.
CUTLASS_DEVICE uint32_t e2m1_pair_to_bf16x2(uint32_t w, int j) {
  uint32_t const s = w << (4 * j);
  return (s & 0x80008000u) | ((s & 0x70007000u) >> 6);
}

// Pair j of eight e4m3 bytes (lo = bytes 0..3, hi = 4..7): bytes 3 - j and 7 - j as bf16x2, each
// the exact e4m3 value times 2^-120 (subnormals included: e4m3's 2^-6 binade lands on bf16's
// subnormal 2^-126 binade with the same mantissa bits).
CUTLASS_DEVICE uint32_t e4m3_pair_to_bf16x2(uint32_t lo, uint32_t hi, int j) {
  uint32_t const u = __byte_perm(lo, hi, uint32_t((7 - j) << 12 | (3 - j) << 4));
  return (u & 0x80008000u) | ((u & 0x7F007F00u) >> 4);
}

}  // namespace mx_detail

}  // namespace persistent_gemm::collective
