#include "persistent_gemm/layout/e2m1_placed.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>

// Host-only check (tests/test_placed_layout.py) of layout/e2m1_placed.hpp, exhaustively per half:
// every 16-bit half's four codes (all 65536), beside a pseudo-random other half, placed and
// unplaced back, and each pair decoded to the exact e2m1 values times 2^-126 (bf16 bits read as
// the top half of an fp32, subnormals included). Prints one line; exits non-zero on a mismatch.
namespace ep = persistent_gemm::e2m1_placed;

static double e2m1(unsigned code) {
  double const mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8u ? -1.0 : 1.0) * mag[code & 7u];
}

static double bf16(uint32_t bits16) {
  uint32_t const f = bits16 << 16;
  float v;
  std::memcpy(&v, &f, 4);
  return v;
}

int main() {
  int bad = 0;
  long checked = 0;
  uint32_t lcg = 12345u;
  for (int half = 0; half < 2; ++half) {
    for (uint32_t codes = 0; codes < 65536u; ++codes) {
      lcg = lcg * 1664525u + 1013904223u;
      // codes of this half's slots 0..3 (natural codes half, 2 + half, 4 + half, 6 + half)
      uint32_t natural = 0;
      for (int i = 0; i < 8; ++i) {
        uint32_t const c = i % 2 == half ? (codes >> (4 * (i / 2))) & 0xFu : (lcg >> (4 * i)) & 0xFu;
        natural |= c << (4 * i);
      }
      uint32_t const placed = ep::place(natural);
      if (ep::unplace(placed) != natural && bad++ < 4) std::printf("unplace(place(%08x)) = %08x\n", natural, ep::unplace(placed));
      for (int j = 0; j < 4; ++j, ++checked) {
        uint32_t const p = ep::pair_bf16x2(placed, j);
        for (int h = 0; h < 2; ++h) {
          unsigned const code = (natural >> (4 * (2 * j + h))) & 0xFu;
          double const got = bf16((p >> (16 * h)) & 0xFFFFu), want = std::ldexp(e2m1(code), -126);
          // -0 is a code too (8): its sign bit must come through
          bool const sign_ok = std::signbit(got) == bool(code & 8u);
          if ((got != want || !sign_ok) && bad++ < 8)
            std::printf("word %08x pair %d half %d: code %x -> %a, want %a\n", natural, j, h, code, got, want);
        }
      }
    }
  }
  // place is a bit permutation: every bit lands on a distinct bit
  uint32_t seen = 0;
  for (int b = 0; b < 32; ++b) seen |= ep::place(1u << b);
  if (seen != 0xFFFFFFFFu) ++bad;
  std::printf("e2m1_placed: %ld pair decodes checked, %d mismatches\n", checked, bad);
  return bad ? 1 : 0;
}
