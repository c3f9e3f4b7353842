// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * flow_drop: the split relay's drop-based flow control (Bharadwaj 1999, §4.2), as a socket
 * filter attached to a relayed socket (SO_ATTACH_BPF).
 *
 * When more data is buffered for a connection than its downstream leg can use, the relay
 * arms the socket its data arrives on; this filter then drops the next data segment that
 * socket receives, unacknowledged, so the sender retransmits it and halves its window. No
 * other segment is dropped until that one's retransmission has arrived: at most one drop per
 * window, and the sender recovers by fast retransmit, not a timeout.
 *
 *   IDLE --(relay arms)--> ARMED --(next data segment: dropped)--> DROPPED
 *     ^                                                               |
 *     +------------(a segment covering the dropped one arrives)-------+
 *
 * Why a socket filter: it runs on the socket's receive path before TCP sees the segment
 * (tcp_filter), per socket, and attaching one needs no privilege, so the relay can arm its
 * sockets after the proxy has dropped its own. The relay writes `slots` through a shared
 * mapping (BPF_F_MMAPABLE), since it may no longer call bpf(); a socket finds its slot by
 * its cookie, open addressing over PROBES slots from cookie % slots.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char _license[] SEC("license") = "GPL";

#define IDLE 0
#define ARMED 1
#define DROPPED 2

/* Slots a cookie may occupy, from cookie % max_entries (a power of two). */
#define PROBES 8

/* One armed socket, as the relay (crates/satpep-cc/src/flow_drop.rs) lays it out. */
struct slot {
	__u64 cookie;   /* the socket's cookie; 0: free */
	__u32 state;    /* IDLE, ARMED or DROPPED */
	__u32 seq;      /* DROPPED: the dropped segment's first sequence number */
	__u64 drops;    /* segments dropped on this socket */
	__u64 at_ns;    /* DROPPED: when (CLOCK_MONOTONIC) */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1024); /* set at load from the proxy's connection limit */
	__type(key, __u32);
	__type(value, struct slot);
} slots SEC(".maps");

/* max_entries - 1, set at load with it. */
const volatile __u32 slot_mask = 1023;

SEC("socket")
int flow_drop(struct __sk_buff *skb)
{
	__u64 cookie = bpf_get_socket_cookie(skb);
	__u32 mask = slot_mask;
	struct slot *s = 0;
	__u8 doff;
	__u32 seq, hdr, i, idx;

	for (i = 0; i < PROBES; i++) {
		idx = (__u32)(cookie + i) & mask;
		s = bpf_map_lookup_elem(&slots, &idx);
		if (!s || s->cookie == cookie)
			break;
		s = 0;
	}
	if (!s || s->state == IDLE)
		return skb->len;
	/* The filter sees the segment from its TCP header on (tcp_filter). */
	if (bpf_skb_load_bytes(skb, 12, &doff, 1) || bpf_skb_load_bytes(skb, 4, &seq, 4))
		return skb->len;
	hdr = (doff >> 4) * 4;
	if (skb->len <= hdr)
		return skb->len; /* no payload: an ACK, a FIN, a window probe */
	seq = bpf_ntohl(seq);
	if (s->state == ARMED) {
		s->seq = seq;
		s->at_ns = bpf_ktime_get_ns();
		s->state = DROPPED;
		__sync_fetch_and_add(&s->drops, 1);
		return 0;
	}
	/* DROPPED: free to drop again once a segment covering the dropped one has arrived. */
	if ((__s32)(seq - s->seq) <= 0 && (__s32)(seq + (skb->len - hdr) - s->seq) > 0)
		s->state = IDLE;
	return skb->len;
}
