// Never silently wrong on hardware the project could not test.
//
// An arch module whose table says validated_on_hardware = false (sm100a: compiled and
// SASS-checked here, never run by this project) is guarded at run time:
//   - the first use of one of its kernels in a process checks all of them, each on problems with
//     tails in M, N and K and on one cluster walking many tiles (check_shapes), against the op's
//     reference implementation (the CPU definition in ops.cpp). Python runs that check in a child
//     process with a timeout and caches the verdicts per (GPU, driver, build)
//     (python/persistent_gemm/selfcheck.py); a hang or a fault there fails the kernel being
//     checked instead of this process. A failure raises, naming the kernel and the way out, and
//     the kernel stays refused for the rest of the process;
//   - a one-time warning says the family has not been validated on hardware by the project.
//
// Environment:
//   PGEMM_SELF_CHECK = auto (default: the unvalidated archs) | all (every arch: how the H200
//                      tests exercise this code) | off
//   PGEMM_FALLBACK   = torch: on a guarded arch, run the ops' reference implementations
//                      (plain ATen, dequantize + fp32 torch.mm) instead of our kernels
//   PGEMM_SELF_CHECK_INJECT_FAULT = 1: tests only, corrupt one output element of every
//                      self-check run so the failure path can be exercised on a sound kernel
//   PGEMM_SELF_CHECK_INJECT_HANG = 1: tests only, a check that never returns (the timeout path)
#pragma once

#include <string>
#include <vector>

#include "dispatch.h"

namespace persistent_gemm::self_check {

// The arch's kernels are guarded (PGEMM_SELF_CHECK and the table's validated_on_hardware).
bool guarded(ArchModule const& mod);
// PGEMM_FALLBACK=torch and the arch is guarded: the op should run its reference instead.
bool use_fallback(ArchModule const& mod);
// Before launching `e` for `op`: checks it on its first use (when guarded); throws if it failed,
// now or earlier in this process.
void ensure(char const* op, ArchModule const& mod, KernelEntry const& e, int device);
// The out-of-process check (python/persistent_gemm/selfcheck.py): on the first use of a guarded
// kernel, a runner registered from Python checks it in a child process with a timeout (a hang or
// a fault there becomes a failed verdict, not the end of this process), or answers from its
// cache; ensure() records the verdict. Without a runner (C++ use, or inside the child itself),
// or when the runner cannot run, the check runs in this process.
struct Verdict {
  std::string config;
  bool passed;
  std::string report;  // why it failed; empty when passed
};
using Runner = Verdict (*)(std::string const& arch, std::string const& config, int device);
void set_runner(Runner runner);
// The check of one built config in this process (the child's work): passed, and the failure
// report naming the kernel, the GPU and the problem.
Verdict check_in_process(char const* op, std::string const& config, int device);
// What has been checked in this process, in no particular order.
struct Result {
  std::string config;
  bool passed;
  std::string report;  // the failure message; empty when passed
};
std::vector<Result> results();
// True on the thread while it runs a self-check (its op calls must not recurse into it, and
// poison their outputs).
bool running();
// The persistent workers (GemmArgs::max_workers) the running check asks the launch for: 0 (fill
// the GPU), or 1 for the pass that walks many tiles and K-tiles on one cluster.
int forced_workers();
// The problems the check of `e` runs, in order: {M, N, K, max_workers}. The first has tails in M,
// N and K on the full grid; the second (not for the decode GEMV) gives one cluster >= 6 tiles
// of K-tiles beyond any stage count, so both accumulator buffers, the pipeline's wrap-around and
// the persistent loop's later passes run (tests/test_self_check.py walks them on the CPU).
struct CheckShape {
  int64_t m, n, k;
  int max_workers;
};
std::vector<CheckShape> check_shapes(KernelEntry const& e);

}  // namespace persistent_gemm::self_check
