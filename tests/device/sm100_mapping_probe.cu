// tests/test_sm100_mapping.py: the arch-neutral SM100 pieces (kernel/sm100_tile_mapping.hpp) and
// the blocked scale layout (layout/mx_blocked.hpp), evaluated on the host and, given --device and
// a GPU (the H200), on the device, plus
//   - the blocked scale layout against CUTLASS's own Sm1xxBlockScaledConfig layouts (host), and
//   - the relayout kernel (host/scale_to_blocked.cuh) against sf_byte (device).
// Output, one record per line: "H|D <fn> <args...> : <results...>", then summary lines.
#include <cstdio>
#include <cstring>
#include <vector>

#include <cuda_runtime_api.h>

#include "cutlass/detail/sm100_blockscaled_layout.hpp"
#include "persistent_gemm/host/scale_to_blocked.cuh"
#include "persistent_gemm/kernel/sm100_tile_mapping.hpp"
#include "persistent_gemm/layout/mx_blocked.hpp"

namespace pm = persistent_gemm::kernel::sm100_map;
namespace blk = persistent_gemm::mx_blocked;
namespace mx = persistent_gemm::kernel::sm100_mx;

constexpr int kFields = 10;  // fn, 5 args, 4 results
constexpr int kMaxRecords = 4096;

// Every function over a fixed sweep; the same code runs on both sides.
__host__ __device__ int sweep(int32_t* out) {
  int n = 0;
  auto put = [&](int fn, int a0, int a1, int a2, int a3, int a4, int r0, int r1, int r2, int r3) {
    int32_t* r = out + n * kFields;
    int32_t const v[kFields] = {fn, a0, a1, a2, a3, a4, r0, r1, r2, r3};
    for (int i = 0; i < kFields; ++i) r[i] = v[i];
    ++n;
  };
  for (int ctas = 1; ctas <= 2; ++ctas)
    for (int cta_m = 64; cta_m <= 128; cta_m *= 2)
      for (uint32_t rank = 0; rank < 8; ++rank)
        for (int m = 0; m < 6; ++m) {
          auto const c = pm::cta_role(rank, m, ctas, cta_m);
          put(0, ctas, cta_m, int(rank), m, 0, c.leader, int(c.peer_rank), c.mma_m * 1000 + c.half, c.row0);
        }
  for (int ctas = 1; ctas <= 2; ++ctas)
    for (int tm = 1; tm <= 5; ++tm)
      for (int m = 0; m < 7; ++m)
        for (int nn = 0; nn < 3; ++nn) put(1, ctas, tm, m, nn, 2, pm::mma_tile_live(m, nn, tm, 2, ctas), 0, 0, 0);
  int const sms[] = {132, 148, 7};
  for (int s : sms)
    for (int cs = 1; cs <= 8; cs *= 2)
      for (int mac = 0; mac <= 80; mac += 20)
        for (int mw = 0; mw <= 3; mw += 3) {
          int const w = pm::workers(s, cs, mac, mw);
          put(2, s, cs, mac, mw, 0, w, pm::waves(1000, w), pm::waves(int64_t(1) << 30, w), 0);
        }
  int const ks[] = {1, 16, 32, 100, 128, 448, 512, 8192};
  for (int e2m1 = 0; e2m1 <= 1; ++e2m1)
    for (int k : ks)
      for (int ldd = 7; ldd <= 16; ldd += 9) {
        int const lda = (k + 15) / 16 * 16, ldb = e2m1 ? ((k / 2 + 15) / 16 * 16) : lda;
        put(3, e2m1, k, ldd, 0, 0, int(mx::rejection(33, 7, k, lda, ldb, ldd, e2m1, 2, false)),
            int(mx::rejection(33, 7, k, lda, ldb, ldd, e2m1, 2, true)), int(mx::padded_k(k, e2m1)), 0);
        // a weight row stride 16 past a 32-byte multiple (a K-slice view): only e2m1 minds
        put(5, e2m1, k, ldd, 0, 0, int(mx::rejection(33, 7, k, lda, ldb + 16, ldd, e2m1, 2, true)), 0, 0, 0);
      }
  int const blocks_[] = {1, 4, 5, 14, 256};
  for (int blocks : blocks_)
    for (int row = 0; row < 300; row += 37)
      for (int b = 0; b < blocks; b += (blocks > 8 ? 5 : 1)) {
        int64_t r, b0;
        int64_t const byte = blk::sf_byte(row, b, blocks);
        blk::sf_word_origin(byte / 4, blocks, r, b0);
        put(4, blocks, row, b, 0, 0, int(byte), int(r), int(b0),
            int(blk::sf_tile_atom(row / 128 * 128, b / 4, blocks)));
      }
  return n;
}

__global__ void sweep_kernel(int32_t* out, int* count) { *count = sweep(out); }

void print(char side, int32_t const* rec, int n) {
  for (int i = 0; i < n; ++i) {
    int32_t const* r = rec + i * kFields;
    std::printf("%c %d %d %d %d %d %d : %d %d %d %d\n", side, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9]);
  }
}

// sf_byte against CUTLASS's blocked layouts for SFA (rows = M) and SFB (rows = N).
int check_cutlass() {
  using Config = cutlass::detail::Sm1xxBlockScaledConfig<32>;
  int bad = 0, checked = 0;
  int const shapes[][3] = {{1, 1, 32}, {130, 257, 448}, {256, 128, 4096}, {77, 300, 160}};
  for (auto const& s : shapes) {
    auto const problem = cute::make_shape(s[0], s[1], s[2], 1);
    auto const sfa = Config::tile_atom_to_shape_SFA(problem);
    auto const sfb = Config::tile_atom_to_shape_SFB(problem);
    int64_t const blocks = (s[2] + 31) / 32;
    for (int which = 0; which < 2; ++which) {
      int const rows = which == 0 ? s[0] : s[1];
      for (int r = 0; r < rows; ++r)
        for (int64_t b = 0; b < blocks; ++b)
          for (int kk = 0; kk < 32; kk += 31) {  // every K element of the block maps to the same byte
            int64_t const k = b * 32 + kk;
            if (k >= s[2]) continue;
            int64_t const got = which == 0 ? int64_t(sfa(cute::make_coord(r, k, 0))) : int64_t(sfb(cute::make_coord(r, k, 0)));
            ++checked;
            if (got != blk::sf_byte(r, b, blocks) && bad++ < 5)
              std::printf("cutlass %s (%d, k=%lld): layout %lld, sf_byte %lld\n", which ? "SFB" : "SFA", r,
                          (long long)k, (long long)got, (long long)blk::sf_byte(r, b, blocks));
          }
    }
  }
  std::printf("cutlass layout checked %d mismatches %d\n", checked, bad);
  return bad;
}

// The relayout kernel's output against sf_byte of its plain input.
int check_relayout() {
  int bad = 0;
  int const shapes[][2] = {{1, 1}, {130, 14}, {257, 5}, {1000, 256}};
  for (auto const& s : shapes) {
    int64_t const rows = s[0], blocks = s[1], ld = blocks + 3;  // a strided source
    std::vector<uint8_t> plain(rows * ld);
    for (size_t i = 0; i < plain.size(); ++i) plain[i] = uint8_t((i * 2654435761u) >> 13);
    int64_t const bytes = (rows + 127) / 128 * blk::atoms_k(blocks) * 512;
    uint8_t *src, *dst;
    cudaMalloc(&src, plain.size());
    cudaMalloc(&dst, bytes);
    cudaMemcpy(src, plain.data(), plain.size(), cudaMemcpyHostToDevice);
    persistent_gemm::ScaleRelayout job{src, rows, blocks, ld, dst};
    cudaError_t err = persistent_gemm::host::scale_to_blocked(&job, 1, nullptr);
    std::vector<uint8_t> out(bytes);
    if (err == cudaSuccess) err = cudaMemcpy(out.data(), dst, bytes, cudaMemcpyDeviceToHost);
    cudaFree(src);
    cudaFree(dst);
    if (err != cudaSuccess) {
      std::printf("relayout error %s\n", cudaGetErrorString(err));
      return 1;
    }
    std::vector<int> hits(bytes, 0);
    for (int64_t r = 0; r < (rows + 127) / 128 * 128; ++r)
      for (int64_t b = 0; b < blk::atoms_k(blocks) * 4; ++b) {
        int64_t const at = blk::sf_byte(r, b, blocks);
        uint8_t const want = (r < rows && b < blocks) ? plain[r * ld + b] : 0x7F;
        ++hits[at];
        if (out[at] != want && bad++ < 5)
          std::printf("relayout (%lld, %lld): %d, want %d\n", (long long)r, (long long)b, out[at], want);
      }
    for (int64_t i = 0; i < bytes; ++i) bad += hits[i] != 1;  // sf_byte is a bijection onto the buffer
  }
  std::printf("relayout mismatches %d\n", bad);
  return bad;
}

int main(int argc, char** argv) {
  bool const device = argc > 1 && std::strcmp(argv[1], "--device") == 0;
  std::vector<int32_t> host(kMaxRecords * kFields);
  int const n = sweep(host.data());
  print('H', host.data(), n);
  int bad = check_cutlass();
  if (device) {
    int32_t* d_out;
    int* d_count;
    std::vector<int32_t> dev(kMaxRecords * kFields);
    int count = 0;
    cudaError_t err = cudaMalloc(&d_out, dev.size() * sizeof(int32_t));
    if (err == cudaSuccess) err = cudaMalloc(&d_count, sizeof(int));
    if (err == cudaSuccess) {
      sweep_kernel<<<1, 1>>>(d_out, d_count);
      err = cudaDeviceSynchronize();
    }
    if (err == cudaSuccess) err = cudaMemcpy(dev.data(), d_out, dev.size() * sizeof(int32_t), cudaMemcpyDeviceToHost);
    if (err == cudaSuccess) err = cudaMemcpy(&count, d_count, sizeof(int), cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) {
      std::printf("device error %s\n", cudaGetErrorString(err));
      return 2;
    }
    print('D', dev.data(), count);
    bad += check_relayout();
  }
  std::printf("records %d\n", n);
  return bad ? 1 : 0;
}
