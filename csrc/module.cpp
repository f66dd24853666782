// _C's Python face: arch-module registration, the catalogue and the scheduler parity entry
// points. The ops themselves are reached through torch.ops.persistent_gemm.
#include <torch/extension.h>

#include <optional>

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include "checks.h"
#include "device_info.h"
#include "dispatch.h"
#include "self_check.h"
#include "heuristics.h"
#include "text.h"
#include "persistent_gemm/scheduler/tile_scheduler.hpp"  // walk_steps
#include "persistent_gemm/host/catalogue.h"

namespace persistent_gemm {
namespace {

host::CatalogueRow const& find_config(std::string const& name) {
  for (auto const& row : host::catalogue())
    if (name == row.name) return row;
  TORCH_CHECK_VALUE(false, msg("unknown config '", name, "'"));
}

void check_shape(int m, int n, int l, int workers) {
  TORCH_CHECK_VALUE(m >= 1 && n >= 1 && l >= 1, msg("M, N and L must be >= 1, got ", m, ", ", n, ", ", l));
  TORCH_CHECK_VALUE(workers >= 1, msg("workers must be >= 1, got ", workers));
}

// (rows, 8) int32: worker, step, batch, cluster_row, cluster_col, split, k_tile_begin,
// k_tile_end. Host C++ scheduler.
at::Tensor schedule_order(std::string const& name, int m, int n, int l, int workers, int k_tiles) {
  check_shape(m, n, l, workers);
  TORCH_CHECK_VALUE(k_tiles >= 1, msg("k_tiles must be >= 1, got ", k_tiles));
  auto rows = find_config(name).order(m, n, l, k_tiles, workers);
  int64_t const cols = host::kOrderColumns;
  auto t = at::empty({int64_t(rows.size()) / cols, cols}, at::kInt);
  std::memcpy(t.data_ptr(), rows.data(), rows.size() * sizeof(int32_t));
  return t;
}

// (workers, cluster_m*cluster_n, steps, 7) int32 filled on the GPU by the device scheduler:
// batch, m_idx, n_idx, in_bounds, split, k_tile_begin, k_tile_end; -1 where a worker has no step.
at::Tensor device_schedule(std::string const& name, int m, int n, int l, int workers, int device, int k_tiles) {
  check_shape(m, n, l, workers);
  TORCH_CHECK_VALUE(k_tiles >= 1, msg("k_tiles must be >= 1, got ", k_tiles));
  ArchModule const* mod = arch_for_device(device);
  TORCH_CHECK(mod, msg("device_schedule: no kernel module is built for device ", device));
  for (auto const* s = mod->schedules; s->config; ++s) {
    if (name != s->config) continue;
    KernelGeometry const* shape = nullptr;  // every built config has at least one kernel entry
    for (int i = 0; i < mod->table->count && !shape; ++i)
      if (name == mod->table->entries[i].config) shape = &mod->table->entries[i].geometry;
    TORCH_CHECK(shape, msg("device_schedule: config '", name, "' has a scheduler walk but no kernel entry"));
    int64_t const mt = (m + shape->tile_m - 1) / shape->tile_m, nt = (n + shape->tile_n - 1) / shape->tile_n;
    int64_t const splits = std::min<int64_t>(shape->split_k, k_tiles);
    int64_t const ids = l * ((mt + shape->cluster_m - 1) / shape->cluster_m) *
                        ((nt + shape->cluster_n - 1) / shape->cluster_n) * splits;
    int64_t const steps = scheduler::walk_steps(ids, workers, shape->stream_k);  // = Scheduler::max_steps
    c10::cuda::CUDAGuard guard(device);
    auto out = at::full({workers, shape->cluster_m * shape->cluster_n, steps, host::kDeviceWalkColumns}, -1,
                        at::TensorOptions().dtype(at::kInt).device(at::kCUDA, device));
    auto const* prop = &device_info(device);
    cudaError_t err = s->walk(m, n, l, k_tiles, workers, prop->sm_count, out.data_ptr<int32_t>(),
                              c10::cuda::getCurrentCUDAStream(device));
    TORCH_CHECK(err == cudaSuccess, msg("device_schedule: launch failed: ", cudaGetErrorString(err)));
    return out;
  }
  // Not registered: a JIT-compiled config (any valid spec) is once persistent_gemm.jit loaded it.
  find_config(name);  // unknown names: "unknown config"
  TORCH_CHECK(false, msg("device_schedule: config '", name, "' is in the catalogue but not built for ",
              mod->table->arch));
}

// A problem as explain and tune describe it (dtype names of explain.py), for the arch module `arch`.
std::pair<ArchModule const*, Request> describe(char const* op, std::string const& arch, int64_t m, int64_t n,
                                               int64_t k, std::string const& dtype, std::string const& out_dtype,
                                               bool a_k_major, bool b_k_major, std::string const& scale,
                                               int sm_count, std::optional<std::string> config, bool fast_accum) {
  // choose_kernel refuses M, N, K < 1 and sm_count < 1; the 32-bit bound is the ops' (dispatch.cpp).
  for (auto [what, v] : {std::pair<char const*, int64_t>{"M", m}, {"N", n}, {"K", k}})
    TORCH_CHECK_VALUE(v < (int64_t(1) << 31), msg(op, ": ", what, " = ", v, " exceeds the 2^31 the kernels index"));
  TORCH_CHECK_VALUE(scale == "none" || scale == "tensor" || scale == "row",
                    msg(op, ": scale must be 'none', 'tensor' or 'row', got '", scale, "'"));
  auto const parse = [](std::string const& d, char const* what) {
    if (d == "bf16") return DType::BF16;
    if (d == "fp16") return DType::FP16;
    if (d == "fp32") return DType::FP32;
    if (d == "e4m3") return DType::E4M3;
    TORCH_CHECK_VALUE(false, msg(what, " must be bf16, fp16, fp32 or e4m3, got '", d, "'"));
  };
  ArchModule const* mod = nullptr;
  for (auto const& a : registered_arches())
    if (arch == a.table->arch) mod = &a;
  TORCH_CHECK_VALUE(mod, msg(op, ": no kernel module for arch '", arch, "' is built"));
  // The MX families: e4m3 activations with e8m0 block scales, e4m3 or e2m1 weights; the
  // weight-only ones (bf16x...): bf16 activations without scales.
  bool const weight_only = dtype == "bf16xe4m3" || dtype == "bf16xe2m1";
  bool const mx = dtype == "mxfp8" || dtype == "e4m3xe2m1" || weight_only;
  bool const e2m1 = dtype == "e4m3xe2m1" || dtype == "bf16xe2m1";
  DType const a = weight_only ? DType::BF16 : mx ? DType::E4M3 : parse(dtype, "dtype");
  DType const d = parse(out_dtype, "out_dtype");
  // The ops' own rules on the problem, so that explain never picks a kernel for a call the op refuses.
  if (e2m1) check_e2m1_extent(op, k);
  TORCH_CHECK_VALUE(!weight_only || d == DType::BF16 || d == DType::FP32,
                    msg(op, ": weight_only_mm writes the activations' dtype bf16 or fp32, got out_dtype ", out_dtype));
  Request r = make_request(m, n, k, a, e2m1 ? DType::E2M1 : mx ? DType::E4M3 : a, d,
                           mx                  ? ScaleMode::Block32  // e8m0 scales, applied in the mainloop
                           : scale == "tensor" ? ScaleMode::Tensorwise
                           : scale == "row"    ? ScaleMode::Rowwise
                                               : ScaleMode::None,
                           config);
  r.a_k_major = a_k_major, r.b_k_major = b_k_major;
  // sm_count <= 0: the reference part of the arch's cost model (H200: 132, B200: 148).
  r.sm_count = sm_count > 0 ? sm_count : mod->table->reference_sm_count;
  r.fast_accum = fast_accum;
  return {mod, r};
}

// The dispatcher's decision for a problem, without running it (persistent_gemm.explain). Where no
// built kernel fits, the decision is what the op does instead: weight_only_mm's reference, or
// no kernel at all ("none": the op refuses the problem on this arch's GPU; CPU tensors run the
// op's reference anywhere).
py::dict explain(std::string const& arch, int64_t m, int64_t n, int64_t k, std::string const& dtype,
                 std::string const& out_dtype, bool a_k_major, bool b_k_major, std::string const& scale,
                 int sm_count, std::optional<std::string> config, bool fast_accum, int groups) {
  auto [mod, r] = describe("explain", arch, m, n, k, dtype, out_dtype, a_k_major, b_k_major, scale, sm_count,
                           config, fast_accum);
  r.groups = groups;  // grouped_mm: m rows over `groups` experts (the op's Request, grouped.cpp)
  if (config) check_config_accum("explain", c10::string_view(*config), fast_accum);
  Choice c = explain_kernel("explain", *mod->table, r);
  KernelTable const& t = *mod->table;
  py::dict d;
  d["sm_count"] = r.sm_count;
  d["cost_model_measured"] = t.cost.measured;
  d["tuned"] = c.tuned;
  if (!c.entry) {
    // weight_only_mm takes its reference where no kernel fits, on Hopper (dispatch.cpp); elsewhere
    // it refuses, as every other op does without a kernel.
    bool const reference = r.scale == ScaleMode::Block32 && r.a != DType::E4M3 && t.sm_major == 9;
    std::string const arch_name = t.arch;
    std::string const why = t.count ? "none of the " + std::to_string(t.count) + " built " + arch_name +
                                          " kernel variants fits (the reasons below)"
                                    : "this build holds no " + arch_name + " kernel (PGEMM_KERNELS)";
    c.log.insert(c.log.begin(), "no kernel: " + why +
                                    (reference ? "; weight_only_mm runs its exact reference (the weight dequantized "
                                                 "exactly, fp32 sums, rounded once)"
                                               : "; on an " + arch_name + " GPU the op refuses this problem, and "
                                                 "CPU tensors run its reference"));
    d["config"] = reference ? "reference" : "none";
    for (char const* key : {"tma_store", "copy_a", "copy_b", "pad_d", "pad_m", "swap_ab", "fast_accum"}) d[key] = false;
    d["estimate_us"] = 0.0;
    d["log"] = c.log;
    return d;
  }
  d["config"] = c.entry->config;
  d["tma_store"] = c.entry->tma_store;
  d["copy_a"] = c.copy_a;
  d["copy_b"] = c.copy_b;
  d["pad_d"] = c.pad_d;
  d["log"] = c.log;
  d["pad_m"] = c.pad_m;
  d["estimate_us"] = estimate(r, *c.entry, t.cost, c.pad_m).us;
  d["swap_ab"] = c.entry->swap_ab;
  d["fast_accum"] = c.entry->fast_accum;
  return d;
}

}  // namespace
}  // namespace persistent_gemm

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace persistent_gemm;
  m.doc() = "persistent_gemm core: op schemas, CPU references, CUDA dispatch, scheduler parity";
  m.attr("REGISTRY_ABI") = kRegistryAbiVersion;
  m.def("register_arch", [](py::capsule cap) {
    TORCH_CHECK(std::string(cap.name()) == host::kArchCapsule, msg("register_arch: not an arch export capsule"));
    auto const* ex = static_cast<host::ArchExport const*>(cap.get_pointer());
    register_arch({ex->table, ex->schedules});
  });
  m.def("catalogue_names", [] {
    std::vector<std::string> names;
    for (auto const& row : host::catalogue())
      if (row.in_catalogue) names.emplace_back(row.name);
    return names;
  });
  m.def("parity_probe_names", [] {
    std::vector<std::string> names;
    for (auto const& row : host::catalogue())
      if (!row.in_catalogue) names.emplace_back(row.name);
    return names;
  });
  m.def("built_kernels", [] {
    py::list out;
    for (auto const& mod : registered_arches())
      for (int i = 0; i < mod.table->count; ++i) {
        auto const& e = mod.table->entries[i];
        py::dict d;
        d["arch"] = mod.table->arch;
        d["config"] = e.config;
        d["family"] = e.family;
        d["a_k_major"] = e.a_k_major;
        d["b_k_major"] = e.b_k_major;
        d["d_dtype"] = int(e.d_dtype);
        d["scale_mode"] = int(e.scale_mode);
        d["tma_store"] = e.tma_store;
        d["fast_accum"] = e.fast_accum;
        d["swap_ab"] = e.swap_ab;
        d["fused_bias"] = e.fused_bias;
        d["route"] = e.route == MxRoute::Bf16 ? "bf16" : e.route == MxRoute::Fold ? "fold" : "promote";
        out.append(d);
      }
    return out;
  });
  m.def("arch_info", [] {
    py::dict out;
    for (auto const& mod : registered_arches()) {
      auto const& t = *mod.table;
      py::dict d;
      d["sm"] = py::make_tuple(t.sm_major, t.sm_minor);
      d["validated_on_hardware"] = t.validated_on_hardware;
      d["reference_sm_count"] = t.reference_sm_count;
      d["self_checked"] = self_check::guarded(mod);
      py::dict c;
      auto const& k = t.cost;
      c["clock_ghz"] = k.clock_ghz, c["flops_per_clk_16bit"] = k.flops_per_clk_16bit, c["mma_eff_max"] = k.mma_eff_max;
      c["stage_overhead_clk"] = k.stage_overhead_clk, c["sm_load_bytes_per_us"] = k.sm_load_bytes_per_us;
      c["dram_bytes_per_us"] = k.dram_bytes_per_us, c["l2_bytes_per_us"] = k.l2_bytes_per_us;
      c["launch_us"] = k.launch_us, c["mx_scales_in_alu"] = k.mx_scales_in_alu, c["measured"] = k.measured;
      d["cost"] = c;
      out[t.arch] = d;
    }
    return out;
  });
  m.def("self_check_results", [] {
    py::list out;
    for (auto const& r : self_check::results()) out.append(py::make_tuple(r.config, r.passed, r.report));
    return out;
  }, "kernels self-checked in this process: (config, passed, failure report)");
  m.def("self_check_run", [](std::string const& config, int device) {
    self_check::Verdict const v = self_check::check_in_process("persistent_gemm.selfcheck", config, device);
    return py::make_tuple(v.passed, v.report);
  }, "the self-check of one built config in this process: (passed, failure report)");
  m.def("set_self_check_runner", [](py::object fn) {
    // Kept for the life of the process (never destroyed: no Python call after interpreter exit).
    static py::object* held = nullptr;
    if (fn.is_none()) {
      self_check::set_runner(nullptr);
      return;
    }
    if (held == nullptr) held = new py::object();
    *held = fn;
    self_check::set_runner([](std::string const& arch, std::string const& config, int device) {
      py::gil_scoped_acquire gil;
      auto const t = (*held)(arch, config, device).cast<py::tuple>();
      return self_check::Verdict{config, t[0].cast<bool>(), t[1].cast<std::string>()};
    });
  }, "fn(arch, config, device) -> (passed, report): the out-of-process self-check; None: in-process");
  m.def("self_check_shapes", [](std::string const& config) {
    py::list out;
    for (auto const& mod : registered_arches())
      for (int i = 0; i < mod.table->count; ++i) {
        KernelEntry const& e = mod.table->entries[i];
        if (config != e.config) continue;
        for (auto const& s : self_check::check_shapes(e)) out.append(py::make_tuple(s.m, s.n, s.k, s.max_workers));
        return out;
      }
    throw py::value_error("self_check_shapes: no built kernel '" + config + "'");
  }, "the problems the self-check runs for a built config: (M, N, K, max_workers), the op's orientation");
  m.def("registered_arches", [] {
    std::vector<std::string> a;
    for (auto const& mod : registered_arches()) a.emplace_back(mod.table->arch);
    return a;
  });
  m.def("explain", &explain, py::arg("arch"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("dtype"),
        py::arg("out_dtype"), py::arg("a_k_major") = true, py::arg("b_k_major") = true,
        py::arg("scale") = "none", py::arg("sm_count") = 0, py::arg("config") = py::none(),
        py::arg("fast_accum") = false, py::arg("groups") = 0);
  m.def("set_tuned", [](std::string const& arch, int64_t m, int64_t n, int64_t k, std::string const& dtype,
                        std::string const& out_dtype, bool a_k_major, bool b_k_major, std::string const& scale,
                        bool fast_accum, int sm_count, std::string const& config) {
    auto const [mod, r] = describe("tune", arch, m, n, k, dtype, out_dtype, a_k_major, b_k_major, scale, sm_count,
                                   std::nullopt, fast_accum);
    set_tuned(mod->table->arch, r, config);
  }, "persistent_gemm.tune: the config the dispatcher takes for this problem (empty: forget it)",
        py::arg("arch"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("dtype"), py::arg("out_dtype"),
        py::arg("a_k_major"), py::arg("b_k_major"), py::arg("scale"), py::arg("fast_accum"), py::arg("sm_count"), py::arg("config"));
  m.def("clear_tuned", &clear_tuned);
  m.def("registry_generation", &registry_generation);
  m.def("set_poison_outputs", &set_poison_outputs,
        "tests: NaN-fill every kernel output buffer before the launch, so unwritten tiles show");
  m.def("schedule_order", &schedule_order, py::arg("config"), py::arg("m"), py::arg("n"),
        py::arg("l") = 1, py::arg("workers"), py::arg("k_tiles") = 1);
  m.def("device_schedule", &device_schedule, py::arg("config"), py::arg("m"), py::arg("n"),
        py::arg("l") = 1, py::arg("workers"), py::arg("device") = 0, py::arg("k_tiles") = 1);
}
