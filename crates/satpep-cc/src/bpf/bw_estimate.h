/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * Westwood+'s bandwidth estimate (Mascolo et al.), shared by satpep_westwood and
 * satpep_tarang: bytes acknowledged are counted over windows of at least one RTT (and at
 * least 50 ms), and each window's rate goes through two 7/8 low-pass filters. Duplicate and
 * cumulative ACKs are counted as the kernel's tcp_westwood.c does (one MSS per duplicate ACK,
 * taken back from the next cumulative ACK), so out-of-order delivery does not inflate it.
 * Time is tcp_mstamp (microseconds) rather than jiffies, so short windows are exact.
 */
#ifndef SATPEP_BW_ESTIMATE_H
#define SATPEP_BW_ESTIMATE_H

#include "satpep_tcp.h"

#define BWE_WINDOW_MIN_US 50000

struct bw_estimate {
	u32 bw_ns_est;     /* first filter stage, bytes/ms */
	u32 bw_est;        /* second stage, bytes/ms: the estimate */
	u32 win_start_us;  /* start of the current window (low 32 bits of tcp_mstamp) */
	u32 bk;            /* bytes acknowledged in the window */
	u32 snd_una;       /* snd_una at the previous ACK */
	u32 cumul_ack;
	u32 accounted;     /* bytes counted for duplicate ACKs, not yet covered */
	u32 rtt_us;        /* latest RTT sample */
	u32 rtt_min_us;    /* smallest RTT sample */
	bool first_ack;
	bool reset_rtt_min;
};

static __always_inline void bwe_init(struct sock *sk, struct bw_estimate *w)
{
	struct tcp_sock *tp = tcp_sk(sk);

	w->bw_ns_est = 0;
	w->bw_est = 0;
	w->bk = 0;
	w->accounted = 0;
	w->cumul_ack = 0;
	w->snd_una = tp->snd_una;
	w->rtt_us = 0;
	w->rtt_min_us = 0;
	w->win_start_us = (u32)tp->tcp_mstamp;
	w->first_ack = true;
	w->reset_rtt_min = true;
}

static __always_inline void bwe_filter(struct bw_estimate *w, u32 delta_us)
{
	/* bytes per millisecond: fits 32 bits up to 34 Tbit/s. */
	u32 sample = (u32)((u64)w->bk * 1000 / delta_us);

	if (w->bw_ns_est == 0 && w->bw_est == 0) {
		w->bw_ns_est = sample;
		w->bw_est = sample;
	} else {
		w->bw_ns_est = (7 * (u64)w->bw_ns_est + sample) >> 3;
		w->bw_est = (7 * (u64)w->bw_est + w->bw_ns_est) >> 3;
	}
}

static __always_inline void bwe_update_window(struct sock *sk, struct bw_estimate *w)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u32 now = (u32)tp->tcp_mstamp;
	u32 delta = now - w->win_start_us;

	if (w->first_ack) {
		w->snd_una = tp->snd_una;
		w->first_ack = false;
	}
	if (w->rtt_us && delta > max(w->rtt_us, (u32)BWE_WINDOW_MIN_US)) {
		bwe_filter(w, delta);
		w->bk = 0;
		w->win_start_us = now;
	}
}

static __always_inline void bwe_update_rtt_min(struct bw_estimate *w)
{
	if (w->reset_rtt_min) {
		w->rtt_min_us = w->rtt_us;
		w->reset_rtt_min = false;
	} else if (w->rtt_us) {
		w->rtt_min_us = w->rtt_min_us ? min(w->rtt_min_us, w->rtt_us) : w->rtt_us;
	}
}

/* Bytes newly acknowledged by this (slow-path) ACK, accounting for duplicate ACKs. */
static __always_inline u32 bwe_acked_count(struct sock *sk, struct bw_estimate *w)
{
	struct tcp_sock *tp = tcp_sk(sk);

	w->cumul_ack = tp->snd_una - w->snd_una;
	if (!w->cumul_ack) {
		/* A duplicate ACK: one segment left the network. */
		w->accounted += tp->mss_cache;
		w->cumul_ack = tp->mss_cache;
	}
	if (w->cumul_ack > tp->mss_cache) {
		if (w->accounted >= w->cumul_ack) {
			w->accounted -= w->cumul_ack;
			w->cumul_ack = tp->mss_cache;
		} else {
			w->cumul_ack -= w->accounted;
			w->accounted = 0;
		}
	}
	w->snd_una = tp->snd_una;
	return w->cumul_ack;
}

/* in_ack_event: count what this ACK acknowledged. */
static __always_inline void bwe_ack(struct sock *sk, struct bw_estimate *w, u32 flags)
{
	struct tcp_sock *tp = tcp_sk(sk);

	bwe_update_window(sk, w);
	if (flags & CA_ACK_SLOWPATH) {
		w->bk += bwe_acked_count(sk, w);
	} else {
		w->bk += tp->snd_una - w->snd_una;
		w->snd_una = tp->snd_una;
	}
	bwe_update_rtt_min(w);
}

/* pkts_acked: the RTT sample. */
static __always_inline void bwe_rtt_sample(struct bw_estimate *w, const struct ack_sample *s)
{
	if (s->rtt_us > 0)
		w->rtt_us = (u32)s->rtt_us;
}

/* Estimate x min RTT, in segments, at least 2 (Westwood's BW x RTTmin). */
static __always_inline u32 bwe_pipe(const struct sock *sk, const struct bw_estimate *w, u32 bytes_per_ms)
{
	const struct tcp_sock *tp = tcp_sk(sk);
	u64 segs = (u64)bytes_per_ms * w->rtt_min_us / 1000 / (tp->mss_cache ? tp->mss_cache : 1460);

	return (u32)max(min(segs, 0x7fffffffULL), 2ULL);
}

#endif
