// Host walk of the MX decode GEMV's schedule (scheduler/strip_stream_k.hpp), for the parity test
// against persistent_gemm.strip_schedule (tests/test_gemv.py). Reads "strips chunks workers"
// triples from argv; per worker prints one line: "w begin end | strip:role ... | partners".
#include <cstdio>
#include <cstdlib>

#include "persistent_gemm/scheduler/strip_stream_k.hpp"

int main(int argc, char** argv) {
  using persistent_gemm::scheduler::StripStreamK;
  for (int i = 1; i + 2 < argc; i += 3) {
    StripStreamK s{std::atoi(argv[i]), std::atoi(argv[i + 1]), std::atoi(argv[i + 2])};
    std::printf("schedule %d %d %d\n", s.strips, s.chunks, s.workers);
    for (int w = 0; w < s.workers; ++w) {
      long long const u0 = s.begin(w), u1 = s.begin(w + 1);
      std::printf("%d %lld %lld |", w, u0, u1);
      for (long long st = u0 / s.chunks; st <= (u1 - 1) / s.chunks; ++st) {
        int const role = int(s.role(w, int(st)));
        std::printf(" %lld:%d", st, role);
        if (role == 2) std::printf(">%d", s.last_partner(int(st)));
      }
      std::printf(" | owner %d\n", s.owner(u0));
    }
  }
  return 0;
}
