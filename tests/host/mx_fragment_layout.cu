#include "persistent_gemm/collective/sm90_mx_block_scaled_mma.hpp"
#include <cstdio>

// Host-only check (tests/test_mx_host_layout.py): the MX mainloop's hand-written fragment and
// shared-memory address formulas agree with CuTe's layouts for every thread of every tile shape
// the catalogue uses. The swizzle check is relative to a 512 B aligned tile; the kernel takes the
// XOR from the absolute shared-memory address, as TMA does, which reduces to this when aligned.
// Prints one line per shape; exits non-zero on any mismatch.
using namespace cute;
template <class M> int check_c(const char* name) {
  using TM = typename M::TiledMma;
  int bad = 0;
  auto cD = make_identity_tensor(make_shape(Int<M::kTileM>{}, Int<M::kTileN>{}));
  for (int t = 0; t < M::kMmaThreads; ++t) {
    auto tc = TM{}.get_thread_slice(t).partition_C(cD);
    for (int mi = 0; mi < M::kMmaM; ++mi) for (int ni = 0; ni < M::kMmaN; ++ni)
    for (int v = 0; v < size<0>(tc); ++v) {
      int v0 = v % 2, v1 = (v / 2) % 2, v2 = v / 4;
      auto c = tc(v, mi, ni);
      int r = M::fragment_row(t, mi, v1);
      int col = ni * M::kAtomN + 8 * v2 + 2 * (t % 4) + v0;
      if (get<0>(c) != r || get<1>(c) != col) { if (bad++ < 3) printf("%s C t%d v%d: (%d,%d) vs (%d,%d)\n", name, t, v, int(get<0>(c)), int(get<1>(c)), r, col); }
    }
  }
  printf("%s C layout mismatches: %d (frag %d x %d x %d)\n", name, bad, int(size<0>(decltype(TM{}.get_thread_slice(0).partition_C(cD)){})), M::kMmaM, M::kMmaN);
  return bad;
}
template <class M> int check_a(const char* name) {
  using TM = typename M::TiledMma;
  int bad = 0;
  auto cA = make_identity_tensor(make_shape(Int<M::kTileM>{}, Int<128>{}));
  for (int t = 0; t < M::kMmaThreads; ++t) {
    auto ta = TM{}.get_thread_slice(t).partition_A(cA);  // (MMA, MMA_M, MMA_K)
    for (int mi = 0; mi < M::kMmaM; ++mi) for (int kb = 0; kb < 4; ++kb)
    for (int v = 0; v < 16; ++v) {
      int v0 = v % 4, v1 = (v / 4) % 2, v2 = v / 8;
      auto c = ta(v, mi, kb);
      int r = M::fragment_row(t, mi, v1);
      int k = kb * 32 + 4 * (t % 4) + v0 + 16 * v2;
      if (get<0>(c) != r || get<1>(c) != k) { if (bad++ < 3) printf("%s A t%d v%d: (%d,%d) vs (%d,%d)\n", name, t, v, int(get<0>(c)), int(get<1>(c)), r, k); }
    }
  }
  // smem swizzle of packed rows
  auto L = typename M::SmemLayoutA{};
  int sbad = 0;
  for (int s = 0; s < 2; ++s) for (int r = 0; r < M::kTileM; ++r) for (int j = 0; j < 64; ++j) {
    int off = L(r, j, s);
    int mine = s * M::kTileM * 64 + r * 64 + (((j / 16) ^ ((r >> 1) & 3)) << 4) + j % 16;
    if (off != mine && sbad++ < 3) printf("smem r%d j%d: %d vs %d\n", r, j, off, mine);
  }
  printf("%s A layout mismatches: %d, smem mismatches %d\n", name, bad, sbad);
  return bad + sbad;
}
using namespace persistent_gemm::collective;
using C1 = cute::Shape<_1,_1,_1>; using C2 = cute::Shape<_2,_1,_1>;
int main() {
  int bad = 0;
  bad += check_c<Sm90MxBlockScaledMma<MxOperandE4m3, Shape<_128,_128,_128>, C2, 4, true>>("coop128x128");
  bad += check_c<Sm90MxBlockScaledMma<MxOperandE4m3, Shape<_256,_128,_128>, C2, 4, true>>("coop256x128");
  bad += check_c<Sm90MxBlockScaledMma<MxOperandE4m3, Shape<_64,_16,_128>, C1, 4, false, PromotePerKTile>>("pp64x16");
  bad += check_c<Sm90MxBlockScaledMma<MxOperandE4m3, Shape<_64,_64,_128>, C1, 4, false>>("pp64x64");
  bad += check_a<Sm90MxBlockScaledMma<MxOperandE2m1, Shape<_128,_128,_128>, C1, 4, true>>("rs coop128x128");
  bad += check_a<Sm90MxBlockScaledMma<MxOperandE2m1, Shape<_64,_16,_128>, C1, 4, false, PromotePerKTile>>("rs pp64x16");
  return bad != 0;
}
