// SPDX-License-Identifier: GPL-2.0-or-later
// satpep-about: satellite: rate x (base RTT + short slack) from measured rate and RTT; ignores random loss, drains queues (split's default)
/*
 * satpep_sat: the satellite leg's controller for split mode. It is the tunnel's `satellite`
 * controller (crates/satpep-tunnel/src/congestion/satellite.rs, docs/tunnel.md) cut down to
 * what a kernel TCP sender can keep in its 104 bytes of private state. It needs no
 * configured rate, keeps the bottleneck's queue short, and ignores random loss.
 *
 * Model (BBR's): the rate is the highest delivery rate (the kernel's rate sample, taken over
 * the longer of the send and ACK spans) of the last 5-10 rounds that were not application
 * limited, scaled up by the channel's loss rate (lost packets used the link too); the base
 * RTT the lowest RTT of the last max(2 s, 16 rounds). The window is rate x (base RTT +
 * slack), slack = max(15 ms, base RTT / 25): the only queue it means to keep.
 *
 * Start: 32 segments, doubling every round until the RTT shows a queue above the budget
 * (slack + max(15 ms, base RTT / 20)) or the rate stops growing by a quarter for three full
 * rounds. The queue is read as the lowest RTT of the last max(10 ms, base RTT / 8), from at
 * least three samples, so one late ACK is no queue.
 *
 * Rate drops (a fade, other traffic): a queue above the budget means the link serves less
 * than the model. The rate becomes window / (base RTT + queue) (Vegas's and FAST TCP's
 * reading), or the delivery rate if lower, and one round at 0.94 x rate x base RTT drains
 * the queue. In that drain (and the one after the start) the rate is read again from the
 * ACKs of what was sent before it, which the busy bottleneck serves at its rate now. A queue
 * left after the drain cuts the rate again.
 *
 * Rate rises: every 4 rounds the window probes half a slack above the model; room found
 * doubles the probe, three in a row (or two full windows in which no queue reading showed a
 * quarter of the slack) restart growth at x1.5 a round, which a queue above the slack (not
 * the budget) ends: after rounds with no queue, any queue is this sender's own.
 *
 * A queue that is not its own: two drains in a row that leave a queue bigger than this
 * sender's window, a buffer that overflowed while the window held at or below the model, or
 * four drains of any size, mean a loss-based sender keeps the buffer full. The window then
 * grows as CUBIC's (the hosts' default, so the two share the buffer as two CUBIC senders do),
 * from the window before the drains' cuts, backs off by 0.85 at a loss with a queue (a loss
 * at the floor leaves the curve going), and holds at least half of the link's rate (as
 * measured before) over the RTT now. After 20 s a drain tests whether the competitor left.
 *
 * Losses without a queue are the channel's noise: repaired by the kernel, no slow down.
 * Unlike the tunnel's, this one does not detect a buffer shallower than its budget.
 *
 * Pacing: 2 x window / RTT in the start, the model's rate in a drain, 1.25 x window / RTT
 * otherwise (as quinn paces the tunnel), so the window, not the pacer, holds the queue.
 */
#include "satpep_tcp.h"

char _license[] SEC("license") = "GPL";

#define PH_STARTUP 0
#define PH_DRAIN 1
#define PH_CRUISE 2
#define PH_PROBE 3
#define PH_COMPETE 4

#define SLACK_MIN_US 15000U
#define SLACK_SHARE 25U
#define MARGIN_MIN_US 15000U
/* Twice the tunnel's: a kernel sender's ramp after a drain stands for a moment above the
 * queue its window holds (41 ms against 23 on GEO), and a budget of 37 ms drained every 1.7 s. */
#define MARGIN_SHARE 20U
#define BW_BLOCK_ROUNDS 5U
#define MIN_RTT_SPAN_US 2000000U
#define MIN_RTT_ROUNDS 16U
#define RECENT_MIN_US 10000U
#define RECENT_SHARE 8U
#define CRUISE_ROUNDS 4U
#define DRAIN_GAIN_PCT 94U
#define INITIAL_CWND 32U
#define MIN_CWND 4U
#define COMPETE_AT_LEAST_MS 20000U
/* Rounds in the competitive mode before its own delivery rate may lower the floor: the first
 * ACKs of it are for what the drains sent. */
#define COMPETE_OWN_ROUNDS 3U
/* Bytes a segment takes on the wire beyond its payload (TCP/IP headers with options, and
 * Ethernet). */
#define FRAME_OVERHEAD 66U
#define NOISE_MAX_PPM 500000U
#define NONE 0xffffffffU
/* Most of the competitive window's loss the fair share makes up for, /256 (0.3). */
#define COMPETE_LOSS_MAX 77U

struct sat {
	u32 bw;            /* model rate, bytes/s */
	u32 bw_cur;        /* highest sample of this block of rounds */
	u32 bw_prev;       /* highest sample of the block before */
	u32 bw_peak;       /* highest rate ever (the competitive mode's fair share) */
	u32 min_cur;       /* lowest RTT of this half of the base RTT filter, us */
	u32 min_prev;      /* lowest RTT of the half before */
	u32 min_stamp_ms;  /* when this half began */
	u32 recent_cur;    /* lowest RTT of this half of the queue reading's span, us */
	u32 recent_prev;
	u32 recent_stamp_ms;
	u32 next_round;    /* tp->delivered that ends the round */
	u32 round_acked;   /* segments delivered this round */
	u32 round_lost;    /* segments lost this round */
	u32 round_cwnd;    /* window the round began with */
	u32 round_bw;      /* latest delivery-rate sample this round (start: highest), bytes/s */
	/* Fields one phase uses share their place with the competitive mode's (struct sat
	 * fills the kernel's 104 bytes). */
	union {
		u32 ref_bw;    /* start: rate at the last growth; probe: rate before it */
		u32 w_max;     /* competitive: the window at the last back-off, segments */
		u32 drain_us;  /* drain: when it began, us (tcp_mstamp's low bits) */
	};
	union {
		u32 probe_extra; /* segments the probe adds */
		u32 cut_from;    /* drain: the window before the drains began */
		u32 cubic_k_ms;  /* competitive: when the cubic curve gets back to w_max */
	};
	union {
		u32 drain_delivered; /* tp->delivered when the drain began */
		u32 epoch_ms;        /* competitive: when the curve began */
	};
	u32 drain_min;     /* lowest RTT of segments sent in the drain, us */
	u32 drain_acked;   /* segments sent in the drain and delivered */
	u32 stamp_ms;      /* the last drain ended; in the competitive mode, when it began */
	u32 noise_ppm;     /* loss rate of rounds with no queue, per million */
	u32 left_us;       /* queue the last drain left, us */
	u8 phase;
	u8 phase_rounds;
	u8 full_rounds;
	u8 probe_wins;
	u8 idle_rounds;
	u8 undrained;
	u8 recent_n;       /* RTT samples in the queue reading's span, at least (a rotation
			    * keeps it at 2 if the span had any, counting low) */
	u8 bw_rounds;
	u8 cnt;            /* growth not yet applied, segments */
	u8 compete_loss;   /* competitive mode: share of a round's segments lost, /256,
			    * smoothed over about four rounds */
	u8 reacted:1;      /* reacted to a queue this round */
	u8 app_limited:1;  /* this round had too little to send */
	u8 regrowth:1;     /* growth after the start: x1.5 a round */
	u8 overflow:1;     /* since the last drain: a loss with a queue while the window held
			    * at or below the model (another sender overflows the buffer) */
	u8 read:1;         /* this round had a queue reading of three samples or more */
	u8 queued:1;       /* and one of them showed a quarter of the slack or more */
	u8 start_drain:1;  /* this drain follows the start: its rate samples are the link's */
	u8 busy_drain:1;   /* this drain follows a queue above the budget */
};

_Static_assert(sizeof(struct sat) <= 104, "struct sat must fit icsk_ca_priv");

static __always_inline u32 now_ms(const struct tcp_sock *tp)
{
	return (u32)(tp->tcp_mstamp / USEC_PER_MSEC);
}

static __always_inline u32 base_us(const struct sat *ca)
{
	u32 m = min(ca->min_cur, ca->min_prev);

	return m == NONE ? 0 : m;
}

/* Bytes at `bw` over `us`, in segments. */
static __always_inline u32 segs_in(const struct tcp_sock *tp, u32 bw, u32 us)
{
	return (u32)((u64)bw * us / USEC_PER_SEC / max(tp->mss_cache, 1U));
}

/* How long `n` segments take at the model's rate, us (0 while it is unknown). */
static __always_inline u32 segs_time(const struct tcp_sock *tp, const struct sat *ca, u32 n)
{
	if (!ca->bw)
		return 0;
	return (u32)min((u64)n * (tp->mss_cache + FRAME_OVERHEAD) * USEC_PER_SEC / ca->bw,
			USEC_PER_SEC);
}

static __always_inline u32 slack_us(const struct tcp_sock *tp, const struct sat *ca)
{
	return max(max(SLACK_MIN_US, base_us(ca) / SLACK_SHARE), segs_time(tp, ca, 2));
}

/* Above the slack: jitter, delayed ACKs, small path changes; four segments' time on a thin
 * link, where one or two segments of jitter are otherwise read as a queue. */
static __always_inline u32 margin_us(const struct tcp_sock *tp, const struct sat *ca)
{
	return max(max(MARGIN_MIN_US, base_us(ca) / MARGIN_SHARE), segs_time(tp, ca, 4));
}

static __always_inline u32 budget_us(const struct tcp_sock *tp, const struct sat *ca)
{
	return slack_us(tp, ca) + margin_us(tp, ca);
}

/* The queue the latest RTT samples show: their lowest above the base RTT. */
static __always_inline u32 queue_us(const struct sat *ca)
{
	u32 r = min(ca->recent_cur, ca->recent_prev);
	u32 b = base_us(ca);

	if (r == NONE || !b || r < b)
		return 0;
	return r - b;
}

/* What the window delivers at the RTT now, bytes/s (Vegas's reading of a standing queue). */
static __always_inline u32 rate_at_queue(const struct tcp_sock *tp, const struct sat *ca)
{
	u64 rtt = (u64)base_us(ca) + queue_us(ca);

	return (u32)min((u64)tp->snd_cwnd * tp->mss_cache * USEC_PER_SEC / max(rtt, 1ULL),
			0xffffffffULL);
}

/* The window the model and the phase call for, segments. */
static __always_inline u32 target(const struct tcp_sock *tp, const struct sat *ca)
{
	u32 base = base_us(ca), bdp, w;

	if (!base || !ca->bw)
		return tp->snd_cwnd;
	bdp = segs_in(tp, ca->bw, base);
	switch (ca->phase) {
	case PH_DRAIN:
		w = bdp * DRAIN_GAIN_PCT / 100;
		break;
	case PH_CRUISE:
		w = bdp + segs_in(tp, ca->bw, slack_us(tp, ca));
		break;
	case PH_PROBE:
		w = bdp + segs_in(tp, ca->bw, slack_us(tp, ca)) + ca->probe_extra;
		break;
	default:
		return tp->snd_cwnd;
	}
	return max(w, MIN_CWND);
}

/* The competitive mode's least window: half the link's rate over the RTT now, raised by the
 * share of its segments the full buffer drops (what is dropped never arrives: a paced sender
 * loses more at a drop-tail buffer kept full than a window-clocked competitor), by 1 / 0.7 at
 * most. */
static __always_inline u32 fair_share(const struct tcp_sock *tp, const struct sat *ca)
{
	u64 w = segs_in(tp, ca->bw_peak / 2, tp->srtt_us >> 3);

	w = w * 256 / (256 - min((u32)ca->compete_loss, COMPETE_LOSS_MAX));
	return max((u32)min(w, 0xffffffffULL), MIN_CWND);
}

/* Cube root of x (to within one), x below 2^51, by Newton's method from above: 2^17 is
 * above any root, each step at least a third closer, 24 steps reach roots down to 1. No
 * branch on the running value, so the verifier walks the steps once (a bisection's
 * branches on known bounds made it walk 2^21 paths). A global function: verified on its
 * own, not on every path through its callers. */
__attribute__((noinline)) u32 sat_cbrt(u64 x)
{
	u64 r = 1 << 17;

	if (x >= 1ULL << 51)
		return 1 << 17;
#pragma unroll
	for (int i = 0; i < 24; i++)
		r = (2 * r + x / (r * r | 1)) / 3;
	return (u32)r;
}

/* The integer square root of x < 2^32, from above (Newton), as sat_cbrt: fixed steps, no
 * branch on the running value. */
__attribute__((noinline)) u32 sat_sqrt(u32 x)
{
	u64 r = 1 << 16;

#pragma unroll
	for (int i = 0; i < 22; i++)
		r = (r + x / (r | 1)) / 2;
	return (u32)r;
}

/* When CUBIC's curve from `cwnd` gets back to `w_max`, ms (RFC 9438: K = cbrt((w_max -
 * cwnd) / C), C = 0.4 segments/s^3). Global, as sat_cbrt. */
__attribute__((noinline)) u32 sat_cubic_k(u32 w_max, u32 cwnd)
{
	if (w_max <= cwnd)
		return 0;
	/* x 10^9 / 0.4: s^3 to ms^3 */
	return sat_cbrt((u64)(w_max - cwnd) * 2500000000ULL);
}

/* The competitive mode's curve restarts from the window now towards `w_max` (RFC 9438:
 * W(t) = C (t - K)^3 + w_max). */
static __always_inline void cubic_epoch(struct tcp_sock *tp, struct sat *ca, u32 w_max)
{
	ca->w_max = w_max;
	ca->epoch_ms = now_ms(tp);
	ca->cubic_k_ms = sat_cubic_k(w_max, tp->snd_cwnd);
	tp->snd_cwnd_cnt = 0;
}

/* The window the curve calls for `t_ms` after its start, segments (global, as sat_cbrt). */
__attribute__((noinline)) u32 sat_cubic_target(u32 t_ms, u32 k_ms, u32 w_max)
{
	s64 d = (s64)t_ms - k_ms;
	u64 a = d < 0 ? -d : d, off;

	if (a > 1000000) /* 1000 s: beyond any epoch, and no overflow below */
		a = 1000000;
	off = a * a * a * 4 / 10000000000ULL;
	if (d >= 0)
		return off > 0xffffff ? 0xffffff + w_max : w_max + (u32)off;
	return off >= w_max ? 0 : w_max - (u32)off;
}

/* CUBIC's growth towards `target` for `acked` segments: at most x1.5 a round, at least
 * Reno's segment a round. Returns the window << 32 | the growth not yet applied (global). */
__attribute__((noinline)) u64 sat_cubic_grow(u32 cwnd, u32 cnt, u32 acked, u32 target)
{
	u32 step = 1;

	if (cwnd < MIN_CWND)
		cwnd = MIN_CWND;
	if (target > cwnd) {
		step = target - cwnd;
		if (step > cwnd / 2)
			step = cwnd / 2;
	}
	if (acked > 0xffff)
		acked = 0xffff;
	cnt += acked * step;
	if (cnt >= cwnd) {
		cwnd += cnt / cwnd;
		cnt %= cwnd;
	}
	return (u64)cwnd << 32 | cnt;
}

static __always_inline void set_bw(struct sat *ca, u32 bw)
{
	ca->bw = bw;
	ca->bw_cur = bw;
	ca->bw_prev = bw;
	ca->bw_rounds = 0;
}

static __always_inline void enter(struct sock *sk, struct sat *ca, u8 phase)
{
	struct tcp_sock *tp = tcp_sk(sk);
	bool ramp = phase == PH_CRUISE || phase == PH_PROBE;
	u32 t;

	if (phase == PH_DRAIN && ca->phase != PH_DRAIN)
		ca->cut_from = tp->snd_cwnd;
	ca->start_drain = phase == PH_DRAIN && ca->phase == PH_STARTUP;
	ca->busy_drain = phase == PH_DRAIN && (ca->reacted || ca->phase == PH_DRAIN);
	ca->phase = phase;
	ca->phase_rounds = 0;
	ca->idle_rounds = 0;
	if (phase == PH_DRAIN) {
		ca->drain_us = (u32)tp->tcp_mstamp;
		ca->drain_delivered = tp->delivered;
		ca->drain_min = NONE;
		ca->drain_acked = 0;
	}
	t = target(tp, ca);
	/* Down at once; up gradually (cong_control), or the window leaves as a burst. */
	if (!(ramp && t > tp->snd_cwnd))
		tp->snd_cwnd = max(min(t, tp->snd_cwnd_clamp), MIN_CWND);
}

/* The link is faster than the model: grow again, at x1.5 a round. */
static __always_inline void regrow(struct sock *sk, struct sat *ca)
{
	ca->regrowth = 1;
	ca->ref_bw = ca->bw;
	ca->full_rounds = 0;
	enter(sk, ca, PH_STARTUP);
}

/* The queue is too long: the rate is what the bottleneck serves now; drain the queue. */
static __always_inline void react(struct sock *sk, struct sat *ca)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u32 by_rtt, measured;

	ca->reacted = 1;
	if (ca->phase == PH_STARTUP) {
		set_bw(ca, max(ca->bw, ca->round_bw));
	} else {
		by_rtt = rate_at_queue(tp, ca);
		measured = max(ca->round_bw, 1U);
		set_bw(ca, min(min(ca->bw, by_rtt), max(measured, by_rtt / 2)));
	}
	if (!ca->bw) {
		tp->snd_cwnd = max(tp->snd_cwnd / 2, MIN_CWND);
		return;
	}
	enter(sk, ca, PH_DRAIN);
}

static __always_inline void end_drain(struct sock *sk, struct sat *ca)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u32 base = base_us(ca), queue = queue_us(ca), by_rtt;
	bool foreign;

	bool overflow = ca->overflow;

	ca->stamp_ms = now_ms(tp);
	ca->overflow = 0;
	if (ca->drain_min == NONE || ca->drain_min <= base + margin_us(tp, ca)) {
		/* Drained, but a buffer that overflowed under a window this small was filled
		 * by another sender, which backed off meanwhile: the evidence stays. */
		if (!overflow)
			ca->undrained = 0;
		enter(sk, ca, PH_CRUISE);
		return;
	}
	/* A queue that shrinks from drain to drain is one the cuts are catching up with (a link
	 * slowing step by step, as in a rain fade): no sign of another sender, unless the
	 * buffer overflowed. */
	if (ca->undrained < 255 &&
	    (!ca->undrained || overflow || queue >= ca->left_us * 3 / 4))
		ca->undrained++;
	ca->left_us = queue;
	/* More queued (at the fastest rate the link ever had) than this sender has in flight. */
	foreign = overflow ||
		  (u64)ca->bw_peak * queue / USEC_PER_SEC > 2ULL * tp->snd_cwnd * tp->mss_cache;
	if ((ca->undrained >= 2 && foreign) || ca->undrained >= 4) {
		/* Drains leave a queue: another sender keeps the buffer full. Start from half
		 * of what the link carried, not from where the drains cut the rate. */
		u32 share = segs_in(tp, ca->bw_peak, base + queue) / 2;
		/* The drains' cuts were for a queue that was not this sender's: undo them as
		 * CUBIC would have lost one back-off there, with the curve heading back to the
		 * window before them. */
		u32 from = ca->cut_from;

		tp->snd_cwnd = max(max(segs_in(tp, ca->bw, base + queue), share), MIN_CWND);
		tp->snd_cwnd = max(tp->snd_cwnd, from / 10 * 7);
		ca->compete_loss = 0;
		enter(sk, ca, PH_COMPETE);
		cubic_epoch(tp, ca, max(from, tp->snd_cwnd));
		return;
	}
	/* The rate estimate is still too high: cut by what the queue says, 1/7 at least and
	 * half at most, and drain again. */
	by_rtt = rate_at_queue(tp, ca);
	set_bw(ca, min(ca->bw - ca->bw / 7, max(by_rtt, ca->bw / 2)));
	enter(sk, ca, PH_DRAIN);
}

static __always_inline u32 min_rtt_span_us(const struct sat *ca)
{
	return max(MIN_RTT_SPAN_US, base_us(ca) * MIN_RTT_ROUNDS);
}

/* The round's rate sample with the channel's noise counted in (the bottleneck served the
 * lost segments too): the round's own losses, up to what the noise explains beside its
 * deliveries (the expected count, three standard deviations and two segments), the rest a
 * bottleneck dropping what exceeds its rate. Scaling every sample by 1 / (1 - the mean
 * noise) instead read a T1 losing one segment in nine a few % fast in rounds that lost
 * fewer than the mean (some 80 segments a round, binomial), the max filter kept those, and
 * the excess stood in the queue (lab, T1 at BER 1e-5, 8 runs each: the probe's queue p95
 * 57-97 ms before, 33-58 ms with this rule, the tunnel's since 669f6fb). */
static __always_inline u64 crossed(const struct sat *ca, u32 noise)
{
	u32 acked = max(ca->round_acked, 1U);
	u32 expected = (u32)((u64)acked * noise / (USEC_PER_SEC - noise));
	u32 credit = min(ca->round_lost, expected + 3 * sat_sqrt(expected) + 2);

	return (u64)ca->round_bw * (acked + credit) / acked;
}

static __always_inline void end_round(struct sock *sk, struct sat *ca)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u32 base = base_us(ca), noise = min(ca->noise_ppm, NOISE_MAX_PPM);
	u32 total = ca->round_acked + ca->round_lost;
	u64 sample = crossed(ca, noise);
	/* A round that filled its window (lost segments count: an overflow filled it too). */
	bool filled = !ca->app_limited && total >= ca->round_cwnd / 2;
	bool idle;

	sample = min(sample, 0xffffffffULL);
	/* The channel's noise: rounds that met no queue lose only to it. */
	if (!ca->reacted && ca->phase != PH_COMPETE && total >= 30) {
		u32 s = (u32)((u64)ca->round_lost * USEC_PER_SEC / total);

		ca->noise_ppm = s >= ca->noise_ppm ? ca->noise_ppm + (s - ca->noise_ppm) / 4
						   : ca->noise_ppm - (ca->noise_ppm - s) / 4;
	}
	if (ca->phase == PH_COMPETE && total >= 30) {
		u32 s = min((u32)((u64)ca->round_lost * 256 / total), 255U);
		u32 l = ca->compete_loss;

		ca->compete_loss = s >= l ? l + (s - l) / 4 : l - (l - s) / 4;
	}
	if (sample && (filled || sample > ca->bw))
		ca->bw_cur = max(ca->bw_cur, (u32)sample);
	ca->bw = max(ca->bw_cur, ca->bw_prev);
	if (++ca->bw_rounds >= BW_BLOCK_ROUNDS) {
		ca->bw_prev = ca->bw_cur;
		ca->bw_cur = 0;
		ca->bw_rounds = 0;
	}
	ca->bw_peak = max(ca->bw_peak, ca->bw);
	/* A full window at the model's bandwidth-delay product met no queue at all: the model is
	 * too slow (a fade ended, other traffic left, a drain cut too deep). */
	idle = filled && (ca->phase == PH_CRUISE || ca->phase == PH_PROBE) &&
	       ca->round_cwnd >= segs_in(tp, ca->bw, base) && ca->read && !ca->queued;
	ca->round_acked = 0;
	ca->round_lost = 0;
	/* Outside the start the latest sample stays until the next one: a queue met on the
	 * ACK that ends a round would otherwise read a rate of zero and cut the model to half
	 * of what the window delivers (beside 20 Mbit/s of UDP, a probe's end did that, and
	 * the link ran at 74 % for the rest of the run). */
	if (ca->phase == PH_STARTUP)
		ca->round_bw = 0;
	ca->round_cwnd = tp->snd_cwnd;
	ca->app_limited = 0;
	ca->reacted = 0;
	ca->read = 0;
	ca->queued = 0;
	if (ca->phase_rounds < 255)
		ca->phase_rounds++;
	ca->idle_rounds = idle ? min(ca->idle_rounds + 1, 255) : 0;

	switch (ca->phase) {
	case PH_STARTUP:
		if (!filled)
			break;
		if (ca->bw >= ca->ref_bw + ca->ref_bw / 4) {
			ca->ref_bw = ca->bw;
			ca->full_rounds = 0;
		} else if (++ca->full_rounds >= 3) {
			enter(sk, ca, PH_DRAIN);
		}
		break;
	case PH_CRUISE:
		if (ca->idle_rounds >= 2) {
			regrow(sk, ca);
		} else if (ca->phase_rounds >= CRUISE_ROUNDS) {
			ca->ref_bw = ca->bw;
			ca->probe_wins = 0;
			ca->probe_extra = max(segs_in(tp, ca->bw, slack_us(tp, ca)) / 2, 2U);
			enter(sk, ca, PH_PROBE);
		}
		break;
	case PH_PROBE:
		if (ca->idle_rounds >= 2) {
			regrow(sk, ca);
		} else if (ca->phase_rounds >= 2) {
			/* The extra could add extra / BDP to the rate: half of that (1 % at least)
			 * says there was room. */
			u64 bdp = max(segs_in(tp, ca->ref_bw, base), 1U);
			u64 share = max((u64)ca->probe_extra * 1000000 / bdp / 2, 10000ULL);
			bool grew = (u64)ca->bw * 1000000 > (u64)ca->ref_bw * (1000000 + share);

			if (grew && ca->probe_wins < 2) {
				ca->probe_wins++;
				ca->ref_bw = ca->bw;
				ca->probe_extra *= 2;
				ca->phase_rounds = 1;
			} else if (grew) {
				tp->snd_cwnd = max(target(tp, ca), MIN_CWND);
				regrow(sk, ca);
			} else if (now_ms(tp) - ca->stamp_ms > min_rtt_span_us(ca) / 2000) {
				/* The base RTT was last sampled long ago: a drain samples it. */
				enter(sk, ca, PH_DRAIN);
			} else {
				enter(sk, ca, PH_CRUISE);
				/* The probe's extra is still queued for one round: not a slower
				 * link. */
				ca->reacted = 1;
			}
		}
		break;
	case PH_COMPETE:
		if (ca->phase_rounds >= CRUISE_ROUNDS &&
		    now_ms(tp) - ca->stamp_ms >= COMPETE_AT_LEAST_MS) {
			/* Has the competitor left? A drain at our share tells. The base RTT from
			 * before it is what the drain compares with: competing did not age it. */
			set_bw(ca, rate_at_queue(tp, ca));
			ca->undrained = 2;
			ca->min_stamp_ms = now_ms(tp);
			enter(sk, ca, PH_DRAIN);
		}
		break;
	}
}

/* One RTT sample (us) into the base RTT filter and the queue reading. */
static __always_inline void rtt_sample(const struct tcp_sock *tp, struct sat *ca, u32 rtt)
{
	u32 t = now_ms(tp);
	u32 recent_half = max(RECENT_MIN_US, base_us(ca) / RECENT_SHARE) / 2000;

	/* Not against a competitor, whose queue never empties: the full buffer's RTT would
	 * become the base, and the drain that checks whether it left would find no queue. */
	if (ca->phase != PH_COMPETE) {
		if (t - ca->min_stamp_ms > min_rtt_span_us(ca) / 2000) {
			ca->min_prev = ca->min_cur;
			ca->min_cur = rtt;
			ca->min_stamp_ms = t;
		} else {
			ca->min_cur = min(ca->min_cur, rtt);
		}
	}
	if (t - ca->recent_stamp_ms >= max(recent_half, 1U)) {
		ca->recent_prev = ca->recent_cur;
		ca->recent_cur = rtt;
		ca->recent_stamp_ms = t;
		ca->recent_n = ca->recent_n ? 2 : 1;
	} else {
		ca->recent_cur = min(ca->recent_cur, rtt);
		if (ca->recent_n < 255)
			ca->recent_n++;
	}
}

static __always_inline void set_pacing(struct sock *sk, const struct sat *ca)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u64 rate;

	if (!tp->srtt_us)
		return;
	/* srtt_us is <<3. */
	rate = (u64)tp->snd_cwnd * tp->mss_cache * USEC_PER_SEC * 8 / tp->srtt_us;
	if (ca->phase == PH_STARTUP)
		rate *= 2;
	else if (ca->phase == PH_DRAIN && ca->bw)
		rate = ca->bw;
	else
		rate = rate * 5 / 4;
	sk->sk_pacing_rate = min(rate, (u64)sk->sk_max_pacing_rate);
}

SEC("struct_ops")
void BPF_PROG(sat_init, struct sock *sk)
{
	struct sat *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	__builtin_memset(ca, 0, sizeof(*ca));
	ca->min_cur = NONE;
	ca->min_prev = NONE;
	ca->recent_cur = NONE;
	ca->recent_prev = NONE;
	ca->min_stamp_ms = now_ms(tp);
	ca->recent_stamp_ms = now_ms(tp);
	ca->stamp_ms = now_ms(tp);
	ca->drain_min = NONE;
	ca->next_round = tp->delivered;
	tp->snd_cwnd = max(tp->snd_cwnd, INITIAL_CWND);
	ca->round_cwnd = tp->snd_cwnd;
	enable_pacing(sk);
}

SEC("struct_ops")
void BPF_PROG(sat_cong_control, struct sock *sk, u32 ack, int flag, const struct rate_sample *rs)
{
	struct sat *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);
	u32 acked = rs->acked_sacked > 0 ? rs->acked_sacked : 0;
	long rtt = rs->rtt_us;
	bool too_long;

	if (rtt > 0)
		rtt_sample(tp, ca, (u32)rtt);
	/* Whether the round met a queue is read through it, not at its last ACK: a window
	 * smaller than the link leaves a gap before each round, and the ACK that ends the round
	 * comes after that gap, with too few samples in the reading's span to count. */
	if (ca->recent_n >= 3) {
		ca->read = 1;
		if (queue_us(ca) >= slack_us(tp, ca) / 4)
			ca->queued = 1;
	}
	ca->round_acked += acked;
	if (rs->losses > 0)
		ca->round_lost += rs->losses;
	if (rs->is_app_limited)
		ca->app_limited = 1;
	if (rs->delivered > 0 && rs->interval_us > 0) {
		u64 s = (u64)rs->delivered * tp->mss_cache * USEC_PER_SEC / rs->interval_us;

		s = min(s, 0xffffffffULL);
		/* The latest sample, not the round's highest: each spans about a round, and the
		 * highest of a round's many read the link 2-3 % fast, which then stood as
		 * 15 ms of queue on a GEO path. In the start the highest: the rate doubles
		 * within a round, and the start ends on what the last of it delivered. */
		if (!rs->is_app_limited || s > ca->bw)
			ca->round_bw = ca->phase == PH_STARTUP || ca->start_drain ?
					       max(ca->round_bw, (u32)s) : (u32)s;
	}
	if (ca->phase == PH_DRAIN && rtt > 0 &&
	    (s32)(rs->prior_delivered - ca->drain_delivered) >= 0) {
		ca->drain_min = min(ca->drain_min, (u32)rtt);
		ca->drain_acked += acked;
	}
	if (rs->delivered >= 0 && rs->interval_us > 0 &&
	    (s32)(rs->prior_delivered - ca->next_round) >= 0) {
		ca->next_round = tp->delivered;
		end_round(sk, ca);
	}

	/* A probe means to queue its extra: above the budget by more than that, the link got
	 * slower. Growing again after rounds with no queue at all, any queue is this sender's
	 * own: the slack ends it. The window grows 1.5 x a round and the queue shows an RTT
	 * late, so each ms waited stands in the queue many times over (lab, a fade's steps up
	 * to 38 and 50 Mbit/s on GEO: the budget's 50 ms let the queue reach 270 ms). */
	too_long = ca->recent_n >= 3 &&
		   queue_us(ca) > (ca->phase == PH_STARTUP && ca->regrowth ? slack_us(tp, ca)
									 : budget_us(tp, ca)) +
				  (ca->phase == PH_PROBE ? segs_time(tp, ca, ca->probe_extra) : 0);
	/* A quarter of the base RTT is more queue than this sender's start or a probe leaves;
	 * the channel's noise loses without one. */
	if (rs->losses > 0 && ca->recent_n >= 3 && queue_us(ca) > base_us(ca) / 4 &&
	    queue_us(ca) > 2 * budget_us(tp, ca) &&
	    (ca->phase == PH_DRAIN || ca->phase == PH_CRUISE))
		ca->overflow = 1;
	switch (ca->phase) {
	case PH_STARTUP:
		if (!rs->is_app_limited) {
			if (ca->regrowth) {
				u32 c = ca->cnt + acked;

				tp->snd_cwnd += c / 2;
				ca->cnt = c & 1;
			} else {
				tp->snd_cwnd += acked;
			}
		}
		/* A timeout took the window to one segment: the rate found so far stays. */
		if (ca_state(sk) == TCP_CA_Loss && ca->bw)
			tp->snd_cwnd = max(tp->snd_cwnd, segs_in(tp, ca->bw, base_us(ca)));
		if (too_long)
			react(sk, ca);
		break;
	case PH_CRUISE:
	case PH_PROBE:
		if (too_long && !ca->reacted)
			react(sk, ca);
		break;
	case PH_DRAIN:
		/* The model is the rate at which what was sent before the drain comes back,
		 * read over the drain's first ACKs while they still show a queue (the start's
		 * last round, sent at twice the rate, does for an RTT): the bottleneck is busy
		 * then, so those ACKs come at the rate it serves now. (A queue just over the
		 * budget may be a ramp's moment, behind which the link idles: read past it,
		 * on GEO, the model fell to 72 % of the link.) The kernel's samples span an
		 * RTT of ACKs, most of them from before: after the start they describe the
		 * round before (60 % of GEO's link, and a drain to half of it), after a step
		 * down in rate the faster link (a drain at a rate the link no longer has left
		 * 60-100 ms of queue for an RTT in a fade). After the start the reading only
		 * raises the model; after a queue it only lowers it. */
		if ((ca->start_drain || ca->busy_drain) &&
		    (s32)(rs->prior_delivered - ca->drain_delivered) < 0) {
			u32 span = (u32)tp->tcp_mstamp - ca->drain_us;

			if (span >= max(RECENT_MIN_US, base_us(ca) / RECENT_SHARE) &&
			    (ca->start_drain ||
			     (rtt > 0 && (u32)rtt >= base_us(ca) + slack_us(tp, ca) / 2))) {
				u32 noise = min(ca->noise_ppm, NOISE_MAX_PPM);
				u64 r = (u64)(tp->delivered - ca->drain_delivered) * tp->mss_cache *
					USEC_PER_SEC / span;

				/* Lost segments used the link too. */
				r = r * USEC_PER_SEC / (USEC_PER_SEC - noise);
				if (r && r < 0xffffffffULL &&
				    (ca->start_drain ? r > ca->bw : r < ca->bw)) {
					set_bw(ca, (u32)r);
					tp->snd_cwnd = max(target(tp, ca), MIN_CWND);
				}
			}
		}
		/* Half a window of segments sent in the drain is back: the queue they met is
		 * what is left. */
		if (ca->drain_acked >= tp->snd_cwnd / 2)
			end_drain(sk, ca);
		break;
	case PH_COMPETE:
		if (rs->losses > 0 && too_long && !ca->reacted) {
			/* A loss with a queue: back off as the loss-based competitor does, by
			 * 0.85 (a CUBIC aggregate of two flows: this one arrives late, after the
			 * drains gave ground). The fair share is at most twice what this sender
			 * delivers: with the buffer full, a link that slowed (a fade while
			 * competing) would otherwise keep the floor above the whole link and the
			 * buffer full. */
			u32 w = tp->snd_cwnd;

			ca->reacted = 1;
			u32 got = max(ca->bw, ca->round_bw);

			/* Only once the rate samples are this mode's (those of the drains before it
			 * describe the cut windows: at the first loss, the competitor's start
			 * overflowing the buffer, they lowered the floor to a quarter of the link
			 * for the rest of the run, a share of 29-30 % as the incumbent), and only
			 * for a shortfall of more than a third: a paced sender loses 10-15 % of its
			 * packets at a drop-tail buffer kept full, and lowering the floor to each
			 * loss's delivery ratcheted it down by that much at every loss. */
			if (got && ca->phase_rounds >= COMPETE_OWN_ROUNDS &&
			    3ULL * got < (u64)ca->bw_peak)
				ca->bw_peak = 2 * got;
			/* At the floor the curve goes on: restarting it there held the window flat
			 * on the curve's plateau for a whole run (a share of 34 %, three runs of
			 * 30 s) while the competitor cut and grew back around it. */
			if (w / 20 * 17 > fair_share(tp, ca)) {
				tp->snd_cwnd = w / 20 * 17;
				cubic_epoch(tp, ca, w);
			}
		} else if (!rs->is_app_limited) {
			/* CUBIC's growth (the hosts' default sender), so that the two share a
			 * drop-tail buffer as two CUBIC senders do: Reno's segment a round would
			 * take minutes to win back a share over a GEO path. The curve is read one
			 * base RTT ahead, as CUBIC does. */
			u32 t = sat_cubic_target(now_ms(tp) - ca->epoch_ms + base_us(ca) / 1000,
						 ca->cubic_k_ms, ca->w_max);
			u64 g = sat_cubic_grow(tp->snd_cwnd, tp->snd_cwnd_cnt, acked, t);

			tp->snd_cwnd = (u32)(g >> 32);
			tp->snd_cwnd_cnt = (u32)g;
			if (tp->snd_cwnd < fair_share(tp, ca))
				tp->snd_cwnd_cnt = 0;
		}
		tp->snd_cwnd = max(tp->snd_cwnd, fair_share(tp, ca));
		break;
	}
	if (ca->phase != PH_STARTUP && ca->phase != PH_COMPETE) {
		u32 t = target(tp, ca);

		if (t > tp->snd_cwnd) {
			/* Up by a quarter of what is acknowledged. */
			u32 c = ca->cnt + acked;

			tp->snd_cwnd = min(tp->snd_cwnd + c / 4, t);
			ca->cnt = c & 3;
		} else {
			tp->snd_cwnd = t;
		}
	}
	tp->snd_cwnd = max(min(tp->snd_cwnd, tp->snd_cwnd_clamp), MIN_CWND);
	set_pacing(sk, ca);
}

SEC("struct_ops")
void BPF_PROG(sat_cwnd_event, struct sock *sk, int event)
{
	struct sat *ca = inet_csk_ca(sk);

	/* A timeout: what was in flight says nothing about the queue now. */
	if (event == CA_EVENT_LOSS) {
		ca->recent_cur = NONE;
		ca->recent_prev = NONE;
		ca->recent_n = 0;
	}
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

SEC(".struct_ops.link")
struct tcp_congestion_ops satpep_sat = {
	.init = (void *)sat_init,
	.cong_control = (void *)sat_cong_control,
	.cwnd_event = (void *)sat_cwnd_event,
	.ssthresh = (void *)sat_ssthresh,
	.undo_cwnd = (void *)sat_undo_cwnd,
	.name = "satpep_sat",
};
