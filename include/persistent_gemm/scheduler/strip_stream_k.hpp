// Stream-K over weight strips: the schedule of the MX decode GEMV (kernel/sm90_mx_gemv.hpp).
//
// The weight's N rows are cut into strips of `strip_rows`, each strip's K into `chunks` work
// units. The strips x chunks units are numbered strip-major (a strip's K chunks consecutive)
// and dealt to W workers as contiguous ranges differing in length by at most one unit:
//
//   worker w owns units [begin(w), begin(w+1)),  begin(w) = w * (U / W) + min(w, U % W).
//
// So a worker streams long contiguous K runs, and a strip is shared by at most the workers whose
// ranges meet it. Per (worker, strip) the worker's piece is one of three roles:
//   Whole    -- the piece is the whole strip: the worker writes D.
//   Partial  -- the piece starts past the strip's first chunk: the worker stores its fp32
//               partial sums in its slot (one per worker: only a worker's first strip can start
//               mid-strip) and publishes them.
//   Reducer  -- the piece starts at chunk 0 but the strip goes on in later workers' ranges: the
//               worker adds those workers' slots in worker order (fixed, so the result is the
//               same bits every run) and writes D. It is the last piece its worker computes.
// persistent_gemm.schedule.strip_stream_k is the Python twin of this walk (tests/test_gemv.py).
#pragma once

#include <cstdint>

#include "cutlass/cutlass.h"

namespace persistent_gemm::scheduler {

enum class StripRole : int32_t { Whole = 0, Partial = 1, Reducer = 2 };

struct StripStreamK {
  int32_t strips = 0, chunks = 0, workers = 0;

  CUTLASS_HOST_DEVICE int64_t units() const { return int64_t(strips) * chunks; }

  // Workers a problem uses: never more than there are units (every worker owns one at least).
  CUTLASS_HOST_DEVICE static int32_t workers_for(int32_t strips, int32_t chunks, int32_t sm_count) {
    int64_t const u = int64_t(strips) * chunks;
    return int32_t(u < sm_count ? u : sm_count);
  }

  CUTLASS_HOST_DEVICE int64_t begin(int32_t w) const {
    int64_t const u = units(), q = u / workers, r = u % workers;
    return w * q + (w < r ? w : r);
  }

  // The first worker whose range holds unit u (inverse of begin).
  CUTLASS_HOST_DEVICE int32_t owner(int64_t u) const {
    int64_t const q = units() / workers, r = units() % workers;
    int64_t const big = r * (q + 1);  // units held by the r workers of q + 1 units
    return int32_t(u < big ? u / (q + 1) : r + (u - big) / q);
  }

  CUTLASS_HOST_DEVICE StripRole role(int32_t w, int32_t strip) const {
    int64_t const s0 = int64_t(strip) * chunks, s1 = s0 + chunks;
    if (begin(w) > s0) return StripRole::Partial;
    return begin(w + 1) >= s1 ? StripRole::Whole : StripRole::Reducer;
  }

  // A reducer's partners: workers (w, last] hold the rest of its strip, in K order.
  CUTLASS_HOST_DEVICE int32_t last_partner(int32_t strip) const {
    return owner(int64_t(strip + 1) * chunks - 1);
  }
};

}  // namespace persistent_gemm::scheduler
