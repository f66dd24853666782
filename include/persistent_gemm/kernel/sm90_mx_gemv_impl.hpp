// Device roles and host launch of Sm90MxGemv (declared in sm90_mx_gemv.hpp, which says what
// each role does). Stage s of the ring: [weight boxes][activation boxes][weight scale atoms]
// [activation scales, block-major]; full[s] completes on the copies' bytes plus the scale
// warp's 32 arrivals, empty[s] on one arrival per consumer thread.
#pragma once

namespace persistent_gemm::kernel {

template <class OperandW, class OperandX, class ElementD, int Tokens, int CtasPerSm, bool Grouped>
CUTLASS_DEVICE void Sm90MxGemv<OperandW, OperandX, ElementD, Tokens, CtasPerSm, Grouped>::kernel_body(Params const& p, uint8_t* smem) {
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes + kWsfBytes + kX16Bytes);
  uint64_t* empty = full + kStages;
  int const warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      // Every thread that touched the stage arrives itself (no lane speaks for its warp): the
      // hand-offs then rest on the mbarriers alone, which compute-sanitizer's racecheck models;
      // a __syncwarp the compiler proves redundant is not an ordering it can see.
      cutlass::arch::ClusterBarrier::init(&full[s], kFullArrivals);  // producer's expect-tx (+ scale lanes)
      cutlass::arch::ClusterBarrier::init(&empty[s], gemv_detail::kConsumerWarps * 32);
    }
    cutlass::arch::fence_barrier_init();
  }
  GroupTable* table = nullptr;
  if constexpr (Grouped) {
    // The experts' rows are the previous kernel's (the routing): read after the PDL wait, by
    // every CTA, into the same item table.
    table = reinterpret_cast<GroupTable*>(empty + kStages);
    gemv_detail::wait_prerequisites();
    if (warp == 0) {
      int32_t const bad = table->build(p.groups, Tokens, threadIdx.x % 32);
      scheduler::trap_on_bad_rows(p.groups, bad, blockIdx.x == 0 && threadIdx.x == 0);
    }
  }
  __syncthreads();
  // The next kernel may start its prologue (its own weight loads) as SMs free up.
  gemv_detail::launch_dependents();
  auto roles = [&](Schedule const& sched) {
    if (warp == gemv_detail::kProducerWarp)
      producer(p, sched, table, smem, full, empty);
    else if (warp == gemv_detail::kScaleWarp) {
      if constexpr (!kBf16X) scale_loader(p, sched, table, smem, full, empty);
    }
    else
      consumer(p, sched, table, smem, full, empty);
  };
  if constexpr (Grouped) {
    Schedule sched = p.sched;  // one expert's strips, times the items found
    sched.strips *= table->items(p.groups.groups);
    roles(sched);
  } else {
    roles(p.sched);  // read from the parameter space, as the roles always did
  }
}

template <class OperandW, class OperandX, class ElementD, int Tokens, int CtasPerSm, bool Grouped>
CUTLASS_DEVICE auto Sm90MxGemv<OperandW, OperandX, ElementD, Tokens, CtasPerSm, Grouped>::unit(
    Params const& p, Schedule const& sched, GroupTable const* table, int64_t u) -> Unit {
  int32_t const gs = int32_t(u / sched.chunks), chunk = int32_t(u % sched.chunks);
  if constexpr (Grouped) {
    int32_t const per = p.sched.strips;  // one expert's strips
    scheduler::GroupItem const it = table->locate(gs / per, p.groups.groups, Tokens);
    return {gs, gs % per, chunk, it.group, it.row0, it.rows};
  } else {
    return {gs, gs, chunk, 0, 0, p.m};
  }
}

template <class OperandW, class OperandX, class ElementD, int Tokens, int CtasPerSm, bool Grouped>
CUTLASS_DEVICE void Sm90MxGemv<OperandW, OperandX, ElementD, Tokens, CtasPerSm, Grouped>::producer(Params const& p, Schedule const& sched,
                                                                       GroupTable const* table, uint8_t* smem,
                                                                       uint64_t* full, uint64_t* empty) {
  if (threadIdx.x % 32 != 0) return;  // one thread issues: a unit is 2 + kXBoxes TMA boxes and a bulk copy
  int const w = blockIdx.x;
  int64_t const u0 = sched.begin(w), count = sched.begin(w + 1) - u0;
  uint64_t const policy = gemv_detail::evict_first_policy();
  // Boxes past N or K are zero-filled and still count their full bytes.
  uint32_t const tx_x = uint32_t(kXBoxes) * kBox * uint32_t(p.m);
  // The weight (and its scales) of unit i: independent of the previous kernel.
  auto load_weight = [&](int64_t i) {
    int const s = int(i % kStages);
    uint8_t* st = smem + s * kStageBytes;
    Unit const un = unit(p, sched, table, u0 + i);
    int const atoms = gemv_detail::imin(kAtoms, p.k_atoms - un.chunk * kAtoms);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[s], uint32_t(kWBytes) + uint32_t(atoms) * mx_blocked::kAtomBytes + tx_x);
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      int32_t const x = un.chunk * gemv_detail::kChunkBytes + h * kBox, y = un.strip * gemv_detail::kStripRows;
      if constexpr (Grouped)
        cute::SM90_TMA_LOAD_3D::copy(&p.w_map, &full[s], policy, st + h * (kWBytes / 2), x, y, un.group);
      else
        cute::SM90_TMA_LOAD_2D::copy(&p.w_map, &full[s], policy, st + h * (kWBytes / 2), x, y);
    }
    uint8_t const* w_scale = p.w_scale;
    if constexpr (Grouped) w_scale += un.group * p.w_scale_group_stride;
    gemv_detail::bulk_g2s(st + kWBytes + kXBytes, w_scale + (int64_t(un.strip) * p.k_atoms + un.chunk * kAtoms) * mx_blocked::kAtomBytes,
                          uint32_t(atoms) * mx_blocked::kAtomBytes, &full[s], policy);
  };
  // The activation rows of unit i: written by the previous kernel, so after the PDL wait.
  auto load_x = [&](int64_t i) {
    uint8_t* st = smem + int(i % kStages) * kStageBytes + kWBytes;
    int32_t chunk = int32_t((u0 + i) % sched.chunks), row0 = 0;
    if constexpr (Grouped) {
      Unit const un = unit(p, sched, table, u0 + i);
      chunk = un.chunk, row0 = un.row0;
    }
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < kXBoxes; ++h)
      cute::SM90_TMA_LOAD_2D::copy(&p.x_map, &full[i % kStages], 0, st + h * kXBox, chunk * kXChunkBytes + h * kBox, row0);
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

template <class OperandW, class OperandX, class ElementD, int Tokens, int CtasPerSm, bool Grouped>
CUTLASS_DEVICE void Sm90MxGemv<OperandW, OperandX, ElementD, Tokens, CtasPerSm, Grouped>::scale_loader(Params const& p, Schedule const& sched,
                                                                           GroupTable const* table, uint8_t* smem,
                                                                           uint64_t* full, uint64_t* empty) {
  int const lane = threadIdx.x % 32;
  int const w = blockIdx.x;
  int64_t const u0 = sched.begin(w), count = sched.begin(w + 1) - u0;
  constexpr int kPerLane = kBlocks * Tokens / 32;  // codes per lane per unit
  // Code e of a unit: block e / Tokens, token e % Tokens (the stage's block-major order). Tokens
  // past M read 127 (1.0): their activation rows are never loaded and their D columns never
  // written, so any finite factor does.
  auto fetch = [&](int64_t i, uint8_t (&codes)[kPerLane]) {
    Unit const un = unit(p, sched, table, u0 + i);
    // Grouped: the item's rows of the activations' plain scales (the host passes plain rows).
    uint8_t const* x_scale = p.x_scale + (Grouped ? un.row0 * p.ld_x_scale : 0);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kPerLane; ++j) {
      int const e = lane + 32 * j, b = e / Tokens, t = e % Tokens;
      int const kb = un.chunk * kBlocks + b;
      uint8_t c = 127;
      if (t < un.rows && kb < p.k_blocks) {
        using namespace mx_blocked;  // blocked: sf_byte, its atom columns (k_atoms) known
        int64_t const off = p.ld_x_scale > 0 ? t * p.ld_x_scale + kb
                                             : (int64_t(t / kAtomRows) * p.k_atoms + kb / kAtomBlocks) * kAtomBytes +
                                                   atom_offset(t % kAtomRows) + kb % kAtomBlocks;
        c = __ldg(x_scale + off);
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
    cutlass::arch::ClusterBarrier::arrive(&full[s]);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kPerLane; ++j) cur[j] = next[j];
  }
}

template <class OperandW, class OperandX, class ElementD, int Tokens, int CtasPerSm, bool Grouped>
CUTLASS_DEVICE void Sm90MxGemv<OperandW, OperandX, ElementD, Tokens, CtasPerSm, Grouped>::consumer(Params const& p, Schedule const& sched,
                                                                       GroupTable const* table, uint8_t* smem,
                                                                       uint64_t* full, uint64_t* empty) {
  using collective::mx_detail::e8m0_to_float;
  int const lane = threadIdx.x % 32, cw = threadIdx.x / 32;
  int const g = lane / 4, t = lane % 4;
  int const w = blockIdx.x;
  int64_t const u0 = sched.begin(w), count = sched.begin(w + 1) - u0;
  // This lane's fragment rows g and g+8 are strip rows r0 and r1: for e4m3 (LDS.64 by half-warps)
  // rows 2g, 2g+1, so a half-warp's four rows XOR their chunks with distinct r % 8; for e2m1
  // (LDS.32 by the whole warp) rows g, g+8.
  int const r0 = cw * 16 + (kE2m1 ? g : 2 * g);
  int const r1 = r0 + (kE2m1 ? 8 : 1);
  // Byte `x` of row `r` in a stage region of 128 B x rows boxes (box = x / 128), 128B-swizzled.
  auto swz = [](int r, int x, int box_bytes) {
    return (x / kBox) * box_bytes + r * kBox + ((((x % kBox) / 16) ^ (r % 8)) * 16) + x % 16;
  };
  float* wsf = reinterpret_cast<float*>(smem + kStages * kStageBytes) + cw * 16 * kBlocks;
  uint8_t* x16_base = smem + kStages * kStageBytes + kWsfBytes;
  // D and the bias may be the previous kernel's: every consumer orders itself after it.
  gemv_detail::wait_prerequisites();

  float acc[kNTiles][4];
  auto finish = [&](Unit const& un) {
    scheduler::StripRole const role = sched.role(w, un.gs);
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
      int32_t const last = sched.last_partner(un.gs);
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
    // The f16 FP4 path's products carry 2^-7 (weight 2^-14, activations 2^7): undone here, once.
    float const alpha = kE2m1 && kHalfX ? p.alpha * 128.0f : p.alpha;
    // Grouped: the expert's bias row, and the item's rows of D.
    ElementD const* bias = p.bias ? p.bias + int64_t(un.group) * p.n : nullptr;
    ElementD* d = p.d + int64_t(un.row0) * p.ldd;
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      int const row = un.strip * gemv_detail::kStripRows + (h ? r1 : r0);
      if (row >= p.n) continue;
      float const b = bias && p.beta != 0.0f ? p.beta * float(bias[row]) : 0.0f;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kNTiles; ++j)
        CUTLASS_PRAGMA_UNROLL
        for (int v = 0; v < 2; ++v) {
          int const token = 8 * j + 2 * t + v;
          if (token < un.rows) d[int64_t(token) * p.ldd + row] = convert(fmaf(alpha, acc[j][2 * h + v], b));
        }
    }
  };

  Unit un{};
  for (int64_t i = 0; i < count; ++i) {
    // The unit's item changes only with its strip: the grouped table is searched once a strip.
    int32_t const chunk = int32_t((u0 + i) % sched.chunks);
    if (!Grouped || i == 0 || chunk == 0) un = unit(p, sched, table, u0 + i);
    un.chunk = chunk;
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
    // This warp's 16 rows x kBlocks weight scales, e8m0 -> fp32 once per unit: lane l widens row
    // l / 2, half l % 2 of the blocks (one or two 4-block words of the atoms).
    {
      __syncwarp();  // every lane is done reading the previous unit's
      int const lr = lane / 2;
      int const row = cw * 16 + lr;
      CUTLASS_PRAGMA_UNROLL
      for (int q = 0; q < kBlocks / 8; ++q) {
        int const b4 = (lane % 2) * (kBlocks / 8) + q;  // this lane's 4-block group
        uint32_t const word =
            *reinterpret_cast<uint32_t const*>(ws + b4 * mx_blocked::kAtomBytes + mx_blocked::atom_offset(row));
        float4 f;
        f.x = e8m0_to_float(word & 0xFF);
        f.y = e8m0_to_float((word >> 8) & 0xFF);
        f.z = e8m0_to_float((word >> 16) & 0xFF);
        f.w = e8m0_to_float(word >> 24);
        *reinterpret_cast<float4*>(wsf + (lr * kBlocks + 4 * b4)) = f;
      }
      __syncwarp();
    }
    // Up to 16 tokens (FP4: 32): the consumers widen the unit's activations to f16 once, together (the
    // e4m3 B operand of every warp's mma would otherwise be converted per warp and block).
    uint8_t* x16 = x16_base + (i % 2) * (Tokens * kX16Row);
    if constexpr (kHalfX) {
      constexpr int kGroups = kChunkK / 8;  // 8 activations per item
      for (int e = threadIdx.x; e < un.rows * kGroups; e += gemv_detail::kConsumerWarps * 32) {
        int const tok = e / kGroups, x = (e % kGroups) * 8;
        uint2 const q = *reinterpret_cast<uint2 const*>(st + kWBytes + swz(tok, x, kXBox));
        uint4 h;
        if constexpr (kE2m1) {
          // The weight's K order (pairs 8t + j, 8t + j + 4) and 2^7: with the weight's 2^-14 the
          // products carry 2^-7, undone once on the result.
          uint32_t const p01 = __byte_perm(q.x, q.y, 0x5140), p23 = __byte_perm(q.x, q.y, 0x7362);
          h.x = gemv_detail::f16x2_times_128(gemv_detail::e4m3x2_to_f16x2(p01));
          h.y = gemv_detail::f16x2_times_128(gemv_detail::e4m3x2_to_f16x2(p01 >> 16));
          h.z = gemv_detail::f16x2_times_128(gemv_detail::e4m3x2_to_f16x2(p23));
          h.w = gemv_detail::f16x2_times_128(gemv_detail::e4m3x2_to_f16x2(p23 >> 16));
        } else {
          h.x = gemv_detail::e4m3x2_to_f16x2(q.x);
          h.y = gemv_detail::e4m3x2_to_f16x2(q.x >> 16);
          h.z = gemv_detail::e4m3x2_to_f16x2(q.y);
          h.w = gemv_detail::e4m3x2_to_f16x2(q.y >> 16);
        }
        *reinterpret_cast<uint4*>(x16 + tok * kX16Row + x * 2) = h;
      }
      cutlass::arch::NamedBarrier::sync(gemv_detail::kConsumerWarps * 32, 1);
    }
    // bf16 activations (weight-only): the weight's 8 K values of each row -> four bf16x2 pairs
    // (K 8t + 3 - j, 8t + 7 - j: mx_detail's placements, a shift apart), brought to their values
    // by one HMUL2 each; the tokens' 8 bf16 at K 8t..8t+7 (one LDS.128) paired the same way by
    // PRMT. Two k16 mmas: pairs (0 | 1), then (2 | 3). No activation scale: temp * s_w.
    [[maybe_unused]] auto bf16_block = [&](int b, float sw0, float sw1) {
      uint32_t ab[8];  // [pair j] x rows (r0 | r1)
      if constexpr (kE2m1) {
        uint32_t const q0 = *reinterpret_cast<uint32_t const*>(st + swz(r0, b * 16 + t * 4, kWBytes / 2));
        uint32_t const q1 = *reinterpret_cast<uint32_t const*>(st + swz(r1, b * 16 + t * 4, kWBytes / 2));
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < 4; ++j) {
          ab[2 * j] = gemv_detail::bf16x2_times_pow2<126>(collective::mx_detail::e2m1_pair_to_bf16x2(q0, j));
          ab[2 * j + 1] = gemv_detail::bf16x2_times_pow2<126>(collective::mx_detail::e2m1_pair_to_bf16x2(q1, j));
        }
      } else {
        uint2 const q0 = *reinterpret_cast<uint2 const*>(st + swz(r0, b * 32 + t * 8, kWBytes / 2));
        uint2 const q1 = *reinterpret_cast<uint2 const*>(st + swz(r1, b * 32 + t * 8, kWBytes / 2));
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < 4; ++j) {
          ab[2 * j] = gemv_detail::bf16x2_times_pow2<120>(collective::mx_detail::e4m3_pair_to_bf16x2(q0.x, q0.y, j));
          ab[2 * j + 1] = gemv_detail::bf16x2_times_pow2<120>(collective::mx_detail::e4m3_pair_to_bf16x2(q1.x, q1.y, j));
        }
      }
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kNTiles; ++j) {
        uint4 const x = *reinterpret_cast<uint4 const*>(st + kWBytes + swz(8 * j + g, (b * 32 + t * 8) * 2, kXBox));
        uint32_t const x37 = __byte_perm(x.y, x.w, 0x7632), x26 = __byte_perm(x.y, x.w, 0x5410);
        uint32_t const x15 = __byte_perm(x.x, x.z, 0x7632), x04 = __byte_perm(x.x, x.z, 0x5410);
        float const zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float temp[4];
        gemv_detail::mma_16bit</*kBf16=*/true>(temp, ab[0], ab[1], ab[2], ab[3], x37, x26, zero);
        gemv_detail::mma_16bit</*kBf16=*/true>(temp, ab[4], ab[5], ab[6], ab[7], x15, x04, temp);
        acc[j][0] = fmaf(temp[0], sw0, acc[j][0]);
        acc[j][1] = fmaf(temp[1], sw0, acc[j][1]);
        acc[j][2] = fmaf(temp[2], sw1, acc[j][2]);
        acc[j][3] = fmaf(temp[3], sw1, acc[j][3]);
      }
    };
    // e4m3 activations with their scales (the MX ops).
    [[maybe_unused]] auto mx_block = [&](int b, float sw0, float sw1) {
      // A fragment: lane t of rows g, g+8 holds K = 32b + 8t + 0..7 of its rows -- one
      // permutation of the block's K, the same on the B side, so each lane reads 8 contiguous K.
      [[maybe_unused]] uint32_t a[4];  // e4m3 x4: rows (r0 | r1) x K (8t..8t+3 | 8t+4..8t+7)
      [[maybe_unused]] uint32_t ah[8];  // f16x2: [pair p] x rows (r0 | r1)
      if constexpr (kE2m1 && kHalfX) {
        // Straight to f16 (times 2^-14), pairs (8t + p, 8t + p + 4): no e4m3 step, no F2FP.
        uint32_t const q0 = *reinterpret_cast<uint32_t const*>(st + swz(r0, b * 16 + t * 4, kWBytes / 2));
        uint32_t const q1 = *reinterpret_cast<uint32_t const*>(st + swz(r1, b * 16 + t * 4, kWBytes / 2));
        uint32_t h0[4], h1[4];
        gemv_detail::e2m1x8_to_f16x8_scaled(q0, h0);
        gemv_detail::e2m1x8_to_f16x8_scaled(q1, h1);
        CUTLASS_PRAGMA_UNROLL
        for (int p = 0; p < 4; ++p) ah[2 * p] = h0[p], ah[2 * p + 1] = h1[p];
      } else if constexpr (kE2m1) {
        uint32_t const q0 = *reinterpret_cast<uint32_t const*>(st + swz(r0, b * 16 + t * 4, kWBytes / 2));
        uint32_t const q1 = *reinterpret_cast<uint32_t const*>(st + swz(r1, b * 16 + t * 4, kWBytes / 2));
        collective::mx_detail::e2m1x8_to_e4m3x8(q0, a[0], a[2]);
        collective::mx_detail::e2m1x8_to_e4m3x8(q1, a[1], a[3]);
      } else {
        uint2 const q0 = *reinterpret_cast<uint2 const*>(st + swz(r0, b * 32 + t * 8, kWBytes / 2));
        uint2 const q1 = *reinterpret_cast<uint2 const*>(st + swz(r1, b * 32 + t * 8, kWBytes / 2));
        a[0] = q0.x, a[1] = q1.x, a[2] = q0.y, a[3] = q1.y;
      }
      if constexpr (kHalfX && !kE2m1) {  // f16x2 pairs (8t + 2p, 8t + 2p + 1)
        CUTLASS_PRAGMA_UNROLL
        for (int h = 0; h < 2; ++h) {
          ah[0 + h] = gemv_detail::e4m3x2_to_f16x2(a[h]);
          ah[2 + h] = gemv_detail::e4m3x2_to_f16x2(a[h] >> 16);
          ah[4 + h] = gemv_detail::e4m3x2_to_f16x2(a[2 + h]);
          ah[6 + h] = gemv_detail::e4m3x2_to_f16x2(a[2 + h] >> 16);
        }
      }
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kNTiles; ++j) {
        float temp[4];
        if constexpr (kHalfX) {
          // Two k16 f16 mmas: slots (2t, 2t+1 | 2t+8, 2t+9) hold K pairs (0 | 1), then (2 | 3).
          uint4 const x = *reinterpret_cast<uint4 const*>(x16 + (8 * j + g) * kX16Row + (b * 32 + t * 8) * 2);
          float const zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          gemv_detail::mma_16bit</*kBf16=*/false>(temp, ah[0], ah[1], ah[2], ah[3], x.x, x.y, zero);
          gemv_detail::mma_16bit</*kBf16=*/false>(temp, ah[4], ah[5], ah[6], ah[7], x.z, x.w, temp);
        } else {
          uint2 const x = *reinterpret_cast<uint2 const*>(st + kWBytes + swz(8 * j + g, b * 32 + t * 8, kXBox));
          gemv_detail::mma_e4m3(temp, a, x.x, x.y);
        }
        float2 const sx = *reinterpret_cast<float2 const*>(xs + b * Tokens + 8 * j + 2 * t);
        // C fragment: (row g, tokens 2t, 2t+1), (row g+8, the same tokens). The scale product
        // first (activation x weight), as the wgmma MX mainloop does.
        acc[j][0] = fmaf(temp[0], sx.x * sw0, acc[j][0]);
        acc[j][1] = fmaf(temp[1], sx.y * sw0, acc[j][1]);
        acc[j][2] = fmaf(temp[2], sx.x * sw1, acc[j][2]);
        acc[j][3] = fmaf(temp[3], sx.y * sw1, acc[j][3]);
      }
    };
    // A whole unit has no branch between its blocks, so the compiler can issue every block's
    // shared-memory loads and mmas ahead of the promotions (a per-block exit test serialized the
    // blocks: measured 3x slower for e2m1). Only a strip's last unit of a K that is not a multiple
    // of the unit takes the counted loop.
    auto blocks = [&](auto whole) {
      float4 sw4[2];
      auto block = [&](int b) {
        if (b % 4 == 0) {
          sw4[0] = *reinterpret_cast<float4 const*>(wsf + (r0 - cw * 16) * kBlocks + b);
          sw4[1] = *reinterpret_cast<float4 const*>(wsf + (r1 - cw * 16) * kBlocks + b);
        }
        float const sw0 = (&sw4[0].x)[b % 4], sw1 = (&sw4[1].x)[b % 4];
        if constexpr (kBf16X)
          bf16_block(b, sw0, sw1);
        else
          mx_block(b, sw0, sw1);
      };
      if constexpr (kBlockUnroll == kBlocks) {
        CUTLASS_PRAGMA_UNROLL
        for (int b = 0; b < kBlocks; ++b) {
          if constexpr (!decltype(whole)::value) {
            if (b >= nb) break;
          }
          block(b);
        }
      } else {
#pragma unroll(kBlockUnroll)
        for (int b = 0; b < kBlocks; ++b) {
          if constexpr (!decltype(whole)::value) {
            if (b >= nb) break;
          }
          block(b);
        }
      }
    };
    if (nb == kBlocks)
      blocks(std::true_type{});
    else
      blocks(std::false_type{});
    cutlass::arch::ClusterBarrier::arrive(&empty[s]);
    if (chunk == sched.chunks - 1 || i == count - 1) finish(un);
  }
}

template <class OperandW, class OperandX, class ElementD, int Tokens, int CtasPerSm, bool Grouped>
cudaError_t Sm90MxGemv<OperandW, OperandX, ElementD, Tokens, CtasPerSm, Grouped>::run(GemmArgs const& g, cudaStream_t stream) noexcept {
  if (!can_implement(g)) return cudaErrorInvalidValue;
  Params params = make_params(g);
  // Grouped: the weight is (groups, rows, K) with its own group stride; the activations are
  // every expert's rows, read in boxes of an item's most rows.
  if (!encode(params.w_map, g.a, g.m, kE2m1 ? g.k / 2 : g.k, g.lda, gemv_detail::kStripRows, Grouped ? g.groups : 1,
              Grouped ? g.group_stride_a : 0) ||
      !encode(params.x_map, g.b, g.n, int64_t(g.k) * kXElemBytes, g.ldb * kXElemBytes, params.m))
    return cudaErrorInvalidValue;
  void const* entry = reinterpret_cast<void const*>(&sm90_mx_gemv_kernel<Sm90MxGemv>);
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if ((err = opt_in_smem<Sm90MxGemv>(entry, device)) != cudaSuccess) return err;
  if constexpr (CtasPerSm > 1) {
    // Two rings per SM only fit when the L1/shared split gives shared memory all it can.
    err = cudaFuncSetAttribute(entry, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (err != cudaSuccess) return err;
  }
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
