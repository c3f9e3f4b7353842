/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The few types and helpers the model needs, from the host it is compiled for: in a BPF
 * object they come from satpep_tcp.h (included first), in userspace from <stdint.h>. The
 * model itself uses integers only: BPF has no floating point.
 */
#ifndef SAT_TYPES_H
#define SAT_TYPES_H

#ifdef __bpf__
#ifndef SATPEP_TCP_H
#error "a BPF program includes satpep_tcp.h before the model"
#endif
/* Inlined into the program that includes the model: the verifier sees one program. */
#define SAT_FN static __always_inline
/* Verified once on its own, not on every path through its callers (loops that would
 * otherwise multiply the paths the verifier walks). */
#define SAT_GLOBAL __attribute__((noinline))
/* The model's larger steps, verified each on its own: inlined into one program, their
 * branches multiplied past the verifier's million instructions. Their pointer arguments may
 * be NULL as far as the verifier knows: each checks (SAT_ARGS). The verifier takes only
 * global functions that return a scalar: they return 0. */
#define SAT_STEP __attribute__((noinline)) int
#define SAT_ARGS(...) do { if (!(__VA_ARGS__)) return 0; } while (0)
#else
#include <stdint.h>
#include <stdbool.h>
typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;
typedef int32_t s32;
typedef int64_t s64;
#define SAT_FN static inline
#define SAT_GLOBAL static
#define SAT_STEP static int
#define SAT_ARGS(...) do { } while (0)
#define USEC_PER_MSEC 1000ULL
#define USEC_PER_SEC 1000000ULL
#define min(a, b) ((a) < (b) ? (a) : (b))
#define max(a, b) ((a) > (b) ? (a) : (b))
#endif

/* Fixed-step loops: unrolled for the verifier, which then walks each step once. */
#ifdef __clang__
#define SAT_UNROLL _Pragma("unroll")
#else
#define SAT_UNROLL
#endif

#endif
