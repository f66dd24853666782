// Device roles and host launch of Sm90MxGemv (declared in sm90_mx_gemv.hpp, which says what
// each role does). Stage s of the ring: [weight boxes][activation boxes][weight scale atoms]
// [activation scales, block-major]; full[s] completes on the copies' bytes plus the scale
// warp's arrival, empty[s] on one arrival per consumer warp.
#pragma once

namespace persistent_gemm::kernel {

template <class OperandW, class ElementD, int Tokens>
CUTLASS_DEVICE void Sm90MxGemv<OperandW, ElementD, Tokens>::kernel_body(Params const& p, uint8_t* smem) {
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  int const warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], 2);  // producer's expect-tx + scale warp
      cutlass::arch::ClusterBarrier::init(&empty[s], gemv_detail::kConsumerWarps);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  // The next kernel may start its prologue (its own weight loads) as SMs free up.
  gemv_detail::launch_dependents();
  if (warp == gemv_detail::kProducerWarp)
    producer(p, smem, full, empty);
  else if (warp == gemv_detail::kScaleWarp)
    scale_loader(p, smem, full, empty);
  else
    consumer(p, smem, full, empty);
}

template <class OperandW, class ElementD, int Tokens>
CUTLASS_DEVICE void Sm90MxGemv<OperandW, ElementD, Tokens>::producer(Params const& p, uint8_t* smem, uint64_t* full,
                                                                       uint64_t* empty) {
  if (threadIdx.x % 32 != 0) return;  // one thread issues: a unit is 2 + kXBoxes TMA boxes and a bulk copy
  int const w = blockIdx.x;
  int64_t const u0 = p.sched.begin(w), count = p.sched.begin(w + 1) - u0;
  uint64_t const policy = gemv_detail::evict_first_policy();
  // Boxes past N or K are zero-filled and still count their full bytes.
  uint32_t const tx_x = uint32_t(kXBoxes) * kBox * uint32_t(p.m);
  // The weight (and its scales) of unit i: independent of the previous kernel.
  auto load_weight = [&](int64_t i) {
    int const s = int(i % kStages);
    uint8_t* st = smem + s * kStageBytes;
    int32_t const strip = int32_t((u0 + i) / p.sched.chunks), chunk = int32_t((u0 + i) % p.sched.chunks);
    int const atoms = gemv_detail::imin(kAtoms, p.k_atoms - chunk * kAtoms);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[s], uint32_t(kWBytes) + uint32_t(atoms) * 512u + tx_x);
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h)
      cute::SM90_TMA_LOAD_2D::copy(&p.w_map, &full[s], policy, st + h * (kWBytes / 2),
                                   chunk * gemv_detail::kChunkBytes + h * kBox, strip * gemv_detail::kStripRows);
    gemv_detail::bulk_g2s(st + kWBytes + kXBytes, p.w_scale + (int64_t(strip) * p.k_atoms + chunk * kAtoms) * 512,
                          uint32_t(atoms) * 512u, &full[s], policy, true);
  };
  // The activation rows of unit i: written by the previous kernel, so after the PDL wait.
  auto load_x = [&](int64_t i) {
    uint8_t* st = smem + int(i % kStages) * kStageBytes + kWBytes;
    int32_t const chunk = int32_t((u0 + i) % p.sched.chunks);
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < kXBoxes; ++h)
      cute::SM90_TMA_LOAD_2D::copy(&p.x_map, &full[i % kStages], 0, st + h * kXBox, chunk * kChunkK + h * kBox, 0);
  };
  int64_t const first = count < kStages ? count : int64_t(kStages);
  for (int64_t i = 0; i < first; ++i) load_weight(i);
  gemv_detail::wait_prerequisites();
  for (int64_t i = 0; i < first; ++i) load_x(i);
  for (int64_t i = first; i < count; ++i) {
    cutlass::arch::ClusterBarrier::wait(&empty[i % kStages], uint32_t(((i / kStages) & 1) ^ 1));
    load_weight(i);
    load_x(i);
  }
}

template <class OperandW, class ElementD, int Tokens>
CUTLASS_DEVICE void Sm90MxGemv<OperandW, ElementD, Tokens>::scale_loader(Params const& p, uint8_t* smem,
                                                                           uint64_t* full, uint64_t* empty) {
  int const lane = threadIdx.x % 32;
  int const w = blockIdx.x;
  int64_t const u0 = p.sched.begin(w), count = p.sched.begin(w + 1) - u0;
  constexpr int kPerLane = kBlocks * Tokens / 32;  // codes per lane per unit
  // Code e of a unit: block e / Tokens, token e % Tokens (the stage's block-major order). Tokens
  // past M read 127 (1.0): their activation rows are never loaded and their D columns never
  // written, so any finite factor does.
  auto fetch = [&](int64_t i, uint8_t (&codes)[kPerLane]) {
    int32_t const chunk = int32_t((u0 + i) % p.sched.chunks);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kPerLane; ++j) {
      int const e = lane + 32 * j, b = e / Tokens, t = e % Tokens;
      int const kb = chunk * kBlocks + b;
      uint8_t c = 127;
      if (t < p.m && kb < p.k_blocks) {
        int64_t const off = p.ld_x_scale > 0
                                ? t * p.ld_x_scale + kb
                                : (int64_t(t / 128) * p.k_atoms + kb / 4) * 512 + collective::mx_detail::atom_offset(t % 128) + kb % 4;
        c = __ldg(p.x_scale + off);
      }
      codes[j] = c;
    }
  };
  gemv_detail::wait_prerequisites();
  uint8_t cur[kPerLane], next[kPerLane];
  if (count > 0) fetch(0, cur);
  for (int64_t i = 0; i < count; ++i) {
    if (i + 1 < count) fetch(i + 1, next);  // in flight while this unit waits for its slot
    int const s = int(i % kStages);
    cutlass::arch::ClusterBarrier::wait(&empty[s], uint32_t(((i / kStages) & 1) ^ 1));
    // Widened here, once per unit, so the consumers read their tokens' scales as one float2.
    float* xs = reinterpret_cast<float*>(smem + s * kStageBytes + kWBytes + kXBytes + kSBytes);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kPerLane; ++j) xs[lane + 32 * j] = collective::mx_detail::e8m0_to_float(cur[j]);
    __syncwarp();
    if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&full[s]);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kPerLane; ++j) cur[j] = next[j];
  }
}

template <class OperandW, class ElementD, int Tokens>
CUTLASS_DEVICE void Sm90MxGemv<OperandW, ElementD, Tokens>::consumer(Params const& p, uint8_t* smem, uint64_t* full,
                                                                       uint64_t* empty) {
  using collective::mx_detail::e8m0_to_float;
  int const lane = threadIdx.x % 32, cw = threadIdx.x / 32;
  int const g = lane / 4, t = lane % 4;
  int const w = blockIdx.x;
  int64_t const u0 = p.sched.begin(w), count = p.sched.begin(w + 1) - u0;
  // This lane's fragment rows g and g+8 are strip rows r0 and r1: for e4m3 (LDS.64 by half-warps)
  // rows 2g, 2g+1, so a half-warp's four rows XOR their chunks with distinct r % 8; for e2m1
  // (LDS.32 by the whole warp) rows g, g+8.
  int const r0 = cw * 16 + (kE2m1 ? g : 2 * g);
  int const r1 = r0 + (kE2m1 ? 8 : 1);
  // Byte `x` of row `r` in a stage region of 128 B x rows boxes (box = x / 128), 128B-swizzled.
  auto swz = [](int r, int x, int box_bytes) {
    return (x / kBox) * box_bytes + r * kBox + ((((x % kBox) / 16) ^ (r % 8)) * 16) + x % 16;
  };
  // D and the bias may be the previous kernel's: every consumer orders itself after it.
  gemv_detail::wait_prerequisites();

  float acc[kNTiles][4];
  auto finish = [&](int32_t strip) {
    scheduler::StripRole const role = p.sched.role(w, strip);
    size_t const slot_floats = size_t(kNTiles) * 4 * 32;
    if (role == scheduler::StripRole::Partial) {
      float* slot = p.slots + (size_t(w) * gemv_detail::kConsumerWarps + cw) * slot_floats;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kNTiles; ++j)
        CUTLASS_PRAGMA_UNROLL
        for (int e = 0; e < 4; ++e) __stcg(slot + (j * 4 + e) * 32 + lane, acc[j][e]);
      __threadfence();
      __syncwarp();
      if (lane == 0) gemv_detail::st_release(p.flags + size_t(w) * gemv_detail::kConsumerWarps + cw, p.nonce);
      return;
    }
    if (role == scheduler::StripRole::Reducer) {
      int32_t const last = p.sched.last_partner(strip);
      for (int32_t c = w + 1; c <= last; ++c) {
        uint64_t const* flag = p.flags + size_t(c) * gemv_detail::kConsumerWarps + cw;
        while (gemv_detail::ld_acquire(flag) != p.nonce) {
        }
        float const* slot = p.slots + (size_t(c) * gemv_detail::kConsumerWarps + cw) * slot_floats;
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kNTiles; ++j)
          CUTLASS_PRAGMA_UNROLL
          for (int e = 0; e < 4; ++e) acc[j][e] += __ldcg(slot + (j * 4 + e) * 32 + lane);
        __syncwarp();  // every lane saw the nonce before the flag is cleared for the next launch
        if (lane == 0) *const_cast<uint64_t volatile*>(flag) = 0;
      }
    }
    // D = alpha * acc + beta * bias[row], rounded once; D[token][row] (the transposed store).
    cutlass::NumericConverter<ElementD, float> convert;
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      int const row = strip * gemv_detail::kStripRows + (h ? r1 : r0);
      if (row >= p.n) continue;
      float const b = p.bias && p.beta != 0.0f ? p.beta * float(p.bias[row]) : 0.0f;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kNTiles; ++j)
        CUTLASS_PRAGMA_UNROLL
        for (int v = 0; v < 2; ++v) {
          int const token = 8 * j + 2 * t + v;
          if (token < p.m) p.d[int64_t(token) * p.ldd + row] = convert(fmaf(p.alpha, acc[j][2 * h + v], b));
        }
    }
  };

  for (int64_t i = 0; i < count; ++i) {
    int32_t const strip = int32_t((u0 + i) / p.sched.chunks), chunk = int32_t((u0 + i) % p.sched.chunks);
    if (i == 0 || chunk == 0) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kNTiles; ++j)
        CUTLASS_PRAGMA_UNROLL
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    }
    int const s = int(i % kStages);
    cutlass::arch::ClusterBarrier::wait(&full[s], uint32_t((i / kStages) & 1));
    uint8_t const* st = smem + s * kStageBytes;
    uint8_t const* ws = st + kWBytes + kXBytes;
    float const* xs = reinterpret_cast<float const*>(ws + kSBytes);
    int const nb = gemv_detail::imin(kBlocks, p.k_blocks - chunk * kBlocks);
    // A whole unit has no branch between its blocks, so the compiler can issue every block's
    // shared-memory loads and mmas ahead of the promotions (a per-block exit test serialized the
    // blocks: measured 3x slower for e2m1). Only a strip's last unit of a K that is not a multiple
    // of the unit takes the counted loop.
    auto blocks = [&](auto whole) {
    uint32_t wcodes[2] = {0, 0};
    CUTLASS_PRAGMA_UNROLL
    for (int b = 0; b < kBlocks; ++b) {
      if constexpr (!decltype(whole)::value) {
        if (b >= nb) break;
      }
      if (b % 4 == 0) {
        // Four blocks' codes of rows r0 and r1 (one 32-bit word each in the atom).
        wcodes[0] = *reinterpret_cast<uint32_t const*>(ws + (b / 4) * 512 + collective::mx_detail::atom_offset(r0));
        wcodes[1] = *reinterpret_cast<uint32_t const*>(ws + (b / 4) * 512 + collective::mx_detail::atom_offset(r1));
      }
      float const sw0 = e8m0_to_float((wcodes[0] >> (8 * (b % 4))) & 0xFF);
      float const sw1 = e8m0_to_float((wcodes[1] >> (8 * (b % 4))) & 0xFF);
      // A fragment: slots (t*4..t*4+3 | 16+t*4..) of rows g, g+8 hold K = 32b + 8t + (0..3 | 4..7):
      // one permutation of the block's K, the same on the B side, so each lane reads 8 contiguous
      // K of its rows.
      uint32_t a[4];
      if constexpr (kE2m1) {
        uint32_t const q0 = *reinterpret_cast<uint32_t const*>(st + swz(r0, b * 16 + t * 4, kWBytes / 2));
        uint32_t const q1 = *reinterpret_cast<uint32_t const*>(st + swz(r1, b * 16 + t * 4, kWBytes / 2));
        collective::mx_detail::e2m1x8_to_e4m3x8(q0, a[0], a[2]);
        collective::mx_detail::e2m1x8_to_e4m3x8(q1, a[1], a[3]);
      } else {
        uint2 const q0 = *reinterpret_cast<uint2 const*>(st + swz(r0, b * 32 + t * 8, kWBytes / 2));
        uint2 const q1 = *reinterpret_cast<uint2 const*>(st + swz(r1, b * 32 + t * 8, kWBytes / 2));
        a[0] = q0.x, a[1] = q1.x, a[2] = q0.y, a[3] = q1.y;
      }
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kNTiles; ++j) {
        uint2 const x = *reinterpret_cast<uint2 const*>(st + kWBytes + swz(8 * j + g, b * 32 + t * 8, kXBox));
        float temp[4];
        gemv_detail::mma_e4m3(temp, a, x.x, x.y);
        float2 const sx = *reinterpret_cast<float2 const*>(xs + b * Tokens + 8 * j + 2 * t);
        float const sx0 = sx.x, sx1 = sx.y;
        // C fragment: (row g, tokens 2t, 2t+1), (row g+8, the same tokens). The scale product
        // first (activation x weight), as the wgmma MX mainloop does.
        acc[j][0] = fmaf(temp[0], sx0 * sw0, acc[j][0]);
        acc[j][1] = fmaf(temp[1], sx1 * sw0, acc[j][1]);
        acc[j][2] = fmaf(temp[2], sx0 * sw1, acc[j][2]);
        acc[j][3] = fmaf(temp[3], sx1 * sw1, acc[j][3]);
      }
    }
    };
    if (nb == kBlocks)
      blocks(std::true_type{});
    else
      blocks(std::false_type{});
    __syncwarp();
    if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&empty[s]);
    if (chunk == p.sched.chunks - 1 || i == count - 1) finish(strip);
  }
}

template <class OperandW, class ElementD, int Tokens>
cudaError_t Sm90MxGemv<OperandW, ElementD, Tokens>::run(GemmArgs const& g, cudaStream_t stream) noexcept {
  if (!can_implement(g)) return cudaErrorInvalidValue;
  Params params = make_params(g);
  if (!encode(params.w_map, g.a, g.m, kE2m1 ? g.k / 2 : g.k, g.lda, gemv_detail::kStripRows) ||
      !encode(params.x_map, g.b, g.n, g.k, g.ldb, g.n))
    return cudaErrorInvalidValue;
  void const* entry = reinterpret_cast<void const*>(&sm90_mx_gemv_kernel<Sm90MxGemv>);
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if ((err = opt_in_smem<Sm90MxGemv>(entry, device)) != cudaSuccess) return err;
  // Programmatic dependent launch: the weight stream starts before the previous kernel ends.
  cudaLaunchAttribute attr[1]{};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(params.sched.workers));
  config.blockDim = dim3(gemv_detail::kThreads);
  config.dynamicSmemBytes = size_t(SharedStorageSize);
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  void* kernel_args[] = {const_cast<Params*>(&params)};
  return cudaLaunchKernelExC(&config, entry, kernel_args);
}

}  // namespace persistent_gemm::kernel
