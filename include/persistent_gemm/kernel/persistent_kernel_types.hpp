// The names both persistent kernels (Sm90GemmPersistent, Sm100GemmPersistent) give their template
// arguments, and the mainloop types every part of them reads (builders read them as Kernel::...).
// A macro rather than a base class: the kernels' bodies (and the SM90 roles' out-of-line
// operator()) find these by unqualified lookup, which a dependent base would not allow.
#pragma once

#include "cute/layout.hpp"

#define PGEMM_PERSISTENT_KERNEL_TYPES(Mainloop, Epilogue, Schedule, StyleTag)                \
  using CollectiveMainloop = Mainloop;                                                       \
  using CollectiveEpilogue = Epilogue;                                                       \
  using ScheduleTag = Schedule;                                                              \
  using Style = StyleTag;                                                                    \
  using ProblemShape = cute::Shape<int, int, int, int>; /* (M, N, K, L); L: 1, E grouped */ \
  using TileShape = typename CollectiveMainloop::TileShape;                                  \
  using TiledMma = typename CollectiveMainloop::TiledMma
