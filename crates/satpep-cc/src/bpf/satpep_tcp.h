/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * What satpep's congestion controls need from the kernel: the types they touch, declared with
 * only the fields they use, plus small helpers. Every struct is marked preserve_access_index,
 * so libbpf relocates each field access against the running kernel's BTF (CO-RE): the layout
 * written here does not matter, only the field names and types do, and no vmlinux.h is needed.
 */
#ifndef SATPEP_TCP_H
#define SATPEP_TCP_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed int __s32;
typedef signed long long __s64;
typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __u64 u64;
typedef __s32 s32;
typedef __s64 s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
#define true 1
#define false 0
#define NULL ((void *)0)

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#pragma clang attribute push (__attribute__((preserve_access_index)), apply_to = record)

struct in6_addr {
	union {
		__u8 u6_addr8[16];
		__be32 u6_addr32[4];
	} in6_u;
};

struct sock_common {
	__be32 skc_daddr;
	unsigned short skc_family;
	unsigned char skc_state;
	struct in6_addr skc_v6_daddr;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
	u32 sk_pacing_status;
	unsigned long sk_pacing_rate;
	unsigned long sk_max_pacing_rate;
};

struct inet_sock {
	struct sock sk;
};

struct inet_connection_sock {
	struct inet_sock icsk_inet;
	__u8 icsk_ca_state:5;
	u64 icsk_ca_priv[13];
};

struct minmax_sample {
	u32 t;
	u32 v;
};

struct minmax {
	struct minmax_sample s[3];
};

struct tcp_sock {
	struct inet_connection_sock inet_conn;
	u32 snd_cwnd;
	u32 snd_cwnd_cnt;
	u32 snd_cwnd_clamp;
	u32 snd_ssthresh;
	u32 prior_cwnd;
	u32 mss_cache;
	u32 srtt_us;
	u32 packets_out;
	u32 sacked_out;
	u32 lost_out;
	u32 retrans_out;
	u32 lost;
	u32 max_packets_out;
	u8 is_cwnd_limited:1;
	u32 snd_una;
	u32 snd_nxt;
	u32 delivered;
	u64 tcp_mstamp;
	u64 delivered_mstamp;
	u64 bytes_acked;
	struct minmax rtt_min;
	u32 rate_delivered;
	u32 rate_interval_us;
};

struct ack_sample {
	u32 pkts_acked;
	s32 rtt_us;
	u32 in_flight;
};

struct rate_sample {
	u64 prior_mstamp;
	u32 prior_delivered;
	s32 delivered;
	long interval_us;
	long rtt_us;
	int losses;
	u32 acked_sacked;
	u32 prior_in_flight;
	bool is_app_limited;
};

struct tcp_congestion_ops {
	u32 (*ssthresh)(struct sock *sk);
	void (*cong_avoid)(struct sock *sk, u32 ack, u32 acked);
	void (*set_state)(struct sock *sk, u8 new_state);
	void (*cwnd_event)(struct sock *sk, int ev);
	void (*in_ack_event)(struct sock *sk, u32 flags);
	void (*pkts_acked)(struct sock *sk, const struct ack_sample *sample);
	u32 (*min_tso_segs)(struct sock *sk);
	void (*cong_control)(struct sock *sk, u32 ack, int flag, const struct rate_sample *rs);
	u32 (*undo_cwnd)(struct sock *sk);
	u32 (*sndbuf_expand)(struct sock *sk);
	void (*init)(struct sock *sk);
	void (*release)(struct sock *sk);
	char name[16];
	u32 flags;
};

/* A BPF iterator's context over a socket storage map (iter/bpf_sk_storage_map). */
struct seq_file;

struct bpf_iter_meta {
	struct seq_file *seq;
	u64 session_id;
	u64 seq_num;
};

struct bpf_map;

struct bpf_iter__bpf_sk_storage_map {
	struct bpf_iter_meta *meta;
	struct bpf_map *map;
	struct sock *sk;
	void *value;
};

#pragma clang attribute pop

/* enum tcp_ca_event */
#define CA_EVENT_TX_START 0
#define CA_EVENT_CWND_RESTART 1
#define CA_EVENT_COMPLETE_CWR 2
#define CA_EVENT_LOSS 3

/* enum tcp_ca_state */
#define TCP_CA_Open 0
#define TCP_CA_Disorder 1
#define TCP_CA_CWR 2
#define TCP_CA_Recovery 3
#define TCP_CA_Loss 4

/* enum tcp_ca_ack_event_flags */
#define CA_ACK_SLOWPATH (1 << 0)
#define CA_ACK_WIN_UPDATE (1 << 1)
#define CA_ACK_ECE (1 << 2)

#define SK_PACING_NEEDED 1
#define AF_INET 2
#define AF_INET6 10
/* enum bpf_map_type, map flags and helper flags (uapi linux/bpf.h) */
#define BPF_MAP_TYPE_LRU_HASH 9
#define BPF_MAP_TYPE_SK_STORAGE 24
#define BPF_F_NO_PREALLOC 1
#define BPF_SK_STORAGE_GET_F_CREATE 1
#define BPF_ANY 0
#define TCP_INFINITE_SSTHRESH 0x7fffffff
#define USEC_PER_MSEC 1000ULL
#define USEC_PER_SEC 1000000ULL

#define min(a, b) ((a) < (b) ? (a) : (b))
#define max(a, b) ((a) > (b) ? (a) : (b))

/* The kernel's own Reno pieces, callable from BPF congestion controls (kfuncs). */
extern u32 tcp_slow_start(struct tcp_sock *tp, u32 acked) __ksym;
extern void tcp_cong_avoid_ai(struct tcp_sock *tp, u32 w, u32 acked) __ksym;
extern u32 tcp_reno_ssthresh(struct sock *sk) __ksym;
extern void tcp_reno_cong_avoid(struct sock *sk, u32 ack, u32 acked) __ksym;
extern u32 tcp_reno_undo_cwnd(struct sock *sk) __ksym;

static __always_inline struct tcp_sock *tcp_sk(const struct sock *sk)
{
	return (struct tcp_sock *)sk;
}

static __always_inline struct inet_connection_sock *inet_csk(const struct sock *sk)
{
	return (struct inet_connection_sock *)sk;
}

/* The congestion control's private per-socket state (icsk_ca_priv, 104 bytes). */
static __always_inline void *inet_csk_ca(const struct sock *sk)
{
	return (void *)inet_csk(sk)->icsk_ca_priv;
}

static __always_inline u8 ca_state(const struct sock *sk)
{
	return BPF_CORE_READ_BITFIELD(inet_csk(sk), icsk_ca_state);
}

static __always_inline bool tcp_in_slow_start(const struct tcp_sock *tp)
{
	return tp->snd_cwnd < tp->snd_ssthresh;
}

/* As the kernel's tcp_is_cwnd_limited(): grow only when the window, not the application,
 * limits sending; in slow start, while cwnd is below twice what was in flight. */
static __always_inline bool tcp_is_cwnd_limited(const struct sock *sk)
{
	const struct tcp_sock *tp = tcp_sk(sk);

	if (tcp_in_slow_start(tp))
		return tp->snd_cwnd < 2 * tp->max_packets_out;
	return BPF_CORE_READ_BITFIELD(tp, is_cwnd_limited);
}

static __always_inline u32 tcp_packets_in_flight(const struct tcp_sock *tp)
{
	return tp->packets_out - (tp->sacked_out + tp->lost_out) + tp->retrans_out;
}

/* Minimum RTT the kernel tracks (windowed min filter), microseconds; ~0U before a sample. */
static __always_inline u32 tcp_min_rtt(const struct tcp_sock *tp)
{
	return tp->rtt_min.s[0].v;
}

/* The kernel's latest delivery-rate sample (as tcpi_delivery_rate), bytes per second; 0 if
 * none yet. */
static __always_inline u64 tcp_delivery_rate(const struct tcp_sock *tp)
{
	u32 interval = tp->rate_interval_us;

	if (!interval || !tp->rate_delivered)
		return 0;
	return (u64)tp->rate_delivered * tp->mss_cache * USEC_PER_SEC / interval;
}

/* Sets the pacing rate as the kernel's tcp_update_pacing_rate() does, for congestion controls
 * that take over with cong_control: a window per smoothed RTT, times 2 while cwnd is below
 * half of ssthresh (slow start) and 1.2 after. */
static __always_inline void set_pacing_rate(struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u64 rate = (u64)tp->mss_cache * ((USEC_PER_SEC / 100) << 3);

	if (!tp->srtt_us)
		return;
	rate *= tp->snd_cwnd < tp->snd_ssthresh / 2 ? 200 : 120;
	rate *= max(tp->snd_cwnd, tp->packets_out);
	rate /= tp->srtt_us;
	sk->sk_pacing_rate = min(rate, (u64)sk->sk_max_pacing_rate);
}

/* Asks the kernel to pace this socket itself (without the fq qdisc): it then spreads each
 * window over the RTT at 2x the window rate in slow start and 1.2x in avoidance. */
static __always_inline void enable_pacing(struct sock *sk)
{
	if (sk->sk_pacing_status == 0)
		sk->sk_pacing_status = SK_PACING_NEEDED;
}

#endif
