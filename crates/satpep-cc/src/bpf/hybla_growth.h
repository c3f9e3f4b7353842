/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * Hybla's window growth, shared by satpep_hybla and satpep_tarang (which grows as Hybla does
 * and differs in its reaction to loss).
 *
 * With rho = RTT / RTT0 (at least 1), slow start adds 2^rho - 1 segments per acknowledged
 * segment and congestion avoidance rho^2 / cwnd. rho comes from the smallest smoothed RTT
 * seen. rho is kept <<3 (three fraction bits) and increments <<7, as in the kernel's Hybla.
 * Unlike it, growth counts acknowledged segments rather than ACKs (delayed ACKs and GRO do
 * not slow it down).
 *
 * Slow start on a long path would multiply the window by 2^rho per RTT (2^24 at 600 ms): one
 * RTT in, the whole receive window would leave at once. As the Hybla paper recommends, the
 * initial ssthresh is therefore estimated (Hoe's packet-pair method): the initial window
 * leaves back to back, so its ACKs come back spaced by the bottleneck; segments acknowledged
 * between the first and the last of them, over the time between, is the bottleneck rate, and
 * ssthresh = that rate x min RTT, the path's bandwidth-delay product. Until the estimate is
 * in (the first window acknowledged), slow start is Reno's; then Hybla's up to ssthresh.
 */
#ifndef SATPEP_HYBLA_GROWTH_H
#define SATPEP_HYBLA_GROWTH_H

#include "satpep_tcp.h"

struct hybla_growth {
	u32 rho_3ls;     /* rho << 3, at least 8 */
	u32 rho2_7ls;    /* rho^2 << 7 */
	u32 minrtt_us;   /* smallest srtt seen (<<3, as srtt_us) */
	u32 cents;       /* slow start: fraction of a segment accumulated, /128 */
	u32 ca_acc;      /* avoidance: rho^2 x acked accumulated, /(128 cwnd) */
	u32 iw;          /* initial window: when this much is delivered, estimate ssthresh */
	u32 first_ack_us;  /* time of the first ACK of the initial window (low 32 bits) */
	u32 first_delivered; /* segments delivered at that ACK */
	u32 pp_rate;     /* the bottleneck rate the estimate found, bytes/ms (0: none) */
	u32 pp_segs;     /* segments acknowledged since the first ACK of the window */
	u32 pp_spread;   /* over this many microseconds */
	u16 acks;        /* ACKs seen in the initial window */
	bool tried;      /* the initial window is over: estimated or given up */
	bool enabled;    /* Hybla rules apply only in the Open state */
	bool estimated;  /* initial ssthresh estimated */
};

/* 2^(i/8) << 7 for i = 0..7: the fractional part of 2^rho. (A switch, not a const table:
 * clang puts small const arrays in a mergeable section older libbpf cannot describe.) */
static __always_inline u32 hybla_fraction(u32 i)
{
	switch (i & 7) {
	case 0: return 128;
	case 1: return 139;
	case 2: return 152;
	case 3: return 165;
	case 4: return 181;
	case 5: return 197;
	case 6: return 215;
	default: return 234;
	}
}

static __always_inline void hybla_recalc(struct sock *sk, struct hybla_growth *ca, u32 rtt0_us)
{
	struct tcp_sock *tp = tcp_sk(sk);
	/* srtt_us is the RTT << 3, so this is rho << 3 already. */
	u64 r = (u64)tp->srtt_us / (rtt0_us ? rtt0_us : 25000);

	ca->rho_3ls = max((u32)min(r, 8ULL * 64), 8U);
	ca->rho2_7ls = (ca->rho_3ls * ca->rho_3ls) << 1;
}

/* rho, rounded down, at least 1. */
static __always_inline u32 hybla_rho(const struct hybla_growth *ca)
{
	return max(ca->rho_3ls >> 3, 1U);
}

static __always_inline void hybla_growth_init(struct sock *sk, struct hybla_growth *ca, u32 rtt0_us)
{
	struct tcp_sock *tp = tcp_sk(sk);

	ca->cents = 0;
	ca->ca_acc = 0;
	ca->enabled = true;
	ca->estimated = false;
	ca->first_ack_us = 0;
	ca->first_delivered = 0;
	ca->pp_rate = 0;
	ca->pp_segs = 0;
	ca->pp_spread = 0;
	ca->acks = 0;
	ca->tried = false;
	ca->iw = tp->snd_cwnd;
	ca->rho_3ls = 8;
	ca->rho2_7ls = 128;
	ca->minrtt_us = tp->srtt_us ? tp->srtt_us : ~0U;
	if (tp->srtt_us)
		hybla_recalc(sk, ca, rtt0_us);
	enable_pacing(sk);
}

/* Hoe's initial ssthresh from the ACK spacing of the initial window. The window's ACKs
 * arrive within a fraction of an RTT; the estimate spans from the first of them to the one
 * that completes the window (or the last before the next flight, a quarter of min RTT later).
 * It is trusted only if at least three ACKs were seen and they were not bunched together
 * (at least 20 us per segment: GRO or an ACK-compressing path would otherwise report an
 * absurd rate). Without a trusted estimate, slow start stays Reno's (doubling per RTT) and ends
 * at the first loss, as standard TCP. */
static __always_inline void hybla_estimate_ssthresh(struct sock *sk, struct hybla_growth *ca)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u32 now = (u32)tp->tcp_mstamp;
	u32 min_rtt = tcp_min_rtt(tp);
	u32 segs, spread;

	if (ca->tried)
		return;
	if (!ca->first_ack_us) {
		ca->first_ack_us = now ? now : 1;
		ca->first_delivered = tp->delivered;
		ca->acks = 1;
		return;
	}
	if (min_rtt == ~0U || !tp->mss_cache)
		return;
	segs = tp->delivered - ca->first_delivered;
	spread = now - ca->first_ack_us;
	if (spread <= min_rtt / 4) {
		/* Still the initial window: keep the latest pair. */
		if (segs > ca->pp_segs) {
			ca->acks++;
			ca->pp_segs = segs;
			ca->pp_spread = spread;
		}
		if (segs + 1 < ca->iw)
			return;
	}
	ca->tried = true;
	if (ca->acks < 3 || !ca->pp_segs || ca->pp_spread < 20 * ca->pp_segs)
		return;
	ca->pp_rate = (u32)min((u64)ca->pp_segs * tp->mss_cache * 1000 / ca->pp_spread, 0xffffffffULL);
	ca->estimated = true;
	if (tp->snd_ssthresh < TCP_INFINITE_SSTHRESH)
		return;
	/* rate x min RTT, in segments. */
	u64 bdp = (u64)ca->pp_segs * min_rtt / ca->pp_spread;
	tp->snd_ssthresh = (u32)max(min(bdp, 0x7ffffffULL), (u64)ca->iw);
}

/* Whether the window, not the application, limits sending. The kernel's test lets slow start
 * grow cwnd only up to twice what was in flight, which caps Hybla's 2^rho per RTT at 2 (the
 * kernel's own tcp_hybla.c is capped so); here slow start may reach 2^rho times it. */
static __always_inline bool hybla_cwnd_limited(const struct sock *sk, const struct hybla_growth *ca)
{
	const struct tcp_sock *tp = tcp_sk(sk);

	if (tcp_in_slow_start(tp) && ca->enabled && ca->estimated)
		return (u64)tp->snd_cwnd < ((u64)tp->max_packets_out << min(hybla_rho(ca), 16U));
	return tcp_is_cwnd_limited(sk);
}

/* One congestion-avoidance step (cong_avoid): Hybla's growth, or Reno outside the Open state. */
static __always_inline void hybla_grow(struct sock *sk, struct hybla_growth *ca, u32 ack, u32 acked, u32 rtt0_us)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u32 increment, cwnd;
	bool slow_start;

	if (tp->srtt_us && tp->srtt_us < ca->minrtt_us) {
		hybla_recalc(sk, ca, rtt0_us);
		ca->minrtt_us = tp->srtt_us;
	}
	hybla_estimate_ssthresh(sk, ca);
	if (!hybla_cwnd_limited(sk, ca))
		return;
	if (!ca->enabled) {
		tcp_reno_cong_avoid(sk, ack, acked);
		return;
	}
	if (!acked)
		acked = 1;
	if (acked > 64)
		acked = 64;
	cwnd = tp->snd_cwnd;
	slow_start = cwnd < tp->snd_ssthresh;
	if (slow_start && !ca->estimated) {
		/* No trusted estimate (yet): Reno's slow start. */
		tcp_slow_start(tp, acked);
		return;
	}
	if (!slow_start) {
		/* rho^2 / cwnd per acknowledged segment, kept exact: the kernel's integer
		 * rho^2 / cwnd (in 1/128) rounds to nothing once cwnd > 2 rho^2. */
		u64 acc = (u64)ca->ca_acc + (u64)ca->rho2_7ls * acked;
		u64 unit = 128ULL * (cwnd ? cwnd : 1);
		u32 n = 0;

		if (acc >= unit) {
			n = (u32)min(acc / unit, 0x7fffULL);
			acc -= (u64)n * unit;
		}
		ca->ca_acc = (u32)min(acc, 0xffffffffULL);
		tp->snd_cwnd = min(cwnd + n, tp->snd_cwnd_clamp);
		return;
	}
	/* 2^rho - 1 per segment, <<7: 2^int(rho) * 2^frac(rho) - 1. */
	increment = ((1U << min(ca->rho_3ls >> 3, 16U)) * hybla_fraction(ca->rho_3ls)) - 128;
	/* Per acknowledged segment; 64-bit so a large rho cannot overflow. */
	u64 total = (u64)increment * acked + ca->cents;
	u64 add = total >> 7;

	ca->cents = total & 127;
	if (add > 0x7fff)
		add = 0x7fff;
	cwnd = min(cwnd + (u32)add, tp->snd_ssthresh);
	tp->snd_cwnd = min(cwnd, tp->snd_cwnd_clamp);
}

#endif
