/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * Windowed filters of the model, each the extreme of the current span and the span before
 * it (two halves of the window: the kernel's win_minmax.h keeps three samples instead,
 * quinn's min_max.rs two): cheap, no history, and a sample leaves the window between one
 * and two spans after it was taken.
 */
#ifndef SAT_WIN_MINMAX_H
#define SAT_WIN_MINMAX_H

#include "sat_types.h"

/* No sample yet. */
#define SAT_NONE 0xffffffffU

/* The lowest sample over a time window, in two halves. */
struct sat_min2 {
	u32 cur;   /* lowest sample of this half */
	u32 prev;  /* lowest sample of the half before */
	u32 stamp; /* when this half began, ms */
	u32 n;     /* samples in this half, at least (a rotation keeps it at 2 if the half
		    * before had any, counting low) */
};

SAT_FN void min2_reset(struct sat_min2 *f, u32 now_ms)
{
	f->cur = SAT_NONE;
	f->prev = SAT_NONE;
	f->stamp = now_ms;
	f->n = 0;
}

/* The lowest sample of the window, SAT_NONE if none. */
SAT_FN u32 min2_get(const struct sat_min2 *f)
{
	return min(f->cur, f->prev);
}

/* Takes `v` at `now_ms`; a half lasts `half_ms` (at least 1 ms). */
SAT_FN void min2_update(struct sat_min2 *f, u32 now_ms, u32 v, u32 half_ms)
{
	if (now_ms - f->stamp >= max(half_ms, 1U)) {
		f->prev = f->cur;
		f->cur = v;
		f->stamp = now_ms;
		f->n = f->n ? 2 : 1;
	} else {
		f->cur = min(f->cur, v);
		if (f->n < 0xffff)
			f->n++;
	}
}

/* The highest sample over a number of rounds, in two blocks. */
struct sat_max2 {
	u32 cur;    /* highest sample of this block */
	u32 prev;   /* highest of the block before */
	u32 rounds; /* rounds ended in this block */
};

SAT_FN u32 max2_get(const struct sat_max2 *f)
{
	return max(f->cur, f->prev);
}

/* Forgets every sample: the filter reads `v` until higher ones come. */
SAT_FN void max2_reset(struct sat_max2 *f, u32 v)
{
	f->cur = v;
	f->prev = v;
	f->rounds = 0;
}

SAT_FN void max2_sample(struct sat_max2 *f, u32 v)
{
	f->cur = max(f->cur, v);
}

/* A round ended; a block lasts `block` rounds. */
SAT_FN void max2_end_round(struct sat_max2 *f, u32 block)
{
	if (++f->rounds >= block) {
		f->prev = f->cur;
		f->cur = 0;
		f->rounds = 0;
	}
}

#endif
