#include "persistent_gemm/collective/mx_block_scales.hpp"

#include <cmath>
#include <cstring>
#include <cstdio>

// Host-only check (tests/test_fold.py): the fold route's conversion tables and power-of-two
// factors (collective/mx_block_scales.hpp) hold the exact values. For every shift j of the
// window, byte i of e2m1_fold_lut(j) must be the e4m3 code of |e2m1 code i| * 2^j; f32_pow2_bits(e)
// must be 2^e for every e the fold's row factor can take. Prints one line; exits non-zero on
// any mismatch.
namespace mx = persistent_gemm::collective::mx_detail;

static double e4m3(unsigned b) {  // e4m3fn, positive codes
  unsigned const e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  return e ? std::ldexp(1.0 + m / 8.0, int(e) - 7) : std::ldexp(m / 8.0, -6);
}

int main() {
  double const e2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  int bad = 0, checked = 0;
  for (int j = mx::kFoldShiftMin; j <= mx::kFoldShiftMax; ++j) {
    unsigned long long const lut = mx::e2m1_fold_lut(j);
    for (int i = 0; i < 8; ++i, ++checked) {
      unsigned const b = unsigned(lut >> (8 * i)) & 0xFFu;
      double const want = std::ldexp(e2m1[i], j);
      if (b & 0x80u || e4m3(b) != want) {
        if (bad++ < 4) std::printf("j=%d code %d: byte 0x%02x = %g, want %g\n", j, i, b, e4m3(b & 0x7Fu), want);
      }
    }
  }
  // The plain conversion's constants are the table at j = 0.
  if (mx::e2m1_fold_lut(0) != 0x4C4844403C383000ull) ++bad;
  for (int e = -149; e <= 127; ++e, ++checked) {
    unsigned const bits = mx::f32_pow2_bits(e);
    float f;
    std::memcpy(&f, &bits, 4);
    if (double(f) != std::ldexp(1.0, e) && bad++ < 8) std::printf("f32_pow2_bits(%d) = %a\n", e, f);
  }
  std::printf("fold tables: %d values checked, mismatches: %d\n", checked, bad);
  return bad != 0;
}
