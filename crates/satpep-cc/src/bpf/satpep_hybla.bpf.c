// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * satpep_hybla: TCP Hybla (Caini & Firrincieli 2004) as a BPF congestion control.
 *
 * Hybla makes a long-RTT connection grow as fast, in time, as one with the reference RTT0:
 * with rho = RTT / RTT0 (at least 1), slow start adds 2^rho - 1 segments per acknowledged
 * segment and congestion avoidance adds rho^2 / cwnd. rho comes from the smallest smoothed
 * RTT seen. Differences from the kernel's tcp_hybla.c, on purpose:
 *  - growth counts acknowledged segments, not ACKs, so delayed ACKs and GRO (one ACK for
 *    many segments) do not slow it down;
 *  - the kernel paces the socket itself (no fq needed): Hybla's slow-start jumps would
 *    otherwise leave in one burst;
 *  - RTT0 is set at load time (satpep cc load --hybla-rtt0), default 25 ms.
 * Loss reaction is Reno's (ssthresh = cwnd / 2), as in Hybla.
 */
#include "satpep_tcp.h"

char _license[] SEC("license") = "GPL";

/* Reference RTT, microseconds; set before loading. */
const volatile u32 rtt0_us = 25000;

/* rho is kept <<3 (three fraction bits), increments <<7, as in the kernel's Hybla. */
struct hybla {
	u32 rho_3ls;     /* rho << 3, at least 8 */
	u32 rho2_7ls;    /* rho^2 << 7 */
	u32 minrtt_us;   /* smallest srtt seen (<<3, as srtt_us) */
	u32 cents;       /* fraction of a segment accumulated, /128 */
	bool enabled;    /* Hybla rules apply only in the Open state */
};

/* 2^(i/8) << 7 for i = 0..7: the fractional part of 2^rho. (A switch, not a const table:
 * clang puts small const arrays in a mergeable section older libbpf cannot describe.) */
static __always_inline u32 fraction(u32 i)
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

static void recalc(struct sock *sk, struct hybla *ca)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u64 r = (u64)tp->srtt_us / (rtt0_us ? rtt0_us : 25000);

	/* srtt_us is the RTT << 3, so r is rho << 3 already. */
	ca->rho_3ls = max((u32)min(r, 8ULL * 64), 8U);
	ca->rho2_7ls = (ca->rho_3ls * ca->rho_3ls) << 1;
}

SEC("struct_ops")
void BPF_PROG(hybla_init, struct sock *sk)
{
	struct hybla *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	ca->cents = 0;
	ca->enabled = true;
	ca->rho_3ls = 8;
	ca->rho2_7ls = 128;
	ca->minrtt_us = tp->srtt_us ? tp->srtt_us : ~0U;
	if (tp->srtt_us)
		recalc(sk, ca);
	enable_pacing(sk);
}

SEC("struct_ops")
void BPF_PROG(hybla_set_state, struct sock *sk, u8 new_state)
{
	struct hybla *ca = inet_csk_ca(sk);

	ca->enabled = new_state == TCP_CA_Open;
}

SEC("struct_ops")
void BPF_PROG(hybla_cong_avoid, struct sock *sk, u32 ack, u32 acked)
{
	struct hybla *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);
	u32 increment, odd, rho, cwnd;
	bool slow_start;

	if (tp->srtt_us && tp->srtt_us < ca->minrtt_us) {
		recalc(sk, ca);
		ca->minrtt_us = tp->srtt_us;
	}
	if (!tcp_is_cwnd_limited(sk))
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
	if (slow_start) {
		/* 2^rho - 1 per segment, <<7: 2^int(rho) * 2^frac(rho) - 1. */
		rho = ca->rho_3ls >> 3;
		increment = ((1U << min(rho, 16U)) * fraction(ca->rho_3ls)) - 128;
	} else {
		/* rho^2 / cwnd per segment, <<7. */
		increment = ca->rho2_7ls / (cwnd ? cwnd : 1);
	}
	/* Per acknowledged segment; 64-bit so a large rho cannot overflow. */
	u64 total = (u64)increment * acked + ca->cents;
	u64 add = total >> 7;

	ca->cents = total & 127;
	if (add > 0x7fff)
		add = 0x7fff;
	cwnd += (u32)add;
	if (slow_start)
		cwnd = min(cwnd, tp->snd_ssthresh);
	tp->snd_cwnd = min(cwnd, tp->snd_cwnd_clamp);
}

SEC("struct_ops")
u32 BPF_PROG(hybla_ssthresh, struct sock *sk)
{
	return tcp_reno_ssthresh(sk);
}

SEC("struct_ops")
u32 BPF_PROG(hybla_undo_cwnd, struct sock *sk)
{
	return tcp_reno_undo_cwnd(sk);
}

SEC(".struct_ops.link")
struct tcp_congestion_ops satpep_hybla = {
	.init = (void *)hybla_init,
	.set_state = (void *)hybla_set_state,
	.cong_avoid = (void *)hybla_cong_avoid,
	.ssthresh = (void *)hybla_ssthresh,
	.undo_cwnd = (void *)hybla_undo_cwnd,
	.name = "satpep_hybla",
};
