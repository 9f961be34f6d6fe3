// SPDX-License-Identifier: Apache-2.0
// The BLAS the runner's GEMMs go through (OpenBLAS): a guard against its
// run-time CPU detection falling back to pre-AVX2 kernels.
#pragma once

namespace kvc_runner {

// Whether OpenBLAS's core `name` (openblas_get_corename(), any case) is one
// of its x86 cores with AVX2 kernels (Haswell, Zen, SkylakeX, Cooperlake,
// SapphireRapids in OpenBLAS 0.3.x).
bool blas_core_has_avx2(const char *name);

// Whether the OpenBLAS in use picks its kernels at run time (a DYNAMIC_ARCH
// build, as Debian's and Ubuntu's are; only then does OPENBLAS_CORETYPE
// choose them).
bool blas_chooses_at_run_time();

// The OPENBLAS_CORETYPE this process should run with, or nullptr when
// OpenBLAS's own choice stands: DYNAMIC_ARCH builds pick their kernels from
// the CPU's family and model, and a release that does not know a (new or
// virtual) CPU falls back to an older core (typically "Prescott", SSE3),
// which runs the forward pass's GEMMs about 2x slower. Where the core
// OpenBLAS chose has no AVX2 kernels (blas_core_has_avx2) but the CPU and
// OS support AVX2 and FMA, this names the core of the CPU's features:
// "SkylakeX" (AVX-512 F, BW, DQ, VL) or "Haswell" (AVX2, FMA). nullptr when
// OPENBLAS_CORETYPE is already set (the user's choice is kept), the build
// does not choose at run time, or the CPU is not x86-64.
const char *blas_core_override();

// The name of the core whose kernels OpenBLAS runs ("SkylakeX", "Haswell",
// "Prescott", ...: openblas_get_corename()), for reports.
const char *blas_core_name();

// main()'s first call, before the program starts threads of its own: when
// blas_core_override() names a core, sets OPENBLAS_CORETYPE to it and
// executes the program's file again (OpenBLAS reads the variable once, when
// it is loaded), with the same arguments and environment. Returns (doing
// nothing) when no override is needed, when KVCACHE_BLAS_KEEP_CORE is set
// (to anything but "" or "0"), under valgrind (which would lose the program
// run again), when the program was started through the dynamic loader, or
// when it cannot be executed again (the run goes on with OpenBLAS's choice).
void ensure_blas_core(char **argv);

}  // namespace kvc_runner
