/* HOT marks the few loops that dominate CPU time: on x86-64 they are also
 * built for AVX2 and the best version is picked at load time, so one
 * binary runs everywhere and still uses 256-bit vectors where it can. */
#ifndef LLM_CPU_HOT_H
#define LLM_CPU_HOT_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif

#endif
