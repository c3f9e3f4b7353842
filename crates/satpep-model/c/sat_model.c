// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * The model, compiled for userspace: the entry points the tunnel's controller calls through
 * FFI (crates/satpep-model/src/lib.rs). The BPF controller includes sat_model.h instead.
 */
#include "sat_model.h"

void satm_init(struct sat_model *m, struct sat_window *w, const struct sat_ack *a)
{
	sat_model_init(m, w, a);
}

void satm_resume(struct sat_model *m, struct sat_window *w, const struct sat_ack *a,
		 const struct sat_path *p)
{
	sat_model_resume(m, w, a, p);
}

void satm_follow_share(struct sat_model *m, struct sat_window *w, const struct sat_ack *a,
		       u32 share, u8 freed)
{
	sat_model_follow_share(m, w, a, share, freed);
}

void satm_on_ack(struct sat_model *m, struct sat_window *w, const struct sat_ack *a)
{
	sat_model_on_ack(m, w, a);
}

void satm_on_timeout(struct sat_model *m)
{
	sat_model_on_timeout(m);
}

u32 satm_send_windows(const struct sat_model *m, u32 cwnd, u32 mss, bool lost)
{
	return sat_model_send_windows(m, cwnd, mss, lost);
}

u64 satm_pacing_rate(const struct sat_model *m, const struct sat_window *w,
		     const struct sat_ack *a)
{
	return sat_model_pacing_rate(m, w, a);
}

bool satm_path(const struct sat_model *m, struct sat_path *p)
{
	return sat_model_path(m, p);
}

/* The struct's size, so the Rust side can check its copy of the layout. */
u32 satm_sizeof(void)
{
	return sizeof(struct sat_model);
}

/* What the host shows of the model (status pages, metrics, tests). */
struct sat_readings {
	u32 bw;        /* model rate, bytes/s */
	u32 base_us;   /* base RTT (0: none yet) */
	u32 queue_us;  /* queue the latest RTTs show */
	u32 noise_ppm; /* the channel's loss rate as drains measured it */
	u32 buffer_us; /* a shallow buffer's depth (0: none found) */
	u32 burst;     /* the channel's mean burst of losses, segments (1: independent) */
	u8 phase;
	u8 drains;     /* drains behind noise_ppm (0: not measured yet) */
};

void satm_read(const struct sat_model *m, struct sat_readings *r)
{
	r->bw = m->f.bw;
	r->base_us = base_us(m);
	r->queue_us = queue_us(m);
	r->noise_ppm = m->noise.clean_ppm;
	r->buffer_us = m->noise.buffer_us;
	r->burst = noise_burst(m);
	r->phase = m->phase;
	r->drains = m->noise.drains;
}
