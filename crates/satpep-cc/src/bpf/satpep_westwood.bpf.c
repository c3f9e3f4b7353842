// SPDX-License-Identifier: GPL-2.0-or-later
// satpep-about: Westwood+: Reno growth; after a loss, window = bandwidth estimate x min RTT
/*
 * satpep_westwood: TCP Westwood+ (Mascolo, Casetti, Gerla, Sanadidi, Wang; Grieco & Mascolo)
 * as a BPF congestion control.
 *
 * Growth is Reno's. After a loss, the window is not halved blindly but set from what the
 * connection was actually delivering: ssthresh = BWE x RTTmin / MSS (the estimate is in
 * bw_estimate.h); after three duplicate ACKs cwnd = ssthresh once recovery completes, after a
 * timeout cwnd = 1 (the kernel's loss state) with that ssthresh. Random link losses, which do
 * not lower the delivery rate, therefore barely reduce the window.
 */
#include "bw_estimate.h"

char _license[] SEC("license") = "GPL";

SEC("struct_ops")
void BPF_PROG(westwood_init, struct sock *sk)
{
	bwe_init(sk, inet_csk_ca(sk));
}

SEC("struct_ops")
void BPF_PROG(westwood_pkts_acked, struct sock *sk, const struct ack_sample *sample)
{
	bwe_rtt_sample(inet_csk_ca(sk), sample);
}

SEC("struct_ops")
void BPF_PROG(westwood_ack, struct sock *sk, u32 flags)
{
	bwe_ack(sk, inet_csk_ca(sk), flags);
}

SEC("struct_ops")
void BPF_PROG(westwood_event, struct sock *sk, int event)
{
	struct bw_estimate *w = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	switch (event) {
	case CA_EVENT_COMPLETE_CWR:
		tp->snd_ssthresh = bwe_pipe(sk, w, w->bw_est);
		tp->snd_cwnd = tp->snd_ssthresh;
		break;
	case CA_EVENT_LOSS:
		tp->snd_ssthresh = bwe_pipe(sk, w, w->bw_est);
		/* The path may have changed; take a fresh minimum. */
		w->reset_rtt_min = true;
		break;
	default:
		break;
	}
}

SEC("struct_ops")
u32 BPF_PROG(westwood_ssthresh, struct sock *sk)
{
	struct bw_estimate *w = inet_csk_ca(sk);

	/* Entering recovery: BWE x RTTmin, or Reno's half while there is no estimate yet. */
	if (!w->bw_est || !w->rtt_min_us)
		return tcp_reno_ssthresh(sk);
	return bwe_pipe(sk, w, w->bw_est);
}

SEC("struct_ops")
void BPF_PROG(westwood_cong_avoid, struct sock *sk, u32 ack, u32 acked)
{
	tcp_reno_cong_avoid(sk, ack, acked);
}

SEC("struct_ops")
u32 BPF_PROG(westwood_undo_cwnd, struct sock *sk)
{
	return tcp_reno_undo_cwnd(sk);
}

SEC(".struct_ops.link")
struct tcp_congestion_ops satpep_westwood = {
	.init = (void *)westwood_init,
	.pkts_acked = (void *)westwood_pkts_acked,
	.in_ack_event = (void *)westwood_ack,
	.cwnd_event = (void *)westwood_event,
	.ssthresh = (void *)westwood_ssthresh,
	.cong_avoid = (void *)westwood_cong_avoid,
	.undo_cwnd = (void *)westwood_undo_cwnd,
	.name = "satpep_westwood",
};
