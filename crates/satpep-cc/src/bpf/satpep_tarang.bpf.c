// SPDX-License-Identifier: GPL-2.0-or-later
// satpep-about: Tarang: Hybla growth; loss reaction from bandwidth estimate vs capacity
/*
 * satpep_tarang: Tarang (Vanzara 2017, ch. 3) as a BPF congestion control. It was never
 * released; this follows the thesis's Algorithms 4-6.
 *
 * Growth and pacing are Hybla's (hybla_growth.h). The reaction to a loss comes from what the
 * connection was delivering (BWE, Westwood+'s estimate, bw_estimate.h) against the channel
 * capacity CC:
 *   pipe = (CC - BWE) x RTTmin / MSS   if BWE < CC / 2 (Algorithm 4, residual capacity)
 *          BWE x RTTmin / MSS          otherwise       (minimum pipe capacity)
 *   ssthresh = max(pipe, 0.75 x packets in flight)
 * After three duplicate ACKs cwnd = ssthresh (Algorithm 4); after a timeout cwnd = rho
 * (Algorithm 5). A random link loss leaves BWE near the rate in use, so the window stays near
 * the bandwidth-delay product instead of halving.
 *
 * Linux, unlike the ns-2 of the thesis, shrinks the window through fast recovery itself
 * (proportional rate reduction) unless the congestion control takes over with cong_control,
 * and at a loss rate of 1e-6 per bit on a 600 ms path a connection is in recovery most of the
 * time. So Tarang takes over with cong_control: at the start of recovery it sets cwnd to the
 * value above (instead of PRR driving it towards ssthresh), and it keeps growing as Hybla in
 * avoidance through recovery too, since most losses it sees are the link's. It sets the pacing
 * rate itself (a window per RTT, x2 in slow start, x1.2 after).
 *
 * CC: the thesis measures it with CapProbe (packet-pair dispersion). Here it is the
 * configured capacity when one is given at load time (satpep cc load --capacity), otherwise
 * the larger of the packet-pair rate measured on the initial window's ACKs (hybla_growth.h)
 * and the highest BWE seen. A capacity estimate that does not come from the flow's own
 * throughput matters: with only the highest BWE, a flow held small by early losses never
 * learns that the path is faster.
 */
#include "hybla_growth.h"
#include "bw_estimate.h"

char _license[] SEC("license") = "GPL";

/* Reference RTT, microseconds. */
const volatile u32 rtt0_us = 25000;
/* Channel capacity, kbit/s; 0: estimate it. */
const volatile u32 capacity_kbps = 0;

struct tarang {
	struct hybla_growth h;
	struct bw_estimate w;
	u32 cc_max;  /* highest BWE seen, bytes/ms */
	bool apply;  /* recovery began: set cwnd to ssthresh at the next ACK */
};

/* The thesis's new ssthresh (and cwnd, after fast recovery). */
static __always_inline u32 tarang_pipe(struct sock *sk, struct tarang *ca)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u32 bwe = ca->w.bw_est;
	/* kbit/s to bytes/ms is /8. */
	u32 cc = capacity_kbps ? capacity_kbps / 8 : max(max(ca->cc_max, ca->h.pp_rate), bwe);
	u32 pipe, floor;

	if (!ca->w.rtt_min_us)
		ca->w.rtt_min_us = tcp_min_rtt(tp) == ~0U ? 0 : tcp_min_rtt(tp);
	/* No estimate at all yet (a loss in the first RTTs): Reno. */
	if (!cc || !ca->w.rtt_min_us)
		return tcp_reno_ssthresh(sk);
	if (bwe < cc / 2)
		pipe = bwe_pipe(sk, &ca->w, cc - bwe);
	else
		pipe = bwe_pipe(sk, &ca->w, bwe);
	floor = (u32)(((u64)tcp_packets_in_flight(tp) * 3) >> 2);
	return max(max(pipe, floor), 2U);
}

SEC("struct_ops")
void BPF_PROG(tarang_init, struct sock *sk)
{
	struct tarang *ca = inet_csk_ca(sk);

	hybla_growth_init(sk, &ca->h, rtt0_us);
	bwe_init(sk, &ca->w);
	ca->cc_max = 0;
	ca->apply = false;
}

SEC("struct_ops")
void BPF_PROG(tarang_pkts_acked, struct sock *sk, const struct ack_sample *sample)
{
	struct tarang *ca = inet_csk_ca(sk);

	bwe_rtt_sample(&ca->w, sample);
}

SEC("struct_ops")
void BPF_PROG(tarang_ack, struct sock *sk, u32 flags)
{
	struct tarang *ca = inet_csk_ca(sk);

	bwe_ack(sk, &ca->w, flags);
	ca->cc_max = max(ca->cc_max, ca->w.bw_est);
}

SEC("struct_ops")
void BPF_PROG(tarang_set_state, struct sock *sk, u8 new_state)
{
	struct tarang *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	/* Hybla's growth in every state but Loss, where slow start restarts from rho. */
	ca->h.enabled = new_state != TCP_CA_Loss;
	/* Algorithm 5: after a timeout, restart from rho segments. */
	if (new_state == TCP_CA_Loss)
		tp->snd_cwnd = max(tp->snd_cwnd, min(hybla_rho(&ca->h), tp->snd_ssthresh));
}

SEC("struct_ops")
void BPF_PROG(tarang_event, struct sock *sk, int event)
{
	struct tarang *ca = inet_csk_ca(sk);
	if (event == CA_EVENT_LOSS)
		ca->w.reset_rtt_min = true;
}

SEC("struct_ops")
u32 BPF_PROG(tarang_ssthresh, struct sock *sk)
{
	struct tarang *ca = inet_csk_ca(sk);

	ca->apply = true;
	return tarang_pipe(sk, ca);
}

SEC("struct_ops")
void BPF_PROG(tarang_cong_avoid, struct sock *sk, u32 ack, u32 acked)
{
	struct tarang *ca = inet_csk_ca(sk);

	hybla_grow(sk, &ca->h, ack, acked, rtt0_us);
}

SEC("struct_ops")
void BPF_PROG(tarang_cong_control, struct sock *sk, u32 ack, int flag, const struct rate_sample *rs)
{
	struct tarang *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);
	u8 state = ca_state(sk);

	hybla_estimate_ssthresh(sk, &ca->h);
	if (ca->apply && (state == TCP_CA_Recovery || state == TCP_CA_CWR)) {
		/* Algorithm 4: cwnd = the new ssthresh. */
		tp->snd_cwnd = max(min(tp->snd_ssthresh, tp->snd_cwnd_clamp), 2U);
		ca->apply = false;
	} else if (state != TCP_CA_Recovery && state != TCP_CA_CWR) {
		ca->apply = false;
	}
	if (rs->acked_sacked > 0)
		hybla_grow(sk, &ca->h, ack, rs->acked_sacked, rtt0_us);
	set_pacing_rate(sk);
}

SEC("struct_ops")
u32 BPF_PROG(tarang_undo_cwnd, struct sock *sk)
{
	return tcp_reno_undo_cwnd(sk);
}

SEC(".struct_ops.link")
struct tcp_congestion_ops satpep_tarang = {
	.init = (void *)tarang_init,
	.pkts_acked = (void *)tarang_pkts_acked,
	.in_ack_event = (void *)tarang_ack,
	.set_state = (void *)tarang_set_state,
	.cwnd_event = (void *)tarang_event,
	.ssthresh = (void *)tarang_ssthresh,
	.cong_avoid = (void *)tarang_cong_avoid,
	.cong_control = (void *)tarang_cong_control,
	.undo_cwnd = (void *)tarang_undo_cwnd,
	.name = "satpep_tarang",
};
