// SPDX-License-Identifier: Apache-2.0
// The BLAS the runner's GEMMs go through (OpenBLAS): a guard against its
// run-time CPU detection falling back to pre-AVX2 kernels.
#pragma once

namespace kvc_runner {

// The OPENBLAS_CORETYPE this process should run with, or nullptr when
// OpenBLAS's own choice stands: OpenBLAS builds with DYNAMIC_ARCH pick their
// kernels from the CPU's family and model, and a release that does not know a
// (new or virtual) CPU falls back to its oldest x86-64 kernels ("Prescott",
// SSE3), which run the forward pass's GEMMs about 2x slower. Where the core
// OpenBLAS chose is one without AVX2 but the CPU and OS support AVX2 and FMA,
// this names the core of the CPU's features: "SkylakeX" (AVX-512 F, BW, DQ,
// VL) or "Haswell" (AVX2, FMA). nullptr when OPENBLAS_CORETYPE is already set
// (the user's choice is kept) or the chosen core is a current one.
const char *blas_core_override();

// The name of the core whose kernels OpenBLAS runs ("SkylakeX", "Haswell",
// "Prescott", ...: openblas_get_corename()), for reports.
const char *blas_core_name();

// main()'s first call, before any thread starts: when blas_core_override()
// names a core, sets OPENBLAS_CORETYPE to it and executes the program again
// (OpenBLAS reads the variable once, when it is loaded), with the same
// arguments and environment. Returns (doing nothing) when no override is
// needed, when KVCACHE_BLAS_KEEP_CORE is set, or when the program cannot be
// executed again (the run goes on with OpenBLAS's choice).
void ensure_blas_core(char **argv);

}  // namespace kvc_runner
