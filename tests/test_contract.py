"""Host contract of every catalogue kernel, both archs, without a GPU (issue 25).

The ops accept any M, N, K >= 1 (K % 32 == 0 for e2m1 weights; at most the token tile for a
decode GEMV). The dispatcher then adapts the operands -- aligned K-major copies, a padded D for a
TMA store, SM100's zero-padded K -- and hands the kernel a GemmArgs. This test compiles the real
builders of the catalogue (codegen's own TUs, with can_implement thunks for entry points, so no
device code is instantiated) into a host program per arch, builds the GemmArgs the dispatcher
builds for a grid of shapes (odd N and K, M = 1, tails, N = 8191), and asserts every kernel's own
``can_implement`` accepts each one: an accepted shape that the kernel refuses at launch would
surface as a "please report" error (the SM100 kernels did this for N % 8 != 0 until issue 25).

The probe models the dispatcher's adaptation (csrc/dispatch.cpp ``launch``): leading strides
rounded up to 16 bytes (a copy), ``padded_k`` on SM100 MX, ``pad_d`` when a TMA store meets D rows
that are not whole 16-byte chunks, fake aligned pointers, the workspace the kernel asks for. The
other way round, every kernel must refuse another scale mode's arguments, and a tensorwise or
rowwise one arguments missing a scale pointer.
"""

from __future__ import annotations

import re
import subprocess
from string import Template

import pytest

from persistent_gemm import archs, build_flags, codegen
from persistent_gemm.catalogue import CATALOGUE, E2M1_DTYPES
from persistent_gemm.library import ELEMENTS, lowering
from support.host_build import build_host_program

_ENTRY = Template("bool can_${ident}(persistent_gemm::GemmArgs const& g) { return k_${ident}::Gemm::can_implement(g); }\n"
                  "size_t ws_${ident}(persistent_gemm::GemmArgs const& g) { return k_${ident}::Gemm::workspace_bytes(g); }\n")

# M (tokens), N (weight rows / output columns), K: tails, odd extents, a 1-token decode, N = 8191.
SHAPES = [(1, 8191, 4096), (7, 9, 96), (129, 127, 1000), (257, 8, 1024), (33, 1, 32), (64, 300, 992), (3, 17, 100)]

_MAIN = Template(r"""
#include <cstdio>
#include "persistent_gemm/kernel/sm100_tile_mapping.hpp"

namespace {
using persistent_gemm::GemmArgs;
struct Kernel {
  const char* name;
  bool (*can)(GemmArgs const&);
  size_t (*ws)(GemmArgs const&);
  int a_bits, b_bits, d_bytes;  // the kernel's A and B element bits (its A is the weight when swap-AB), D bytes
  bool a_k_major, b_k_major, tma_store, swap_ab, mx, plain_act_scales, sm100, e2m1, gemv, grouped;
  persistent_gemm::ScaleMode scale;
};
int64_t round16(int64_t elems, int bits) {  // elements: a row of `elems`, rounded up to 16 bytes
  int64_t const per16 = 128 / bits;
  return (elems + per16 - 1) / per16 * per16;
}
}  // namespace

using namespace persistent_gemm::gen;
int main() {
  static Kernel const kernels[] = {
${table}  };
  static long const shapes[][3] = {${shapes}};
  int refused = 0;
  for (Kernel const& e : kernels)
    for (auto const& s : shapes) {
      int64_t const M = s[0], N = s[1], K0 = s[2];
      int64_t const K = e.sm100 && e.mx ? persistent_gemm::kernel::sm100_mx::padded_k(K0, e.e2m1) : K0;
      GemmArgs g;
      g.m = int32_t(e.swap_ab ? N : M);
      g.n = int32_t(e.swap_ab ? M : N);
      g.k = int32_t(K);
      // K-major rows hold K elements (K / 2 packed e2m1 bytes); M-/N-major ones the other extent.
      auto const row = [&](int bits, bool k_major, int64_t other) -> int64_t {
        if (!k_major) return round16(other, bits);
        if (bits == 4) return round16(K / 2, 8);  // e2m1 leading strides count bytes
        return round16(K, bits);
      };
      g.a = reinterpret_cast<void const*>(uintptr_t(1) << 20);
      g.lda = row(e.a_bits, e.a_k_major, g.m);
      g.a_k_major = e.a_k_major;
      g.b = reinterpret_cast<void const*>(uintptr_t(3) << 20);
      g.ldb = row(e.b_bits, e.b_k_major, g.n);
      g.b_k_major = e.b_k_major;
      g.d = reinterpret_cast<void*>(uintptr_t(5) << 20);
      bool const pad_d = e.tma_store && (N * e.d_bytes) % 16 != 0;
      g.ldd = pad_d ? (N * e.d_bytes + 15) / 16 * 16 / e.d_bytes : N;
      g.d_pad_writable = pad_d;
      g.scale_mode = e.scale;
      if (e.scale != persistent_gemm::ScaleMode::None) {
        g.scale_a = reinterpret_cast<void const*>(uintptr_t(7) << 20);
        g.scale_b = reinterpret_cast<void const*>(uintptr_t(9) << 20);
      }
      // Weight-only MX (bf16 activations, swap-AB: the kernel's B) has no activation scales.
      if (e.mx && e.b_bits == 16) g.scale_b = nullptr;
      // The activations' plain e8m0 rows (the kernel's B scales when swap-AB, else its A's).
      if (e.plain_act_scales && e.swap_ab && g.scale_b) g.ld_scale_b = (K0 + 31) / 32;
      if (e.plain_act_scales && !e.swap_ab && g.scale_a) g.ld_scale_a = (K0 + 31) / 32;
      // Grouped (grouped_mm): 4 experts' weights a whole (N, K) apart (the MX weight's lda counts
      // bytes), their blocked scales back to back, offs on the device.
      if (e.grouped) {
        g.groups = 4;
        g.group_rows = reinterpret_cast<int32_t const*>(uintptr_t(13) << 20);
        g.group_stride_a = e.swap_ab ? g.lda * g.m : g.ldb * g.n;  // the weight: the kernel's A when swap-AB
        g.group_stride_scale_a = 512 * ((N + 127) / 128) * ((K0 / 32 + 3) / 4);
      }
      g.sm_count = e.sm100 ? 148 : 132;
      size_t const ws = e.ws(g);
      if (ws) g.workspace = reinterpret_cast<void*>(uintptr_t(11) << 20), g.workspace_bytes = ws;
      bool const ok = e.can(g);
      refused += !ok;
      std::printf("%s %ld %ld %ld %d\n", e.name, long(M), long(N), long(K0), int(ok));
      if (&s != &shapes[0]) continue;
      // And the other way: arguments for another scale mode, or without the scales this kernel
      // applies, are refused (a kernel must never read scales it was not given).
      using persistent_gemm::ScaleMode;
      GemmArgs w = g;
      w.scale_mode = e.scale == ScaleMode::None ? ScaleMode::Tensorwise : ScaleMode::None;
      std::printf("refuses %s other_scale_mode %d\n", e.name, int(!e.can(w)));
      if (e.gemv || e.grouped) {  // a grouped kernel refuses one problem's arguments, a dense GEMV a grouped problem's
        w = g, w.groups = e.grouped ? 0 : 4, w.group_rows = reinterpret_cast<int32_t const*>(uintptr_t(13) << 20);
        std::printf("refuses %s other_grouping %d\n", e.name, int(!e.can(w)));
      }
      if (e.scale == ScaleMode::Tensorwise || e.scale == ScaleMode::Rowwise) {
        w = g, w.scale_a = nullptr;
        std::printf("refuses %s no_scale_a %d\n", e.name, int(!e.can(w)));
        w = g, w.scale_b = nullptr;
        std::printf("refuses %s no_scale_b %d\n", e.name, int(!e.can(w)));
      }
    }
  std::printf("refused %d\n", refused);
  return 0;
}
""")


def _valid(cfg, m, n, k) -> bool:
    """Whether the op (and the dispatcher, for this forced config) accepts the shape at all."""
    if cfg.dtype in E2M1_DTYPES and k % 32:
        return False  # fp8_fp4_mm's and weight_only_mm's rule for packed e2m1
    if cfg.schedule.grouped and k % 32:
        return False  # grouped_mm's rule: every grouped kernel takes MX weights, in whole 1x32 blocks
    if cfg.schedule.grouped and cfg.arch == "sm100a" and cfg.dtype in E2M1_DTYPES and k % 128:
        return False  # grouped_mm runs the reference: a stack of e2m1 experts is not padded to TMA's K rule
    if cfg.kernel == "gemv":  # tokens on its n8 tiles (grouped: any, in items); whole 1x32 blocks
        return (cfg.schedule.grouped or m <= cfg.tile[1]) and k % 32 == 0
    return True


_KERNELS_PER_FILE = 12


def _probe_sources(arch: str) -> tuple[dict, list]:
    """{file name: source}: one TU per builder header (the build compiles each header's kernels
    apart too; the MX bf16 route's collective does not compile after the dense builder in one
    TU), and main.cu with the table and the shape walk."""
    configs = [c for c in CATALOGUE if c.arch == arch and codegen.variants(c)]
    tus, rows, names, decls = {}, [], [], []
    for c in configs:
        low = lowering(c.arch, c.dtype)
        for v in codegen.variants(c):
            kid = codegen.ident(f"{c.name}__{v.suffix}")
            text = codegen.kernel_tu(c, v, entry=_ENTRY)
            header = re.search(r'#include "persistent_gemm/kernel/(\w+)\.hpp"', text)[1]
            tus.setdefault(header, []).append(text)
            decls.append(f"bool can_{kid}(persistent_gemm::GemmArgs const&);\n"
                         f"size_t ws_{kid}(persistent_gemm::GemmArgs const&);\n")
            a, b = ELEMENTS[low.a].bits, ELEMENTS[low.b].bits
            if c.swap_ab:
                a, b = b, a
            mx = v.scale == "block"
            plain = mx and (c.kernel == "gemv" or c.route == "bf16" or c.schedule.grouped)
            scale = {"none": "None", "tensor": "Tensorwise", "row": "Rowwise", "block": "Block32"}[v.scale]
            rows.append(f'    {{"{c.name}__{v.suffix}", &can_{kid}, &ws_{kid}, {a}, {b}, {ELEMENTS[v.out].bits // 8}, '
                        f"{str(v.a_k_major).lower()}, {str(v.b_k_major).lower()}, {str(v.tma_store).lower()}, "
                        f"{str(c.swap_ab).lower()}, {str(mx).lower()}, {str(plain).lower()}, "
                        f"{str(arch == 'sm100a').lower()}, {str(c.dtype in E2M1_DTYPES).lower()}, "
                        f"{str(c.kernel == 'gemv').lower()}, {str(c.schedule.grouped).lower()}, "
                        f"persistent_gemm::ScaleMode::{scale}}},\n")
            names.append((c, v))
    # The TUs of one header open with the same #include and their own namespace blocks: they
    # concatenate, a few kernels a file, so build_host_program's parallel compiles stay balanced.
    files = {f"{header}_{i // _KERNELS_PER_FILE}.cu": "\n".join(texts[i:i + _KERNELS_PER_FILE])
             for header, texts in tus.items() for i in range(0, len(texts), _KERNELS_PER_FILE)}
    shapes = ", ".join(f"{{{m}, {n}, {k}}}" for m, n, k in SHAPES)
    decl = '#include "persistent_gemm/registry.h"\nnamespace persistent_gemm::gen {\n' + "".join(decls) + "}\n"
    files["main.cu"] = decl + _MAIN.substitute(table="".join(rows), shapes=shapes)
    return files, names


@pytest.mark.parametrize("arch", list(archs.ARCHS))
def test_every_kernel_accepts_what_the_dispatcher_hands_it(arch, tmp_path):
    files, kernels = _probe_sources(arch)
    assert kernels, f"no {arch} kernels in the catalogue"
    cus = []
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        cus.append(str(tmp_path / name))
    exe = build_host_program(cus, tmp_path / f"contract_{arch}", flags=build_flags.nvcc_flags(archs.ARCHS[arch].gencode),
                             timeout=1500)
    run = subprocess.run([exe], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    by_name = {f"{c.name}__{v.suffix}": c for c, v in kernels}
    seen, wrong, refusals = 0, [], 0
    for line in run.stdout.splitlines():
        refusal = re.fullmatch(r"refuses (\S+) (\w+) ([01])", line)
        if refusal:
            refusals += 1
            if refusal[3] != "1":
                wrong.append(f"{refusal[1]} accepts arguments with {refusal[2]}")
            continue
        mt = re.fullmatch(r"(\S+) (\d+) (\d+) (\d+) ([01])", line)
        if not mt:
            continue
        name, m, n, k, ok = mt[1], int(mt[2]), int(mt[3]), int(mt[4]), mt[5] == "1"
        seen += 1
        if _valid(by_name[name], m, n, k) and not ok:
            wrong.append(f"{name} refuses M={m} N={n} K={k}")
    assert seen == len(kernels) * len(SHAPES), run.stdout[-2000:]
    fp32_scaled = sum(v.scale in ("tensor", "row") for _, v in kernels)
    gemv = sum(c.kernel == "gemv" or c.schedule.grouped for c, _ in kernels)
    assert refusals == len(kernels) + 2 * fp32_scaled + gemv, run.stdout[-2000:]
    assert not wrong, "\n".join(wrong[:20])
