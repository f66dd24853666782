// The kernel registry: the arch modules (built and JIT) that registered their tables, merged per
// arch, and the lookup of a device's module. The ops reach it through dispatch.h.
#include "dispatch.h"

#include <atomic>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "device_info.h"
#include "text.h"
#include "persistent_gemm/host/catalogue.h"

namespace persistent_gemm {
namespace {

// A built arch module plus the JIT modules of the same arch, merged into one table (the
// dispatcher and explain see every kernel of an arch at once). Never freed: a thread may still
// be choosing from an older merge.
struct MergedTable {
  std::vector<KernelEntry> entries;
  std::vector<host::ScheduleEntry> schedules;
  KernelTable table;
};
// The registered modules and their merges, with the mutex that guards them: one function-local
// static, built on first use whichever translation unit registers first.
struct Registry {
  std::mutex mutex;
  std::deque<ArchModule> modules;  // a deque: addresses handed out by arch_for_device stay valid
  std::deque<MergedTable> merged;
};
Registry& registry() {
  static Registry r;
  return r;
}
std::atomic<uint64_t> g_registry_generation{0};

bool same_entry(KernelEntry const& a, KernelEntry const& b) {
  return std::string(a.config) == b.config && a.a_dtype == b.a_dtype && a.b_dtype == b.b_dtype &&
         a.d_dtype == b.d_dtype && a.a_k_major == b.a_k_major && a.b_k_major == b.b_k_major &&
         a.scale_mode == b.scale_mode && a.tma_store == b.tma_store;
}

// "9.0a (sm90a), 10.0a (sm100a)": archs.py's table, as codegen wrote it into _C.
std::string known_archs_text() {
  std::string out;
  for (auto const& a : host::known_archs()) out += msg(out.empty() ? " " : ", ", a.torch_arch, " (", a.name, ")");
  return out;
}

}  // namespace

ArchModule const& require_arch(char const* op, at::Tensor const& a) {
  ArchModule const* mod = arch_for_device(a.get_device());
  if (mod) return *mod;
  auto const* prop = &device_info(a.get_device());
  std::string built;
  for (auto const& m : registered_arches()) built += std::string(" ") + m.table->arch;
  TORCH_CHECK(false, msg(op, ": no CUDA kernels are built for this GPU (", prop->name, ", sm_",
              prop->major, prop->minor, "); this build has kernels for:",
              built.empty() ? std::string(" none") : built,
              ". Rebuild with TORCH_CUDA_ARCH_LIST naming the GPU's arch (persistent_gemm builds:",
              known_archs_text(), ")."));
}

void register_arch(ArchModule module) {
  TORCH_CHECK(module.table && module.table->abi_version == kRegistryAbiVersion, msg("persistent_gemm: kernel module ABI ", module.table ? module.table->abi_version : -1,
              " does not match _C's ", kRegistryAbiVersion, "; rebuild the extension"));
  std::lock_guard<std::mutex> lock(registry().mutex);
  for (auto& m : registry().modules) {
    if (std::string(m.table->arch) != module.table->arch) continue;
    TORCH_CHECK(m.table->sm_major == module.table->sm_major && m.table->sm_minor == module.table->sm_minor,
                msg("persistent_gemm: a second ", module.table->arch, " module disagrees on the compute capability"));
    MergedTable g;
    g.entries.assign(m.table->entries, m.table->entries + m.table->count);
    for (int i = 0; i < module.table->count; ++i) {
      KernelEntry const& e = module.table->entries[i];
      bool dup = false;
      for (auto const& have : g.entries) dup = dup || same_entry(have, e);
      if (!dup) g.entries.push_back(e);
    }
    if (int(g.entries.size()) == m.table->count) return;  // nothing new: idempotent
    for (auto const* s = m.schedules; s && s->config; ++s) g.schedules.push_back(*s);
    for (auto const* s = module.schedules; s && s->config; ++s) g.schedules.push_back(*s);
    g.schedules.push_back({nullptr, nullptr});
    g.table = *m.table;
    auto& kept = registry().merged.emplace_back(std::move(g));
    kept.table.entries = kept.entries.data();
    kept.table.count = int32_t(kept.entries.size());
    // Readers take the pointers without the lock: publish them whole.
    std::atomic_ref<KernelTable const*>(m.table).store(&kept.table, std::memory_order_release);
    std::atomic_ref<host::ScheduleEntry const*>(m.schedules).store(kept.schedules.data(), std::memory_order_release);
    g_registry_generation.fetch_add(1);
    return;
  }
  registry().modules.push_back(module);
  g_registry_generation.fetch_add(1);
}

uint64_t registry_generation() { return g_registry_generation.load(); }

std::deque<ArchModule> const& registered_arches() { return registry().modules; }

ArchModule const* arch_for_device(int device) {
  auto const* prop = &device_info(device);
  // sm_90a / sm_100a code is arch-specific: it runs only on exactly that compute capability.
  for (auto const& m : registry().modules)
    if (m.table->sm_major == prop->major && m.table->sm_minor == prop->minor) return &m;
  return nullptr;
}

}  // namespace persistent_gemm
