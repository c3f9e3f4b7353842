// SPDX-License-Identifier: GPL-2.0-or-later
// satpep-about: Hybla: grows per RTT as a connection with RTT0 (25 ms) would; paced
/*
 * satpep_hybla: TCP Hybla (Caini & Firrincieli 2004) as a BPF congestion control.
 *
 * A long-RTT connection grows, in time, as fast as one with the reference RTT0 would: see
 * hybla_growth.h for the growth rules, the estimated initial ssthresh and how this differs
 * from the kernel's tcp_hybla.c. The kernel paces the socket itself (no fq needed). RTT0 is
 * set at load time (satpep cc load --rtt0), default 25 ms. Loss reaction is Reno's
 * (ssthresh = cwnd / 2), as in Hybla.
 */
#include "hybla_growth.h"

char _license[] SEC("license") = "GPL";

/* Reference RTT, microseconds; set before loading. */
const volatile u32 rtt0_us = 25000;

SEC("struct_ops")
void BPF_PROG(hybla_init, struct sock *sk)
{
	hybla_growth_init(sk, inet_csk_ca(sk), rtt0_us);
}

SEC("struct_ops")
void BPF_PROG(hybla_set_state, struct sock *sk, u8 new_state)
{
	struct hybla_growth *ca = inet_csk_ca(sk);

	ca->enabled = new_state == TCP_CA_Open;
}

SEC("struct_ops")
void BPF_PROG(hybla_cong_avoid, struct sock *sk, u32 ack, u32 acked)
{
	hybla_grow(sk, inet_csk_ca(sk), ack, acked, rtt0_us);
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
