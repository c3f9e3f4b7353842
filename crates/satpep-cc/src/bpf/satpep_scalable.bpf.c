// SPDX-License-Identifier: GPL-2.0-or-later
// satpep-about: Scalable: +1 % of cwnd per RTT, -1/8 on loss
/*
 * satpep_scalable: Scalable TCP (Kelly 2003) as a BPF congestion control.
 *
 * Multiplicative increase in avoidance: cwnd grows by 1 segment per 100 acknowledged
 * (1 % per RTT, as soon as cwnd is above 100), and a loss takes an eighth of it, so the time
 * to recover from a loss does not grow with the window.
 */
#include "satpep_tcp.h"

char _license[] SEC("license") = "GPL";

#define SCALABLE_AI_CNT 100U

SEC("struct_ops")
void BPF_PROG(scalable_cong_avoid, struct sock *sk, u32 ack, u32 acked)
{
	struct tcp_sock *tp = tcp_sk(sk);

	if (!tcp_is_cwnd_limited(sk))
		return;
	if (tcp_in_slow_start(tp)) {
		acked = tcp_slow_start(tp, acked);
		if (!acked)
			return;
	}
	tcp_cong_avoid_ai(tp, min(tp->snd_cwnd, SCALABLE_AI_CNT), acked);
}

SEC("struct_ops")
u32 BPF_PROG(scalable_ssthresh, struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk(sk);

	return max(tp->snd_cwnd - (tp->snd_cwnd >> 3), 2U);
}

SEC("struct_ops")
u32 BPF_PROG(scalable_undo_cwnd, struct sock *sk)
{
	return tcp_reno_undo_cwnd(sk);
}

SEC(".struct_ops.link")
struct tcp_congestion_ops satpep_scalable = {
	.cong_avoid = (void *)scalable_cong_avoid,
	.ssthresh = (void *)scalable_ssthresh,
	.undo_cwnd = (void *)scalable_undo_cwnd,
	.name = "satpep_scalable",
};
