// SPDX-License-Identifier: GPL-2.0-or-later
// satpep-about: Vegas: keeps 2-4 segments queued at the bottleneck, from RTT growth
/*
 * satpep_vegas: TCP Vegas (Brakmo & Peterson 1995) as a BPF congestion control; the delay-
 * based control SCPS-TP used.
 *
 * Once per RTT it compares the expected rate (cwnd / baseRTT) with the actual one
 * (cwnd / RTT): diff = cwnd x (RTT - baseRTT) / baseRTT is the number of segments this flow
 * keeps queued. Below alpha (2) the window grows by one, above beta (4) it shrinks by one, so
 * the flow keeps 2 to 4 segments in the bottleneck queue and causes no losses of its own. In
 * slow start it stops doubling once diff exceeds gamma (1). RTT is the smallest sample of the
 * last RTT (delayed ACKs only lengthen samples); baseRTT the smallest ever. As in the
 * kernel's tcp_vegas.c, with fewer than three samples in an RTT it falls back to Reno.
 */
#include "satpep_tcp.h"

char _license[] SEC("license") = "GPL";

#define VEGAS_ALPHA 2U
#define VEGAS_BETA 4U
#define VEGAS_GAMMA 1U

struct vegas {
	u32 beg_snd_nxt;  /* right edge of the window being measured */
	u32 cnt_rtt;      /* RTT samples in it */
	u32 min_rtt;      /* smallest of them, us */
	u32 base_rtt;     /* smallest ever, us */
	bool enabled;
};

static __always_inline bool after(u32 a, u32 b)
{
	return (s32)(b - a) < 0;
}

static __always_inline void vegas_enable(struct sock *sk)
{
	struct vegas *v = inet_csk_ca(sk);

	v->enabled = true;
	v->beg_snd_nxt = tcp_sk(sk)->snd_nxt;
	v->cnt_rtt = 0;
	v->min_rtt = 0x7fffffff;
}

SEC("struct_ops")
void BPF_PROG(vegas_init, struct sock *sk)
{
	struct vegas *v = inet_csk_ca(sk);

	v->base_rtt = 0x7fffffff;
	vegas_enable(sk);
}

SEC("struct_ops")
void BPF_PROG(vegas_pkts_acked, struct sock *sk, const struct ack_sample *sample)
{
	struct vegas *v = inet_csk_ca(sk);
	u32 rtt;

	if (sample->rtt_us < 0)
		return;
	/* Never zero: the divisions below need it. */
	rtt = (u32)sample->rtt_us + 1;
	v->base_rtt = min(v->base_rtt, rtt);
	v->min_rtt = min(v->min_rtt, rtt);
	v->cnt_rtt++;
}

SEC("struct_ops")
void BPF_PROG(vegas_set_state, struct sock *sk, u8 new_state)
{
	struct vegas *v = inet_csk_ca(sk);

	if (new_state == TCP_CA_Open)
		vegas_enable(sk);
	else
		v->enabled = false;
}

SEC("struct_ops")
void BPF_PROG(vegas_cwnd_event, struct sock *sk, int event)
{
	if (event == CA_EVENT_CWND_RESTART || event == CA_EVENT_TX_START)
		vegas_enable(sk);
}

SEC("struct_ops")
void BPF_PROG(vegas_cong_avoid, struct sock *sk, u32 ack, u32 acked)
{
	struct vegas *v = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);
	u32 cwnd, rtt, diff;
	u64 target;

	if (!v->enabled) {
		tcp_reno_cong_avoid(sk, ack, acked);
		return;
	}
	if (!after(ack, v->beg_snd_nxt)) {
		/* Within the RTT being measured: only slow start acts per ACK. */
		if (tcp_in_slow_start(tp))
			tcp_slow_start(tp, acked);
		return;
	}
	v->beg_snd_nxt = tp->snd_nxt;
	if (v->cnt_rtt <= 2) {
		tcp_reno_cong_avoid(sk, ack, acked);
	} else {
		cwnd = tp->snd_cwnd;
		rtt = v->min_rtt;
		target = (u64)cwnd * v->base_rtt / rtt;
		diff = (u32)((u64)cwnd * (rtt - v->base_rtt) / v->base_rtt);
		if (diff > VEGAS_GAMMA && tcp_in_slow_start(tp)) {
			/* Queue building in slow start: go to the rate the path gives. */
			cwnd = min(cwnd, (u32)target + 1);
			tp->snd_ssthresh = min(tp->snd_ssthresh, cwnd - 1);
		} else if (tcp_in_slow_start(tp)) {
			tcp_slow_start(tp, acked);
			cwnd = tp->snd_cwnd;
		} else if (diff > VEGAS_BETA) {
			cwnd--;
			tp->snd_ssthresh = min(tp->snd_ssthresh, cwnd - 1);
		} else if (diff < VEGAS_ALPHA) {
			cwnd++;
		}
		cwnd = max(cwnd, 2U);
		tp->snd_cwnd = min(cwnd, tp->snd_cwnd_clamp);
		/* As tcp_current_ssthresh() in the Open state. */
		tp->snd_ssthresh = max(tp->snd_ssthresh, (tp->snd_cwnd >> 1) + (tp->snd_cwnd >> 2));
	}
	v->cnt_rtt = 0;
	v->min_rtt = 0x7fffffff;
}

SEC("struct_ops")
u32 BPF_PROG(vegas_ssthresh, struct sock *sk)
{
	return tcp_reno_ssthresh(sk);
}

SEC("struct_ops")
u32 BPF_PROG(vegas_undo_cwnd, struct sock *sk)
{
	return tcp_reno_undo_cwnd(sk);
}

SEC(".struct_ops.link")
struct tcp_congestion_ops satpep_vegas = {
	.init = (void *)vegas_init,
	.pkts_acked = (void *)vegas_pkts_acked,
	.set_state = (void *)vegas_set_state,
	.cwnd_event = (void *)vegas_cwnd_event,
	.cong_avoid = (void *)vegas_cong_avoid,
	.ssthresh = (void *)vegas_ssthresh,
	.undo_cwnd = (void *)vegas_undo_cwnd,
	.name = "satpep_vegas",
};
