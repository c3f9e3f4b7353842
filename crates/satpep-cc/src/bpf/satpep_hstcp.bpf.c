// SPDX-License-Identifier: GPL-2.0-or-later
// satpep-about: HighSpeed (RFC 3649): Reno below 38 segments, faster growth, gentler decrease above
/*
 * satpep_hstcp: HighSpeed TCP (RFC 3649, Floyd) as a BPF congestion control.
 *
 * Below 38 segments it is Reno. Above, the window grows by a(w) segments per RTT and a loss
 * takes b(w) of it, with a(w) rising and b(w) falling (from 0.5 to 0.1) as the window grows,
 * so a single flow can fill a fast, long path at realistic loss rates. The table below is
 * computed from RFC 3649's formulas (Low_Window 38, High_Window 83000, High_P 1e-7,
 * High_Decrease 0.1): entry i holds the largest window with a(w) = i + 1, and b(w) there,
 * scaled by 256. Growth counts acknowledged segments.
 */
#include "satpep_tcp.h"

char _license[] SEC("license") = "GPL";

#define HS_ENTRIES 73

/* Window bounds, segments. (Global, not const: see hybla_growth.h on const tables.) */
u32 hs_cwnd[HS_ENTRIES] = {
	38, 110, 206, 325, 464, 622, 798, 993,
	1206, 1437, 1686, 1952, 2237, 2540, 2860, 3200,
	3557, 3934, 4329, 4744, 5179, 5634, 6109, 6605,
	7122, 7661, 8223, 8807, 9415, 10046, 10702, 11384,
	12091, 12825, 13587, 14377, 15196, 16046, 16927, 17840,
	18787, 19769, 20787, 21843, 22938, 24074, 25252, 26475,
	27745, 29064, 30434, 31858, 33340, 34881, 36487, 38161,
	39906, 41729, 43635, 45629, 47719, 49913, 52220, 54649,
	57215, 59931, 62814, 65887, 69173, 72707, 76529, 80694,
	85277
};

/* b(w) x 256 for each entry. */
u32 hs_md[HS_ENTRIES] = {
	128, 114, 105, 99, 95, 91, 87, 85,
	82, 80, 77, 76, 74, 72, 70, 69,
	68, 66, 65, 64, 63, 61, 60, 59,
	58, 57, 56, 55, 55, 54, 53, 52,
	51, 50, 50, 49, 48, 47, 47, 46,
	45, 45, 44, 43, 43, 42, 41, 41,
	40, 40, 39, 38, 38, 37, 37, 36,
	35, 35, 34, 34, 33, 32, 32, 31,
	31, 30, 29, 29, 28, 27, 27, 26,
	25
};

/* The table entry for a window: the first whose bound is at least cwnd (binary search;
 * 2^7 > HS_ENTRIES). */
static __always_inline u32 hs_index(u32 cwnd)
{
	u32 lo = 0, hi = HS_ENTRIES - 1, mid;
	int k;

	for (k = 0; k < 7; k++) {
		if (lo >= hi)
			break;
		mid = (lo + hi) / 2;
		if (mid >= HS_ENTRIES)
			break;
		if (cwnd <= hs_cwnd[mid])
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo < HS_ENTRIES ? lo : HS_ENTRIES - 1;
}

SEC("struct_ops")
void BPF_PROG(hs_cong_avoid, struct sock *sk, u32 ack, u32 acked)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u32 cwnd, cnt;

	if (!tcp_is_cwnd_limited(sk))
		return;
	if (tcp_in_slow_start(tp)) {
		tcp_slow_start(tp, acked);
		return;
	}
	cwnd = tp->snd_cwnd;
	if (cwnd >= tp->snd_cwnd_clamp || !cwnd)
		return;
	/* cwnd += a(w) / cwnd per acknowledged segment, a(w) = entry + 1. */
	cnt = tp->snd_cwnd_cnt + (hs_index(cwnd) + 1) * max(acked, 1U);
	if (cnt >= cwnd) {
		tp->snd_cwnd = cwnd + cnt / cwnd;
		cnt %= cwnd;
	}
	tp->snd_cwnd_cnt = cnt;
}

SEC("struct_ops")
u32 BPF_PROG(hs_ssthresh, struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u32 cwnd = tp->snd_cwnd, i = hs_index(cwnd);

	/* Loses b(w) of the window. */
	if (i >= HS_ENTRIES)
		return max(cwnd >> 1, 2U);
	return max(cwnd - (u32)(((u64)cwnd * hs_md[i]) >> 8), 2U);
}

SEC("struct_ops")
u32 BPF_PROG(hs_undo_cwnd, struct sock *sk)
{
	return tcp_reno_undo_cwnd(sk);
}

SEC(".struct_ops.link")
struct tcp_congestion_ops satpep_hstcp = {
	.cong_avoid = (void *)hs_cong_avoid,
	.ssthresh = (void *)hs_ssthresh,
	.undo_cwnd = (void *)hs_undo_cwnd,
	.name = "satpep_hstcp",
};
