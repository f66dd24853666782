// A standalone probe of the MX bf16 route (kernel/sm90_mx_bf16_gemm_builder.hpp), without torch:
// random MX operands (wide e8m0 codes), sampled outputs checked against float64 on the GPU, and
// the time of the route (pre-pass + GEMM) and of the pre-pass alone, interleaved (bf16 torch.mm
// on the same extents is timed beside it by benchmarks/bench_mx.py, not here: no cuBLAS headers). For kernel development between extension builds; the project's numbers
// come from benchmarks/bench_mx.py.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -Iinclude -I$CUTLASS/include --expt-relaxed-constexpr \
//        benchmarks/mx_bf16_probe.cu -o .probe/mx_bf16_probe
//   .probe/mx_bf16_probe mxfp8|fp4 M N K [iters] [tile: 0 = 128x256 c1x1, 1 = 128x256 c2x1, 2 = 128x128 c1x1]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "persistent_gemm/kernel/sm90_mx_bf16_gemm_builder.hpp"

#include "probe_check.h"

using namespace persistent_gemm;
namespace mxd = persistent_gemm::collective::mx_detail;


template <class X, class Tile, class Cluster>
using RouteGemm = kernel::Sm90MxBf16Gemm<X, cutlass::bfloat16_t, Tile, Cluster,
                                         scheduler::PersistentSchedule<8, cute::size<0>(Cluster{}), cute::size<1>(Cluster{}),
                                                                       scheduler::Raster::Row>,
                                         kernel::Cooperative, 0>;
using T256 = cute::Shape<cute::_128, cute::_256, cute::_64>;
using T128 = cute::Shape<cute::_128, cute::_128, cute::_64>;
using C11 = cute::Shape<cute::_1, cute::_1, cute::_1>;
using C21 = cute::Shape<cute::_2, cute::_1, cute::_1>;

__device__ double e4m3_d(uint8_t b) {
  int const s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  double const v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
  return s ? -v : v;
}
__device__ double e2m1_d(uint8_t c) {
  double const mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (c & 8) ? -mag[c & 7] : mag[c & 7];
}

// out[s] = float64 dot of sampled (row i of D = token, column j = weight row).
__global__ void reference(int samples, const int* ii, const int* jj, const uint8_t* x, int64_t ldx, const uint8_t* wsf,
                          int64_t wsf_ld, const uint8_t* a, int64_t lda, const uint8_t* asf, int64_t asf_ld, int k,
                          bool fp4, double* out) {
  int const s = blockIdx.x;
  if (s >= samples) return;
  int const i = ii[s], j = jj[s];
  double acc = 0;
  for (int kk = threadIdx.x; kk < k; kk += blockDim.x) {
    double const av = e4m3_d(a[int64_t(i) * lda + kk]) * ldexp(1.0, int(asf[int64_t(i) * asf_ld + kk / 32]) - 127);
    uint8_t const wb = fp4 ? uint8_t((x[int64_t(j) * ldx + kk / 2] >> (4 * (kk % 2))) & 15) : x[int64_t(j) * ldx + kk];
    double const wv = (fp4 ? e2m1_d(wb) : e4m3_d(wb)) * ldexp(1.0, int(wsf[int64_t(j) * wsf_ld + kk / 32]) - 127);
    acc += av * wv;
  }
  __shared__ double red[256];
  red[threadIdx.x] = acc;
  __syncthreads();
  for (int w = 128; w > 0; w /= 2) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[s] = red[0];
}

static std::vector<uint8_t> to_blocked(std::vector<uint8_t> const& plain, int rows, int blocks) {
  int const bands = (rows + 127) / 128, cols = (blocks + 3) / 4;
  std::vector<uint8_t> b(size_t(bands) * cols * 512, 127);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < blocks; ++c)
      b[(size_t(r / 128) * cols + c / 4) * 512 + mxd::atom_offset(r % 128) + c % 4] = plain[size_t(r) * blocks + c];
  return b;
}

template <class Gemm>
void run_case(bool fp4, int M, int N, int K, int iters, int spread) {
  std::mt19937 rng(1234);
  int const blocks = (K + 31) / 32;
  int64_t const ldx = fp4 ? (K / 2 + 15) / 16 * 16 : (K + 15) / 16 * 16, lda = (K + 15) / 16 * 16;
  std::vector<uint8_t> hx(size_t(N) * ldx), ha(size_t(M) * lda), hws(size_t(N) * blocks), has(size_t(M) * blocks);
  auto fp8 = [&]() { uint8_t b; do b = uint8_t(rng()); while ((b & 0x7F) == 0x7F || (b & 0x7F) == 0); return b; };
  for (auto& b : hx) b = fp4 ? uint8_t(rng()) : fp8();
  for (auto& b : ha) b = fp8();
  std::uniform_int_distribution<int> code(127 - spread, 127 + spread);
  for (auto& c : hws) c = uint8_t(code(rng));
  for (auto& c : has) c = uint8_t(code(rng));
  auto hwb = to_blocked(hws, N, blocks);

  uint8_t *x, *a, *wsb, *wsp, *as;
  cutlass::bfloat16_t* d;
  CK(cudaMalloc(&x, hx.size()));
  CK(cudaMalloc(&a, ha.size()));
  CK(cudaMalloc(&wsb, hwb.size()));
  CK(cudaMalloc(&wsp, hws.size()));
  CK(cudaMalloc(&as, has.size()));
  CK(cudaMalloc(&d, size_t(M) * N * 2));
  CK(cudaMemcpy(x, hx.data(), hx.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(a, ha.data(), ha.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(wsb, hwb.data(), hwb.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(wsp, hws.data(), hws.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(as, has.data(), has.size(), cudaMemcpyHostToDevice));
  CK(cudaMemset(d, 0xFF, size_t(M) * N * 2));  // NaN poison

  GemmArgs g;
  g.m = N;  // swap-AB: the kernel's rows are the weight's
  g.n = M;
  g.k = K;
  g.a = x;
  g.lda = ldx;
  g.b = a;
  g.ldb = lda;
  g.d = d;
  g.ldd = N;
  g.scale_a = wsb;
  g.scale_b = as;
  g.ld_scale_b = blocks;  // plain activation scales
  g.scale_mode = ScaleMode::Block32;
  int dev = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&g.sm_count, cudaDevAttrMultiProcessorCount, dev));
  g.workspace_bytes = Gemm::workspace_bytes(g);
  CK(cudaMalloc(&g.workspace, g.workspace_bytes));
  CK(Gemm::run(g, 0));
  CK(cudaDeviceSynchronize());

  // Sampled float64 check, corners and tails included.
  int const S = 2048;
  std::vector<int> si(S), sj(S);
  std::uniform_int_distribution<int> di(0, M - 1), dj(0, N - 1);
  for (int s = 0; s < S; ++s) {
    si[s] = s < 4 ? (s & 1 ? M - 1 : 0) : di(rng);
    sj[s] = s < 4 ? (s & 2 ? N - 1 : 0) : dj(rng);
  }
  int *pi, *pj;
  double* pr;
  CK(cudaMalloc(&pi, S * 4));
  CK(cudaMalloc(&pj, S * 4));
  CK(cudaMalloc(&pr, S * 8));
  CK(cudaMemcpy(pi, si.data(), S * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(pj, sj.data(), S * 4, cudaMemcpyHostToDevice));
  reference<<<S, 256>>>(S, pi, pj, x, ldx, wsp, blocks, a, lda, as, blocks, K, fp4, pr);
  CK(cudaDeviceSynchronize());
  std::vector<double> ref(S);
  std::vector<cutlass::bfloat16_t> hd(size_t(M) * N);
  CK(cudaMemcpy(ref.data(), pr, S * 8, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hd.data(), d, hd.size() * 2, cudaMemcpyDeviceToHost));
  double num = 0, den = 0, worst = 0;
  int nan = 0;
  for (int s = 0; s < S; ++s) {
    double const o = double(float(hd[size_t(si[s]) * N + sj[s]]));
    if (std::isnan(o)) ++nan;
    double const e = std::fabs(o - ref[s]);
    num += e * e;
    den += ref[s] * ref[s];
    worst = std::max(worst, e / (std::fabs(ref[s]) + 1e-300));
  }
  // bf16 output rounding alone gives rel ~2^-9 per element; the norm-wise error of an exact
  // product with fp32 accumulation is about 2^-9 / sqrt(3).
  std::printf("check %s %dx%dx%d spread %d: normwise rel err %.3e (bf16 rounding ~1.1e-3), nan %d\n",
              fp4 ? "fp4" : "mxfp8", M, N, K, spread, std::sqrt(num / den), nan);

  // Timing: route (pre-pass + GEMM) and the pre-pass alone.
  auto prepass = [&]() {
    auto w = kernel::sm90_mx_bf16_detail::carve(g);
    host::MxBf16PrepassJob job;
    job.k = K; job.w_scale = wsb; job.w_rows = N; job.w_ref = w.w_ref; job.a = a; job.lda = lda;
    job.a_scale = as; job.a_scale_ld = blocks; job.a_rows = M; job.a_ref = w.a_ref; job.y = w.y; job.ldy = w.ldy;
    CK(host::mx_bf16_prepass(job, 0));
  };
  auto route = [&]() { CK(Gemm::run(g, 0)); };
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> t_route, t_pre;
  auto time = [&](auto&& f, std::vector<float>& out) {
    CK(cudaEventRecord(e0));
    f();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    out.push_back(ms * 1000);
  };
  for (int w = 0; w < 3; ++w) route();
  for (int it = 0; it < iters; ++it) {
    time(route, t_route);
    time(prepass, t_pre);
  }
  auto med = [](std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  double const flops = 2.0 * M * N * K;
  double const tr = med(t_route), tp = med(t_pre);
  std::printf("time %s %dx%dx%d: route %.1f us (%.0f TFLOP/s), pre-pass %.1f us, GEMM alone ~%.0f TFLOP/s\n",
              fp4 ? "fp4" : "mxfp8", M, N, K, tr, flops / tr * 1e-6, tp, flops / (tr - tp) * 1e-6);
  cudaFree(x); cudaFree(a); cudaFree(wsb); cudaFree(wsp); cudaFree(as); cudaFree(d); cudaFree(g.workspace);
  cudaFree(pi); cudaFree(pj); cudaFree(pr);
}

template <class X>
void dispatch_tile(int tile, int M, int N, int K, int iters, int spread) {
  bool const fp4 = std::is_same_v<X, collective::MxOperandE2m1>;
  if (tile == 0) run_case<RouteGemm<X, T256, C11>>(fp4, M, N, K, iters, spread);
  else if (tile == 1) run_case<RouteGemm<X, T256, C21>>(fp4, M, N, K, iters, spread);
  else run_case<RouteGemm<X, T128, C11>>(fp4, M, N, K, iters, spread);
}

int main(int argc, char** argv) {
  if (argc < 5) {
    std::printf("usage: %s mxfp8|fp4 M N K [iters [tile [spread]]]\n", argv[0]);
    return 2;
  }
  std::string const op = argv[1];
  int const M = std::atoi(argv[2]), N = std::atoi(argv[3]), K = std::atoi(argv[4]);
  int const iters = argc > 5 ? std::atoi(argv[5]) : 20, tile = argc > 6 ? std::atoi(argv[6]) : 0;
  int const spread = argc > 7 ? std::atoi(argv[7]) : 20;
  if (op == "fp4") dispatch_tile<collective::MxOperandE2m1>(tile, M, N, K, iters, spread);
  else dispatch_tile<collective::MxOperandE4m3>(tile, M, N, K, iters, spread);
  return 0;
}
