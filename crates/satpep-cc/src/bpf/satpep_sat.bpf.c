// SPDX-License-Identifier: GPL-2.0-or-later
// satpep-about: satellite: rate x (base RTT + short slack) from measured rate and RTT; ignores random loss, drains queues, remembers each path (split's default)
/*
 * satpep_sat: split mode's satellite-leg controller. The model is satpep's one satellite
 * model (crates/satpep-model/c/sat_model.h, also the tunnel's `satellite` controller); this
 * file only hosts it in the kernel: it turns each ACK's rate sample into a `struct sat_ack`,
 * lends the model the socket's window, and sets the pacing rate the model asks for.
 *
 * The model's state (196 bytes) does not fit the 104 bytes of icsk_ca_priv: it lives in the
 * socket's BPF local storage, created at init.
 *
 * Each destination's path (the model's rate and base RTT) is remembered for five minutes in
 * an LRU map (what the kernel's tcp_metrics does for ssthresh and RTT): a new connection to
 * a destination that carried traffic recently starts at that rate, shared with the
 * connections to it still open, instead of doubling from 32 segments (the idea of
 * draft-ietf-tsvwg-careful-resume, per path).
 */
#include "satpep_tcp.h"
#include "sat_model.h"

char _license[] SEC("license") = "GPL";

/* How long a path's record stays valid. */
#define PATH_MAX_AGE_US (300ULL * USEC_PER_SEC)

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sat_model);
} sat_state SEC(".maps");

/* A destination: the address family and address (IPv4 in the first word). */
struct path_key {
	u32 family;
	u32 addr[4];
};

struct path_record {
	struct sat_path path;
	u64 stamp_us;  /* when it was measured (tcp_mstamp: the kernel's clock, any socket) */
	s32 open;      /* connections to it now */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct path_key);
	__type(value, struct path_record);
} sat_paths SEC(".maps");

static __always_inline void path_key(const struct sock *sk, struct path_key *k)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->family = sk->__sk_common.skc_family;
	if (k->family == AF_INET6) {
		k->addr[0] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[0];
		k->addr[1] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[1];
		k->addr[2] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[2];
		k->addr[3] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[3];
	} else {
		k->addr[0] = sk->__sk_common.skc_daddr;
	}
}

/* The kernel's view of this ACK, for the model. */
static __always_inline void read_ack(const struct sock *sk, const struct rate_sample *rs,
				     struct sat_ack *a)
{
	const struct tcp_sock *tp = tcp_sk(sk);

	__builtin_memset(a, 0, sizeof(*a));
	a->now_us = tp->tcp_mstamp;
	a->mss = tp->mss_cache;
	a->srtt_us = tp->srtt_us >> 3;
	a->delivered = tp->delivered;
	a->rs_delivered = -1;
	a->interval_us = -1;
	a->rtt_us = -1;
	if (rs) {
		a->prior_delivered = rs->prior_delivered;
		a->rs_delivered = rs->delivered;
		a->interval_us = rs->interval_us;
		a->rtt_us = rs->rtt_us > 0x7fffffff ? 0x7fffffff : (s32)rs->rtt_us;
		a->acked = rs->acked_sacked > 0 ? rs->acked_sacked : 0;
		a->losses = rs->losses > 0 ? rs->losses : 0;
		a->app_limited = rs->is_app_limited;
	}
	a->timeout = ca_state(sk) == TCP_CA_Loss;
	/* rs->losses came with this ACK; when the lost segments left, the kernel does not say. */
	a->losses_dated = 0;
}

static __always_inline void lend(const struct tcp_sock *tp, struct sat_window *w)
{
	w->cwnd = tp->snd_cwnd;
	w->cnt = tp->snd_cwnd_cnt;
	w->clamp = tp->snd_cwnd_clamp;
}

static __always_inline void take_back(struct sock *sk, const struct sat_window *w,
				      const struct sat_model *m, const struct sat_ack *a)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u64 rate;

	tp->snd_cwnd = w->cwnd;
	tp->snd_cwnd_cnt = w->cnt;
	rate = sat_model_pacing_rate(m, w, a);
	if (rate)
		sk->sk_pacing_rate = min(rate, (u64)sk->sk_max_pacing_rate);
}

/* The model's path reading into the destination's record. */
static __always_inline void remember(const struct sock *sk, const struct sat_model *m, u64 now)
{
	struct path_key k;
	struct path_record *r;

	path_key(sk, &k);
	r = bpf_map_lookup_elem(&sat_paths, &k);
	if (r && sat_model_path(m, &r->path))
		r->stamp_us = now;
}

SEC("struct_ops")
void BPF_PROG(sat_init, struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct sat_model *m;
	struct path_record *r, fresh = {};
	struct path_key k;
	struct sat_window w;
	struct sat_ack a;
	s32 others;

	m = bpf_sk_storage_get(&sat_state, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!m)
		return;
	read_ack(sk, 0, &a);
	lend(tp, &w);
	sat_model_init(m, &w, &a);
	path_key(sk, &k);
	r = bpf_map_lookup_elem(&sat_paths, &k);
	if (!r) {
		bpf_map_update_elem(&sat_paths, &k, &fresh, BPF_ANY);
		r = bpf_map_lookup_elem(&sat_paths, &k);
	}
	if (r) {
		/* Read, then counted: BPF's atomic add returns nothing at the ISA level this
		 * builds for; two connections opening at once may both see the same count. */
		others = r->open;
		__sync_fetch_and_add(&r->open, 1);
		if (r->path.bw && a.now_us - r->stamp_us < PATH_MAX_AGE_US) {
			struct sat_path p = r->path;

			/* The connections still open keep their shares. */
			if (others > 0)
				p.bw /= (u32)others + 1;
			sat_model_resume(m, &w, &a, &p);
		}
	}
	take_back(sk, &w, m, &a);
	enable_pacing(sk);
}

SEC("struct_ops")
void BPF_PROG(sat_release, struct sock *sk)
{
	struct sat_model *m = bpf_sk_storage_get(&sat_state, sk, 0, 0);
	struct path_record *r;
	struct path_key k;

	if (!m)
		return;
	path_key(sk, &k);
	r = bpf_map_lookup_elem(&sat_paths, &k);
	if (r) {
		if (r->open > 0)
			__sync_fetch_and_add(&r->open, -1);
		if (sat_model_path(m, &r->path))
			r->stamp_us = tcp_sk(sk)->tcp_mstamp;
	}
}

/* A split gateway sharing a carrier sets each connection's pacing ceiling to its share and
 * writes in the ceiling's four low bits how many times it freed carrier (a terminal went
 * quiet, a reload; crates/satpep-proxy/src/share.rs): the model follows a share that grew
 * with that count (sat_model_follow_share). No other ceiling is set on the proxy's sockets;
 * one that were would at most start the model once at that rate, over no queue. */
static __always_inline void follow_carrier(const struct sock *sk, struct sat_model *m,
					   struct sat_window *w, const struct sat_ack *a)
{
	u64 cap = sk->sk_max_pacing_rate;

	if (!cap || cap > 0xffffffffULL)
		return;
	sat_model_follow_share(m, w, a, (u32)cap & ~0xfU, (u8)(cap & 0xf));
}

SEC("struct_ops")
void BPF_PROG(sat_cong_control, struct sock *sk, u32 ack, int flag, const struct rate_sample *rs)
{
	struct sat_model *m = bpf_sk_storage_get(&sat_state, sk, 0, 0);
	struct sat_window w;
	struct sat_ack a;
	u8 before;

	/* No state (its allocation failed at init): the kernel's window stays as it is. */
	if (!m)
		return;
	read_ack(sk, rs, &a);
	lend(tcp_sk(sk), &w);
	before = m->phase;
	sat_model_on_ack(m, &w, &a);
	follow_carrier(sk, m, &w, &a);
	take_back(sk, &w, m, &a);
	/* A drain that emptied the queue confirmed the model: the path's record takes it. */
	if (before == SAT_DRAIN && m->phase == SAT_CRUISE)
		remember(sk, m, a.now_us);
}

SEC("struct_ops")
void BPF_PROG(sat_cwnd_event, struct sock *sk, int event)
{
	struct sat_model *m;

	if (event != CA_EVENT_LOSS)
		return;
	m = bpf_sk_storage_get(&sat_state, sk, 0, 0);
	if (m)
		sat_model_on_timeout(m);
}

/* Losses alone do not slow it down: the kernel's ssthresh stays where it is. */
SEC("struct_ops")
u32 BPF_PROG(sat_ssthresh, struct sock *sk)
{
	return tcp_sk(sk)->snd_ssthresh;
}

SEC("struct_ops")
u32 BPF_PROG(sat_undo_cwnd, struct sock *sk)
{
	return tcp_sk(sk)->snd_cwnd;
}

/* The send buffer: the model's (sat_model_send_windows), because selectively acknowledged
 * data waits in it behind each hole; the kernel only ever raises it. */
SEC("struct_ops")
u32 BPF_PROG(sat_sndbuf_expand, struct sock *sk)
{
	const struct tcp_sock *tp = tcp_sk(sk);
	struct sat_model *m = bpf_sk_storage_get(&sat_state, sk, 0, 0);

	if (!m)
		return 2;
	return sat_model_send_windows(m, tp->snd_cwnd, tp->mss_cache, tp->lost > 0);
}

/* One socket's model, as the iterator below writes it: this header, then the socket's
 * `struct sat_model`. Read by satpep_cc::ModelStates (keep the two in step). */
struct sat_state_record {
	u64 cookie;      /* the socket's cookie (SO_COOKIE): unique on the host, all namespaces */
	u32 model_size;  /* sizeof(struct sat_model) */
	u32 pad;
};

/*
 * Every socket's model, for `satpep status` and the lab: attached to sat_state and pinned
 * beside the controller (PIN_DIR/satpep_sat@states), reading the pinned file walks the map.
 * A proxy that has dropped its capabilities cannot call bpf() (unprivileged BPF is off on
 * most hosts), but it can read a file. Sockets are named by cookie: the map holds every
 * namespace's, and a lab's addresses repeat from namespace to namespace.
 */
SEC("iter/bpf_sk_storage_map")
int sat_states(struct bpf_iter__bpf_sk_storage_map *ctx)
{
	struct seq_file *seq = ctx->meta->seq;
	struct sock *sk = ctx->sk;
	void *value = ctx->value;
	struct sat_state_record h = {};

	if (!sk || !value)
		return 0;
	h.cookie = bpf_get_socket_cookie(sk);
	h.model_size = sizeof(struct sat_model);
	bpf_seq_write(seq, &h, sizeof(h));
	bpf_seq_write(seq, value, sizeof(struct sat_model));
	return 0;
}

SEC(".struct_ops.link")
struct tcp_congestion_ops satpep_sat = {
	.init = (void *)sat_init,
	.release = (void *)sat_release,
	.cong_control = (void *)sat_cong_control,
	.cwnd_event = (void *)sat_cwnd_event,
	.ssthresh = (void *)sat_ssthresh,
	.undo_cwnd = (void *)sat_undo_cwnd,
	.sndbuf_expand = (void *)sat_sndbuf_expand,
	.name = "satpep_sat",
};
