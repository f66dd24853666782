// The blocked layout of MX e8m0 scales, its one C++ home (python/persistent_gemm/scale_layout.py
// is its Python twin). Plain scales are (rows, blocks) codes, one per 1x32 block of K. Blocked,
// they are 512-byte atoms of 128 rows x 4 blocks, stored band by band ((band, atom column) at
// atom band * atoms_k + column); inside an atom, rows interleave in four groups of 32: row r,
// block c at byte (r % 32) * 16 + (r / 32) * 4 + c. It is what SM100's block-scaled tensor cores
// read (CUTLASS's Sm1xxBlockScaledConfig), what cuBLAS and torchao's to_blocked write, and what
// the SM90 MX kernels bulk-copy one atom (one 128-row band of one 128-deep K-tile) at a time.
//
// Plain arithmetic for host and device code (no CUTLASS): the kernels, the relayout kernel
// (host/scale_to_blocked.cuh), the ops' extents and references (csrc/), and the probes that check
// it against CUTLASS (tests/device/sm100_mapping_probe.cu).
#pragma once

#include <cstdint>

#ifndef PGEMM_HD
#if defined(__CUDACC__)
#define PGEMM_HD __host__ __device__ __forceinline__
#else
#define PGEMM_HD inline
#endif
#endif

namespace persistent_gemm::mx_blocked {

constexpr int kAtomRows = 128;
constexpr int kAtomBlocks = 4;
constexpr int kAtomBytes = kAtomRows * kAtomBlocks;  // 512
constexpr int kRowGroup = 32;                        // rows per interleaved group of an atom
constexpr int kRowGroups = kAtomRows / kRowGroup;    // 4

// Atom columns of a row band: `blocks` scales per row in whole atoms.
PGEMM_HD constexpr int64_t atoms_k(int64_t blocks) { return (blocks + kAtomBlocks - 1) / kAtomBlocks; }
// The padded extents a blocked tensor covers: rows to whole atoms, blocks to whole atom columns.
PGEMM_HD constexpr int64_t padded_rows(int64_t rows) { return (rows + kAtomRows - 1) / kAtomRows * kAtomRows; }
PGEMM_HD constexpr int64_t padded_blocks(int64_t blocks) { return atoms_k(blocks) * kAtomBlocks; }
PGEMM_HD constexpr int64_t bytes(int64_t rows, int64_t blocks) { return padded_rows(rows) * padded_blocks(blocks); }

// Byte of (row, block 0) inside its atom; block c of the same atom is c bytes further.
PGEMM_HD constexpr int atom_offset(int row_in_atom) {
  return (row_in_atom % kRowGroup) * 16 + (row_in_atom / kRowGroup) * 4;
}

// Byte of (row, block) in a blocked tensor of `blocks` scales per row.
PGEMM_HD constexpr int64_t sf_byte(int64_t row, int64_t block, int64_t blocks) {
  return ((row / kAtomRows) * atoms_k(blocks) + block / kAtomBlocks) * kAtomBytes +
         atom_offset(int(row % kAtomRows)) + block % kAtomBlocks;
}

// The inverse for one 4-byte word (the four blocks of one row in one atom): its row, and its
// atom's first block. The relayout kernel writes word by word.
PGEMM_HD void sf_word_origin(int64_t word, int64_t blocks, int64_t& row, int64_t& block0) {
  int64_t const atom = word / (kAtomBytes / 4), in_atom = word % (kAtomBytes / 4);
  row = (atom / atoms_k(blocks)) * kAtomRows + in_atom / kRowGroups + (in_atom % kRowGroups) * kRowGroup;
  block0 = (atom % atoms_k(blocks)) * kAtomBlocks;
}

// Atom holding K-tile `k_tile` (one atom column: 4 blocks, 128 K-elements) of the 128-row band
// that starts at row0: what one CTA copies per stage.
PGEMM_HD constexpr int64_t sf_tile_atom(int64_t row0, int32_t k_tile, int64_t blocks) {
  return (row0 / kAtomRows) * atoms_k(blocks) + k_tile;
}

}  // namespace persistent_gemm::mx_blocked
