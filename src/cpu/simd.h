/* simd.h: the CPU backend's SIMD levels (simd.c): detection, the level in use, and the AVX2 / AVX-512 kernels
 * (quants_avx2.c, quants_avx512.c) that it registers into the traits table (src/core/quants.h) before it returns
 * any level. */
#ifndef KILN_CPU_SIMD_H
#define KILN_CPU_SIMD_H

#include "quants.h"

/* Best level this CPU supports, capped by the KILN_SIMD environment variable (scalar|avx2|avx512). */
kiln_simd kiln_simd_best(void);
kiln_simd kiln_simd_detect(void); /* what the CPU supports, ignoring KILN_SIMD */
const char *kiln_simd_name(kiln_simd s);
/* AMX int8 tiles usable by this process, beside AVX-512 (detected once, the tile data requested from Linux). */
bool kiln_simd_amx(void);

KILN_DECLARE_LEVEL(avx2)
KILN_DECLARE_LEVEL(avx512)

#endif
