/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * satpep's satellite congestion control: one model, two hosts. The BPF struct_ops
 * controller `satpep_sat` (split mode, crates/satpep-cc/src/bpf/satpep_sat.bpf.c) and the
 * tunnel's quinn controller `satellite` (crates/satpep-tunnel/src/congestion/satellite.rs,
 * through crates/satpep-model) both compile this file; each host only turns its own events
 * into a `struct sat_ack` (the kernel's ACK and rate sample, in segments) and applies the
 * window and pacing rate the model returns. It needs no configured rate, keeps the
 * bottleneck's queue short and ignores random loss. docs/model.md explains it at length.
 *
 *                     queue > budget                   half a window sent in
 *          +-------+  or full pipe     +-------+       the drain acked, queue gone
 *   init ->| START |------------------>| DRAIN |----------------------------+
 *          +-------+                   +-------+<-----------+               |
 *            ^   ^                      |  ^  | queue left:  |               v
 *  probes    |   | rounds with no queue |  |  | cut again    |  queue  +--------+
 *  found     |   +----------------------+--|--+--------------|---------| CRUISE |
 *  room      |     (from CRUISE/PROBE)     |                 | > budget +--------+
 *            |                             |                 |           | every 4
 *            |   +-------+                 |                 |           v rounds
 *            +---| PROBE |-----------------+-----------------+       +-------+
 *                +-------+  base RTT old: drain; no room: CRUISE     | PROBE |
 *                                                                    +-------+
 *          drains that keep leaving a queue (another sender fills the buffer)
 *   DRAIN ---------------------------------------------------------> COMPETE
 *   COMPETE --- 20 s on, a drain checks whether the competitor left ---> DRAIN
 *
 * Model (BBR's): the rate is the highest delivery rate of the last 5-10 rounds that were not
 * application limited, with the channel's random losses counted in (lost segments used the
 * link too); the base RTT the lowest RTT of the last max(2 s, 16 rounds). The window is
 * rate x (base RTT + slack), slack = max(15 ms, base RTT / 25, two segments' time): the only
 * queue it means to keep.
 *
 * START: 32 segments, doubling every round until the RTT shows a queue above the budget
 * (slack + margin) or the rate stops growing by a quarter for three full rounds. The queue
 * is read as the lowest RTT of the last max(10 ms, base RTT / 8), from at least three
 * samples, so one late ACK is no queue.
 *
 * Rate drops (a fade, other traffic): a queue above the budget means the link serves less
 * than the model. The rate becomes window / (base RTT + queue) (Vegas's and FAST TCP's
 * reading), or the delivery rate if lower, and one round at 0.94 x rate x base RTT (DRAIN)
 * empties the queue; the ACKs of what was sent before it, which the busy bottleneck serves
 * at its rate now, set the rate again. A queue left after the drain cuts the rate again.
 *
 * A longer path (a LEO handover): RTTs rise at once. The drain after a reaction took
 * segments out of flight; a queue of this sender's would have shrunk by their time, and
 * one that shrank by less than half of it, without growing, with no loss beyond the noise
 * and no more than the window could have queued, is the path's: the base RTT becomes the
 * drain's lowest RTT and the rate what it was (`path_lengthened`). A path longer by less
 * than the budget makes no reaction, but a whole round whose every queue reading stood
 * above the slack (more than the window can queue) while it delivered under seven eighths
 * of the model gets one drain at the model's rate that only tests for it (`stood`).
 *
 * Rate rises: every 4 rounds the window probes half a slack above the model (PROBE); room
 * found doubles the probe, three in a row (or two full windows in which no queue reading
 * showed a quarter of the slack) restart growth at x1.5 a round, which a queue above the
 * slack ends. Below four fifths of the highest rate yet, one window with no queue (over a
 * shallow buffer, and no loss beyond the noise) restarts it (an ACM step back up costs a
 * GEO round less), below half one probe that found room too, doubling up to half the
 * peak's window: the path carried the peak lately (a fade ended).
 *
 * A queue that is not its own (COMPETE): drains that keep leaving a queue bigger than this
 * sender's window, a buffer that overflowed while the window held at or below the model, or
 * cuts that took the rate below an eighth of its peak (deeper than any fade the channel
 * makes) mean a loss-based sender keeps the buffer full. The window then grows as CUBIC's,
 * backs off by 0.85 at a loss with a queue and each time the queue is back where its losses
 * showed the buffer full (which drops the competitor's packets: it backs off), and holds at
 * least half of the link's rate over the RTT now. After 20 s a drain tests whether the
 * competitor left.
 *
 * A buffer shallower than the budget: a round that loses far more than the channel's noise
 * while only a short queue stands met a full buffer. The slack then becomes half that queue
 * (never below two segments' time), so the window no longer overflows it.
 *
 * Losses without a queue are the channel's noise: repaired by the host, no slow down.
 *
 * Pacing: 2 x window / RTT in the start, the model's rate in a drain, 1.25 x window / RTT
 * otherwise, so the window, not the pacer, holds the queue.
 *
 * Warm start: a host that knows the path's rate and base RTT from an earlier connection
 * (`sat_model_resume`) starts at that rate in CRUISE instead of doubling from 32 segments;
 * a queue at once says the path changed, and the usual reaction drains it.
 */
#ifndef SAT_MODEL_H
#define SAT_MODEL_H

#include "sat_types.h"
#include "win_minmax.h"

/* The phases of the diagram above. */
#define SAT_START 0
#define SAT_DRAIN 1
#define SAT_CRUISE 2
#define SAT_PROBE 3
#define SAT_COMPETE 4

#define SLACK_MIN_US 15000U
#define SLACK_SHARE 25U
#define MARGIN_MIN_US 15000U
/* A kernel sender's ramp after a drain stands for a moment above the queue its window holds
 * (41 ms against 23 on GEO), and a budget of 37 ms drained every 1.7 s. */
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
/* Bytes a segment takes on the wire beyond its payload (headers and framing). */
#define FRAME_OVERHEAD 66U
#define NOISE_MAX_PPM 500000U
/* Most of the competitive window's loss the fair share makes up for, /256 (0.3). */
#define COMPETE_LOSS_MAX 77U
/* Rounds with a shallow buffer's losses before the slack shrinks to it: one lossy round
 * may be a burst of the channel's. */
#define SHALLOW_ROUNDS 2U
/* Segments the noise estimate counts at most (older halve) and at least to be used. */
#define NOISE_MEMORY 4000U
/* The longest mean burst of losses the noise bound allows for, segments. */
#define BURST_MAX 64U
#define NOISE_MEASURED 100U
/* Separate losses (ACKs that reported some) in a drain that lost a quarter of its segments
 * that make it a dropping bottleneck's rather than a channel burst's. */
#define DROPPING_EVENTS 4U

/* One ACK, as the host saw it (the kernel's tcp_sock and rate_sample, in segments). */
struct sat_ack {
	u64 now_us;           /* the sender's clock */
	u32 mss;              /* payload bytes per segment */
	u32 srtt_us;          /* smoothed RTT, 0 while unknown */
	u32 delivered;        /* segments delivered so far */
	u32 prior_delivered;  /* `delivered` when the newest segment this ACK covers was sent */
	s32 rs_delivered;     /* rate sample: segments delivered over `interval_us` (< 0: none) */
	s64 interval_us;      /* rate sample's span (<= 0: none) */
	s32 rtt_us;           /* RTT sample (<= 0: none) */
	u32 acked;            /* segments this ACK acknowledged */
	u32 losses;           /* segments newly found lost */
	u8 app_limited;       /* the rate sample is application limited */
	u8 timeout;           /* recovering from a retransmission timeout */
	u8 losses_dated;      /* the host dates losses by the lost packet's own send time
			       * (`prior_delivered` then is when it left: quinn), not by the
			       * ACK that revealed them (the kernel) */
};

/* The window, owned by the host (the kernel may cut it on a timeout), lent to the model. */
struct sat_window {
	u32 cwnd;   /* segments */
	u32 cnt;    /* growth not yet applied, segment fractions */
	u32 clamp;  /* the host's ceiling, segments */
};

/* Rate and RTT filters. */
struct sat_filters {
	u32 bw;               /* model rate, bytes/s */
	u32 bw_peak;          /* highest rate ever (the competitive mode's fair share) */
	struct sat_max2 rate; /* delivery rate per round, bytes/s */
	struct sat_min2 base; /* base RTT, us */
	struct sat_min2 recent; /* the latest RTTs: the queue reading, us */
};

/* The round trip now. */
struct sat_round {
	u32 next;       /* `delivered` that ends it */
	u32 acked;      /* segments delivered in it */
	u32 lost;       /* segments lost in it */
	u32 events;     /* ACKs in it that reported losses */
	u32 cwnd;       /* window it began with */
	u32 start_bw;   /* the model's rate when it began, before the last round's sample
			 * raised it (what the window and the pacing followed), bytes/s */
	u32 bw;         /* latest delivery-rate sample (START: highest), bytes/s */
	u32 max_queue;  /* highest queue reading in it, us */
	u32 min_queue;  /* lowest (SAT_NONE: none) */
	u8 app_limited; /* it had too little to send */
	u8 reacted;     /* reacted to a queue in it */
	u8 read;        /* it had a queue reading of three samples or more */
	u8 queued;      /* and one of them showed a quarter of the slack or more */
};

/* The channel's own losses, and a buffer that holds less than the budget. */
struct sat_noise {
	u32 acked;        /* segments sent in drains and delivered (older drains weigh less) */
	u32 lost;         /* and lost */
	u32 events;       /* ACKs that reported those losses: lost / events is the mean burst */
	u32 clean_ppm;    /* loss rate of segments sent in drains, per million: a drain's
			   * window is below the path's, so no buffer overflows then and
			   * every loss is the channel's */
	u32 buffer_us;    /* queue the buffer holds at most, if shallower than the slack (0: not) */
	u8 drains;        /* drains since clean_ppm counted NOISE_MEASURED segments (0: not
			   * measured yet) */
	u8 shallow_rounds; /* lossy rounds in a row with a short queue */
};

/* DRAIN and the drains before it. */
struct sat_drain {
	u32 began_us;     /* when it began (the clock's low bits) */
	u32 delivered;    /* `delivered` when it began */
	u32 min_rtt;      /* lowest RTT of segments sent in it, us */
	u32 acked;        /* segments sent in it and delivered */
	u32 lost;         /* segments lost while those were acknowledged */
	u32 events;       /* ACKs that reported losses of them */
	u32 cut_from;     /* the window before the drains began */
	u32 left_us;      /* queue the last drain left */
	u32 ended_ms;     /* the last drain ended; in COMPETE, when it began */
	u32 first_us;     /* when the first ACK of a segment sent in it came (0: none yet) */
	u32 early;        /* of `acked`, those acknowledged within a reordering window of it */
	u32 react_queue_us; /* the queue that began the drains */
	u32 react_bw;     /* the model's rate before they cut it, bytes/s (0: no reaction) */
	u32 tested_ms;    /* a drain last tested for a longer path (`path_lengthened`) */
	u8 undrained;     /* drains in a row that left a queue */
	u8 after_start;   /* it follows the start: its rate samples are the link's */
	u8 busy;          /* it follows a queue above the budget */
	u8 testing;       /* it only tests whether the path grew (`stood`): no cut, no evidence */
	u8 overflow;      /* since the last drain: a loss with a queue while the window held at
			   * or below the model (another sender overflows the buffer) */
};

/* START's growth and PROBE. */
struct sat_growth {
	u32 ref_bw;       /* START: rate at the last growth; PROBE: rate before it */
	u32 probe_extra;  /* segments PROBE adds */
	u32 from_peak;    /* regrowth: the highest rate yet when it began, bytes/s */
	u8 full_rounds;   /* START: full rounds without growth */
	u8 probe_wins;    /* PROBE: probes in a row that found room */
	u8 idle_rounds;   /* full windows in a row that met no queue */
	u8 regrowth;      /* growth after the start (REGROW_*; 0: the first start) */
	u8 resumed;       /* a warm start's first round: paced at the model's rate */
};

/* COMPETE: CUBIC's curve and the fair share. */
struct sat_compete {
	u32 w_max;        /* the window at the last back-off, segments */
	u32 k_ms;         /* when the curve gets back to w_max */
	u32 epoch_ms;     /* when the curve began */
	u32 full_us;      /* the longest queue a loss met while competing: the buffer full */
	u8 loss;          /* share of a round's segments lost, /256, smoothed over ~4 rounds */
	u8 at_full;       /* backed off at this full buffer; again once the queue fell */
	u8 checking;      /* the drain under way checks whether the competitor left */
	u8 short_backoffs; /* back-offs in a row that found this sender short of a third */
};

/* The whole state: what a host keeps per connection. */
struct sat_model {
	struct sat_filters f;
	struct sat_round r;
	struct sat_noise noise;
	struct sat_drain drain;
	struct sat_growth grow;
	struct sat_compete comp;
	u32 shared_ms;    /* when it last ran at a grown share of a hub's carrier (0: never) */
	u8 share_seen;    /* the hub's count of freed carrier last seen, + 1 (0: none yet) */
	u8 phase;
	u8 phase_rounds;
};

/* The path as an earlier connection left it (warm start). */
struct sat_path {
	u32 bw;       /* bytes/s */
	u32 base_us;  /* base RTT */
};

SAT_FN u32 now_ms(const struct sat_ack *a)
{
	return (u32)(a->now_us / USEC_PER_MSEC);
}

SAT_FN u32 base_us(const struct sat_model *m)
{
	u32 b = min2_get(&m->f.base);

	return b == SAT_NONE ? 0 : b;
}

/* Bytes at `bw` over `us`, in segments. */
SAT_FN u32 segs_in(const struct sat_ack *a, u32 bw, u32 us)
{
	return (u32)((u64)bw * us / USEC_PER_SEC / max(a->mss, 1U));
}

/* How long `n` segments take at the model's rate, us (0 while it is unknown). */
SAT_FN u32 segs_time(const struct sat_model *m, const struct sat_ack *a, u32 n)
{
	if (!m->f.bw)
		return 0;
	return (u32)min((u64)n * (a->mss + FRAME_OVERHEAD) * USEC_PER_SEC / m->f.bw,
			USEC_PER_SEC);
}

SAT_FN u32 slack_us(const struct sat_model *m, const struct sat_ack *a)
{
	u32 s = max(max(SLACK_MIN_US, base_us(m) / SLACK_SHARE), segs_time(m, a, 2));

	/* A buffer shallower than the slack: half of it, so the window never fills it. */
	if (m->noise.buffer_us)
		s = min(s, max(m->noise.buffer_us / 2, segs_time(m, a, 2)));
	return s;
}

/* Above the slack: jitter, delayed ACKs, small path changes; four segments' time on a thin
 * link, where one or two segments of jitter are otherwise read as a queue. */
SAT_FN u32 margin_us(const struct sat_model *m, const struct sat_ack *a)
{
	/* Not shrunk with a shallow buffer's slack: the margin is for the path's own jitter
	 * (LEO handovers step the delay by several ms), and a margin of half a 9 ms buffer read
	 * each step as a queue, whose drains cut the rate again and again (corpus, LEO with a
	 * 9 ms buffer: the tunnel fell from 130 to 1 Mbit/s for four seconds). */
	return max(max(MARGIN_MIN_US, base_us(m) / MARGIN_SHARE), segs_time(m, a, 4));
}

SAT_FN u32 budget_us(const struct sat_model *m, const struct sat_ack *a)
{
	return slack_us(m, a) + margin_us(m, a);
}

/* A round whose queue reading reaches this met a queue: a quarter of the usual slack (the
 * path's jitter is no queue), half of a shallow buffer's slack at most. At the model's rate
 * the window's slack stands in the queue, so a round at the matched rate reads a queue; with
 * a quarter of the usual 15 ms over an 8 ms buffer (4 ms of slack) rounds at the matched
 * rate read none, looked idle, and regrowth overflowed the buffer every few rounds (the
 * `throughput` preset's 1 Gbit/s, 5 ms: 8 % of the segments retransmitted). */
SAT_FN u32 queue_mark_us(const struct sat_model *m, const struct sat_ack *a)
{
	u32 s = slack_us(m, a);

	return min(s / 2, max(s, SLACK_MIN_US) / 4);
}

/* The queue the latest RTT samples show: their lowest above the base RTT. */
SAT_FN u32 queue_us(const struct sat_model *m)
{
	u32 r = min2_get(&m->f.recent);
	u32 b = base_us(m);

	if (r == SAT_NONE || !b || r < b)
		return 0;
	return r - b;
}

/* What the window delivers at the RTT now, bytes/s (Vegas's reading of a standing queue). */
SAT_FN u32 rate_at_queue(const struct sat_model *m, const struct sat_window *w,
			 const struct sat_ack *a)
{
	u64 rtt = (u64)base_us(m) + queue_us(m);

	return (u32)min((u64)w->cwnd * a->mss * USEC_PER_SEC / max(rtt, 1ULL), 0xffffffffULL);
}

/* The window the model and the phase call for, segments. */
SAT_FN u32 target(const struct sat_model *m, const struct sat_window *w, const struct sat_ack *a)
{
	u32 base = base_us(m), bdp, t;

	if (!base || !m->f.bw)
		return w->cwnd;
	bdp = segs_in(a, m->f.bw, base);
	switch (m->phase) {
	case SAT_DRAIN:
		t = bdp * DRAIN_GAIN_PCT / 100;
		break;
	case SAT_CRUISE:
		t = bdp + segs_in(a, m->f.bw, slack_us(m, a));
		break;
	case SAT_PROBE:
		t = bdp + segs_in(a, m->f.bw, slack_us(m, a)) + m->grow.probe_extra;
		break;
	default:
		return w->cwnd;
	}
	return max(t, MIN_CWND);
}

/* The competitive mode's least window: half the link's rate over the RTT now, raised by the
 * share of its segments the full buffer drops (what is dropped never arrives: a paced sender
 * loses more at a drop-tail buffer kept full than a window-clocked competitor), by 1 / 0.7 at
 * most. */
SAT_FN u32 fair_share(const struct sat_model *m, const struct sat_ack *a)
{
	u64 s = segs_in(a, m->f.bw_peak / 2, a->srtt_us);

	s = s * 256 / (256 - min((u32)m->comp.loss, COMPETE_LOSS_MAX));
	return max((u32)min(s, 0xffffffffULL), MIN_CWND);
}

/* Cube root of x (to within one), x below 2^51, by Newton's method from above: 2^17 is
 * above any root, each step at least a third closer, 24 steps reach roots down to 1. No
 * branch on the running value, so the verifier walks the steps once (a bisection's
 * branches on known bounds made it walk 2^21 paths). */
SAT_GLOBAL u32 sat_cbrt(u64 x)
{
	u64 r = 1 << 17;

	if (x >= 1ULL << 51)
		return 1 << 17;
	SAT_UNROLL
	for (int i = 0; i < 24; i++)
		r = (2 * r + x / (r * r | 1)) / 3;
	return (u32)r;
}

/* The integer square root of x < 2^32, from above (Newton), as sat_cbrt: fixed steps, no
 * branch on the running value. */
SAT_GLOBAL u32 sat_sqrt(u32 x)
{
	u64 r = 1 << 16;

	SAT_UNROLL
	for (int i = 0; i < 22; i++)
		r = (r + x / (r | 1)) / 2;
	return (u32)r;
}

/* When CUBIC's curve from `cwnd` gets back to `w_max`, ms (RFC 9438: K = cbrt((w_max -
 * cwnd) / C), C = 0.4 segments/s^3). */
SAT_GLOBAL u32 sat_cubic_k(u32 w_max, u32 cwnd)
{
	if (w_max <= cwnd)
		return 0;
	/* x 10^9 / 0.4: s^3 to ms^3 */
	return sat_cbrt((u64)(w_max - cwnd) * 2500000000ULL);
}

/* The window the curve calls for `t_ms` after its start, segments (RFC 9438: W(t) =
 * C (t - K)^3 + w_max). */
SAT_GLOBAL u32 sat_cubic_target(u32 t_ms, u32 k_ms, u32 w_max)
{
	s64 d = (s64)t_ms - k_ms;
	u64 x = d < 0 ? -d : d, off;

	if (x > 1000000) /* 1000 s: beyond any epoch, and no overflow below */
		x = 1000000;
	off = x * x * x * 4 / 10000000000ULL;
	if (d >= 0)
		return off > 0xffffff ? 0xffffff + w_max : w_max + (u32)off;
	return off >= w_max ? 0 : w_max - (u32)off;
}

/* CUBIC's growth towards `target` for `acked` segments: at most x1.5 a round, at least
 * Reno's segment a round. Returns the window << 32 | the growth not yet applied. */
SAT_GLOBAL u64 sat_cubic_grow(u32 cwnd, u32 cnt, u32 acked, u32 target)
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

/* The competitive mode's curve restarts from the window now towards `w_max`. */
SAT_FN void cubic_epoch(struct sat_model *m, struct sat_window *w, const struct sat_ack *a,
			u32 w_max)
{
	m->comp.w_max = w_max;
	m->comp.epoch_ms = now_ms(a);
	m->comp.k_ms = sat_cubic_k(w_max, w->cwnd);
	w->cnt = 0;
}

SAT_FN void set_bw(struct sat_model *m, u32 bw)
{
	m->f.bw = bw;
	max2_reset(&m->f.rate, bw);
}

SAT_FN void enter(struct sat_model *m, struct sat_window *w, const struct sat_ack *a, u8 phase)
{
	bool ramp = phase == SAT_CRUISE || phase == SAT_PROBE;
	u32 t;

	if (phase == SAT_DRAIN && m->phase != SAT_DRAIN)
		m->drain.cut_from = w->cwnd;
	m->drain.after_start = phase == SAT_DRAIN && m->phase == SAT_START;
	m->drain.busy = phase == SAT_DRAIN && (m->r.reacted || m->phase == SAT_DRAIN);
	m->phase = phase;
	m->phase_rounds = 0;
	m->grow.idle_rounds = 0;
	if (phase == SAT_DRAIN) {
		m->drain.began_us = (u32)a->now_us;
		m->drain.delivered = a->delivered;
		m->drain.min_rtt = SAT_NONE;
		m->drain.acked = 0;
		m->drain.lost = 0;
		m->drain.events = 0;
		m->drain.first_us = 0;
		m->drain.early = 0;
	}
	t = target(m, w, a);
	/* Down at once; up gradually (set_window), or the window leaves as a burst. */
	if (!(ramp && t > w->cwnd))
		w->cwnd = max(min(t, w->clamp), MIN_CWND);
}

/* Regrowth from the highest rate yet, or from well below it (a fade or a step ended). */
#define REGROW_AT_PEAK 1
#define REGROW_BELOW_PEAK 2

/* The model is under `num`/`den` of the highest rate yet, which the link served lately:
 * under half, one probe that found room regrows at once (PROBE); under nine tenths,
 * regrowth doubles (`regrow`); under four fifths, one idle round regrows (`end_round`). */
SAT_FN bool below_peak(const struct sat_model *m, u32 num, u32 den)
{
	return (u64)m->f.bw * den < (u64)m->f.bw_peak * num;
}

/* The link is faster than the model: grow again (x2 to x1.125 a round, update_phase). */
SAT_FN void regrow(struct sat_model *m, struct sat_window *w, const struct sat_ack *a)
{
	m->grow.regrowth = below_peak(m, 9, 10) ? REGROW_BELOW_PEAK : REGROW_AT_PEAK;
	m->grow.ref_bw = m->f.bw;
	m->grow.from_peak = m->f.bw_peak;
	m->grow.full_rounds = 0;
	enter(m, w, a, SAT_START);
}

/* The channel slows a link this much at most: DVB-S2's modulations and codes span about
 * 9x (QPSK 1/4 to 32APSK 9/10), and a deeper fade is an outage, which delivers nothing. */
#define FADE_DEPTH 8U

/* Cuts have taken the rate below the deepest fade while queues kept coming back: not the
 * channel but another sender, whose window holds the queue whatever this one sends. Seed
 * 40's L01 (3.4 Mbit/s GEO, a cubic download beside): drains whose queue shrank as a fade's
 * does, because the competitor's curve happened to fall, cut the tunnel to 71 kbit/s; on the
 * simulator the same link's drains ended "clean" at cubic's low points and reaction after
 * reaction cut the model to 7 % of the link. */
SAT_FN bool beyond_fades(const struct sat_model *m)
{
	return m->f.bw_peak && (u64)m->f.bw * FADE_DEPTH < m->f.bw_peak;
}

/* Another sender keeps the buffer full: compete. Start from half of what the link carried,
 * not from where the cuts took the rate, and undo the drains' cuts as CUBIC would have lost
 * one back-off there, with the curve heading back to the window before them. */
SAT_FN void start_competing(struct sat_model *m, struct sat_window *w, const struct sat_ack *a)
{
	u32 base = base_us(m), queue = queue_us(m);
	u32 share = segs_in(a, m->f.bw_peak, base + queue) / 2;
	u32 from = m->drain.cut_from;

	w->cwnd = max(max(segs_in(a, m->f.bw, base + queue), share), MIN_CWND);
	w->cwnd = max(w->cwnd, from / 10 * 7);
	m->comp.loss = 0;
	m->comp.full_us = 0;
	m->comp.at_full = 0;
	m->comp.short_backoffs = 0;
	enter(m, w, a, SAT_COMPETE);
	cubic_epoch(m, w, a, max(from, w->cwnd));
}

/* What began the drains, for `path_lengthened`: the queue, and the rate before any cut. */
SAT_FN void remember_reaction(struct sat_model *m)
{
	m->drain.react_queue_us = queue_us(m);
	m->drain.react_bw = m->f.bw;
}

/* The queue is too long: the rate is what the bottleneck serves now; drain the queue. */
SAT_FN void react(struct sat_model *m, struct sat_window *w, const struct sat_ack *a)
{
	u32 by_rtt, measured;

	m->r.reacted = 1;
	m->drain.testing = 0;
	if (m->phase != SAT_DRAIN)
		remember_reaction(m);
	if (m->phase == SAT_START) {
		set_bw(m, max(m->f.bw, m->r.bw));
	} else {
		by_rtt = rate_at_queue(m, w, a);
		measured = max(m->r.bw, 1U);
		set_bw(m, min(min(m->f.bw, by_rtt), max(measured, by_rtt / 2)));
		if (beyond_fades(m)) {
			start_competing(m, w, a);
			return;
		}
	}
	if (!m->f.bw) {
		w->cwnd = max(w->cwnd / 2, MIN_CWND);
		return;
	}
	enter(m, w, a, SAT_DRAIN);
}

/* A drain ended: its segments' losses are the channel's alone, unless it lost more than a
 * quarter of them in many separate losses. No channel loses that much for long (see
 * `dropping`), and its bursts come whole: that drain met a full buffer (a competitor's
 * start beside its own, or the last drops of the window before it, which a kernel host
 * marks late), and taken for noise it read a LEO link with a 9 ms buffer as losing 50 %
 * (split.csv, seed 39's L06), the rate, scaled up by the noise, overflowed the buffer
 * again, and the competitor kept 16 % of its share. */
SAT_FN void fold_clean_noise(struct sat_model *m)
{
	u32 total, lost = m->drain.lost;

	if (lost > (m->drain.acked - m->drain.early + lost) / 4 &&
	    m->drain.events >= DROPPING_EVENTS)
		return;
	m->noise.acked += m->drain.acked - m->drain.early;
	m->noise.lost += m->drain.lost;
	m->noise.events += m->drain.events;
	total = m->noise.acked + m->noise.lost;
	/* Older drains weigh half once 4 000 segments are counted: the estimate follows a
	 * channel that changes, over a few thousand segments. */
	if (total > NOISE_MEMORY) {
		m->noise.acked /= 2;
		m->noise.lost /= 2;
		/* Rounded up: a burst halved to no event would read as losses one by one. */
		m->noise.events = (m->noise.events + 1) / 2;
		total = m->noise.acked + m->noise.lost;
	}
	if (!total)
		return;
	m->noise.clean_ppm = (u32)((u64)m->noise.lost * USEC_PER_SEC / total);
	/* Measured, once enough segments are counted to tell a shallow buffer's losses from
	 * the channel's: one drain of a thin link's short window (17 segments at 11 % loss) saw
	 * none lost one time in seven, and every round after it read as lossy. */
	if (total >= NOISE_MEASURED && m->noise.drains < 255)
		m->noise.drains++;
}

/* The most of the round's losses the channel's noise explains beside `acked` deliveries:
 * the expected count, three standard deviations and two bursts. Losses in bursts of mean
 * length b (Gilbert-Elliott: rain, interference) vary far more than one by one: a round's
 * count is a Poisson number of bursts of geometric length, variance expected x (2b - 1).
 * Read as independent, a LEO link losing 1.4 % in bursts of 25 "overflowed a shallow
 * buffer" every few seconds, simulated: a 780 ms buffer taken for 3 ms, and a slack of
 * 1.5 ms that could not follow the path's RTT as it rose (the rate fell by a third). */
SAT_FN u32 noise_bound(u32 acked, u32 noise_ppm, u32 burst)
{
	u32 expected = (u32)((u64)acked * noise_ppm / (USEC_PER_SEC - noise_ppm));

	return expected + 3 * sat_sqrt((u32)min((u64)expected * (2 * burst - 1), 0xffffffffULL)) +
	       2 * burst;
}

/* The channel's mean burst of losses, segments (1: independent), as the drains saw it. */
SAT_FN u32 noise_burst(const struct sat_model *m)
{
	if (!m->noise.events || m->noise.lost <= m->noise.events)
		return 1;
	return min(m->noise.lost / m->noise.events, BURST_MAX);
}

SAT_FN u32 min_rtt_span_us(const struct sat_model *m)
{
	return max(MIN_RTT_SPAN_US, base_us(m) * MIN_RTT_ROUNDS);
}

/* A drain tested for a longer path within the base RTT's span: no test again yet. */
SAT_FN bool tested_lately(const struct sat_model *m, const struct sat_ack *a)
{
	return m->drain.tested_ms && now_ms(a) - m->drain.tested_ms < min_rtt_span_us(m) / 1000;
}

/* More queue than the window's slack can hold (and the mark's jitter above it). */
SAT_FN u32 beyond_slack_us(const struct sat_model *m, const struct sat_ack *a)
{
	return slack_us(m, a) + queue_mark_us(m, a);
}

/* The path grew longer (a LEO handover, a rerouted terrestrial leg), and no queue stands: the
 * drain took segments out of flight that would have shortened a queue of this sender's by
 * `expect` at the rate before the cut, and the lowest RTT of its own segments shows the queue
 * shrank by less than half of that, without growing. Read as a queue, the RTT a handover
 * adds cut the rate drain after drain, each drain's window sized by the old base RTT (seed
 * 39's L06: LEO 183 Mbit/s, 28 -> 49 ms at a handover; 126 -> 15 Mbit/s in 0.2 s, then the
 * competitive mode with the old base for 20 s; 71 % of the limit on the simulator). A queue
 * that grew in the drain is a link serving less than the drain sends. Another sender's queue
 * does not shrink either: an overflow, a queue more than this sender's window could hold, or
 * a second such drain within the base RTT's span leaves it to the drains' usual evidence;
 * and a competitor's queue that falls later lowers the base again at once (a minimum). */
SAT_FN bool path_lengthened(const struct sat_model *m, const struct sat_window *w,
			    const struct sat_ack *a, u32 left)
{
	u32 out, expect;

	/* A drain that lost more than the noise met a full buffer; more queued than twice the
	 * window before the cut could hold is another sender's. Not the overflow mark (a loss
	 * with a long queue): with the base RTT short by the path's growth, every random loss
	 * met "a long queue". */
	if (m->drain.lost > noise_bound(m->drain.acked, min(m->noise.clean_ppm, NOISE_MAX_PPM),
					 noise_burst(m)) ||
	    (u64)m->drain.react_bw * m->drain.react_queue_us / USEC_PER_SEC >
		    2ULL * m->drain.cut_from * a->mss)
		return false;
	if (m->drain.undrained || !m->drain.react_bw || m->comp.checking || tested_lately(m, a))
		return false;
	out = m->drain.cut_from > w->cwnd ? m->drain.cut_from - w->cwnd : 0;
	expect = (u32)min((u64)out * (a->mss + FRAME_OVERHEAD) * USEC_PER_SEC / m->drain.react_bw,
			  (u64)USEC_PER_SEC);
	/* Grown: by more than the RTT's jitter of a millisecond, or a quarter of the mark. */
	return expect >= 2 * queue_mark_us(m, a) && left + expect / 2 >= m->drain.react_queue_us &&
	       max(left, queue_us(m)) <=
		       m->drain.react_queue_us + max(queue_mark_us(m, a) / 4, USEC_PER_MSEC);
}

/* The base RTT is the drain's lowest now, and the rate what it was before the cuts. */
SAT_FN void rebase(struct sat_model *m, struct sat_window *w, const struct sat_ack *a)
{
	min2_reset(&m->f.base, now_ms(a));
	min2_update(&m->f.base, now_ms(a), m->drain.min_rtt, min_rtt_span_us(m) / 2000);
	set_bw(m, max(m->f.bw, m->drain.react_bw));
	m->drain.tested_ms = now_ms(a) | 1;
	m->drain.undrained = 0;
	enter(m, w, a, SAT_CRUISE);
}

SAT_STEP end_drain(struct sat_model *m, struct sat_window *w, const struct sat_ack *a)
{
	SAT_ARGS(m && w && a);
	u32 base = base_us(m), queue = queue_us(m), by_rtt;
	bool overflow = m->drain.overflow, testing = m->drain.testing, foreign;

	m->drain.ended_ms = now_ms(a);
	m->drain.overflow = 0;
	m->drain.testing = 0;
	m->comp.checking = 0;
	fold_clean_noise(m);
	/* Left more than the window's slack could queue, and not ours: the path grew. Also
	 * within the margin: the window, sized by the old base RTT, no longer covers it. */
	if (m->drain.min_rtt != SAT_NONE &&
	    m->drain.min_rtt > base + beyond_slack_us(m, a) &&
	    path_lengthened(m, w, a, m->drain.min_rtt - base)) {
		rebase(m, w, a);
		return 0;
	}
	/* Only the first drain after a reaction can tell: later ones began below the rate. */
	m->drain.react_bw = 0;
	if (testing) {
		/* Not a longer path, and no reaction: as it was, and no test for a span. */
		m->drain.tested_ms = now_ms(a) | 1;
		enter(m, w, a, SAT_CRUISE);
		return 0;
	}
	if (m->drain.min_rtt == SAT_NONE || m->drain.min_rtt <= base + margin_us(m, a)) {
		/* Drained, but a buffer that overflowed under a window this small was filled
		 * by another sender, which backed off meanwhile: the evidence stays. */
		if (!overflow)
			m->drain.undrained = 0;
		enter(m, w, a, SAT_CRUISE);
		return 0;
	}
	/* A queue that shrinks from drain to drain is one the cuts are catching up with (a link
	 * slowing step by step, as in a rain fade): no sign of another sender, unless the
	 * buffer overflowed. */
	if (m->drain.undrained < 255 &&
	    (!m->drain.undrained || overflow || queue >= m->drain.left_us * 3 / 4))
		m->drain.undrained++;
	m->drain.left_us = queue;
	/* More queued (at the fastest rate the link ever had) than this sender has in flight. */
	foreign = overflow ||
		  (u64)m->f.bw_peak * queue / USEC_PER_SEC > 2ULL * w->cwnd * a->mss;
	/* Three drains with that evidence, not two: the first drains after a rate step meet
	 * the queue this sender built before it, full enough to overflow beside constant-rate
	 * traffic (seed 39's L11: 1.9 Mbit/s of UDP on a 5.1 Mbit/s link stepping to 3.6),
	 * and two of them made the model compete with a flow that never yields. */
	if ((m->drain.undrained >= 3 && foreign) || m->drain.undrained >= 4) {
		start_competing(m, w, a);
		return 0;
	}
	/* The rate estimate is still too high: cut by what the queue says, 1/7 at least and
	 * half at most, and drain again. */
	by_rtt = rate_at_queue(m, w, a);
	set_bw(m, min(m->f.bw - m->f.bw / 7, max(by_rtt, m->f.bw / 2)));
	if (beyond_fades(m))
		start_competing(m, w, a);
	else
		enter(m, w, a, SAT_DRAIN);
	return 0;
}

/* The round so far lost more than the channel's noise explains, `noise_ppm` of segments:
 * more segments, and in more separate losses (ACKs that reported some). A buffer that
 * overflows under a paced window drops a segment here and there, each found apart; the
 * channel's bursts come whole. Counted in segments alone, one clean drain (no burst in
 * its 1 000 segments: one time in two on that LEO link) measured no noise, and the next
 * two rounds with a burst each met "a shallow buffer". */
SAT_FN bool beyond_noise(const struct sat_model *m, u32 noise_ppm)
{
	u32 acked = max(m->r.acked, 1U);
	u32 seen = m->noise.acked + m->noise.lost;
	u32 events_ppm = seen ? (u32)((u64)m->noise.events * USEC_PER_SEC / seen) : 0;

	return m->r.lost > noise_bound(acked, noise_ppm, noise_burst(m)) &&
	       m->r.events > noise_bound(acked, min(events_ppm, NOISE_MAX_PPM), 1);
}

/* The round's rate sample with the channel's noise counted in (the bottleneck served the
 * lost segments too): the round's own losses, up to what the noise explains, the rest a
 * bottleneck dropping what exceeds its rate. Scaling every sample by 1 / (1 - the mean
 * noise) instead read a T1 losing one segment in nine a few % fast in rounds that lost
 * fewer than the mean, the max filter kept those, and the excess stood in the queue (lab,
 * T1 at BER 1e-5, 8 runs each: the probe's queue p95 57-97 ms before, 33-58 ms after). */
SAT_FN u64 crossed(const struct sat_model *m, u32 noise_ppm)
{
	u32 acked = max(m->r.acked, 1U);
	/* One by one: losses credited beyond that would be a competitor's overflows too. */
	u32 credit = min(m->r.lost, noise_bound(acked, noise_ppm, 1));

	return (u64)m->r.bw * (acked + credit) / acked;
}

/* The noise a shallow buffer's losses must exceed: the drains' measure, or what their
 * segments cannot tell from none, whichever is more (three losses more: the rule of
 * three's 95 % bound on a count of none). A clean drain of a few hundred segments on a
 * link losing 0.36 % of them (one drain in two at 240 Mbit/s over 32 ms) measured no
 * noise, the next two rounds' random losses read as overflows with no queue, and a 1 s
 * buffer became "0.7 ms": split held 58 % of the limit there (corpus seed 45, L07). */
SAT_FN u32 noise_upper_ppm(const struct sat_model *m)
{
	u32 total = m->noise.acked + m->noise.lost;

	if (!total)
		return NOISE_MAX_PPM;
	return max(m->noise.clean_ppm,
		   (u32)((u64)(m->noise.lost + 3) * USEC_PER_SEC / (total + 3)));
}

/* The round's queue stayed short of what its losses would have needed from a buffer as
 * deep as the slack. In CRUISE the queue stands at about the slack: losses with less than
 * three quarters of it met a buffer shallower than the slack. A probe, or growth after the
 * start, pushes the queue above the slack on purpose: losses there with less than the
 * budget met a buffer between the two (a 22 ms buffer under a 30 ms budget lost 4 % of the
 * packets to probes and regrowth, simulated, without ever showing the budget's queue). */
SAT_FN bool short_queue(const struct sat_model *m, const struct sat_ack *a)
{
	bool pushing = m->phase == SAT_PROBE || (m->phase == SAT_START && m->grow.regrowth);
	u32 ceiling = pushing ? budget_us(m, a) : slack_us(m, a) * 3 / 4;

	return (m->phase == SAT_CRUISE || pushing) && m->r.read && m->r.max_queue < ceiling;
}

/* The buffer is shallower than the slack: the round's highest queue is its depth (four
 * segments' time at least). */
SAT_FN void know_buffer(struct sat_model *m, const struct sat_ack *a)
{
	m->noise.buffer_us = max(m->r.max_queue, segs_time(m, a, 4));
}

/* Shallow buffer: a round that lost more than the channel's noise explains (the noise as
 * drains measured it: a drain's window is below the path's, so no buffer overflows then),
 * though its queue never reached three quarters of the slack the window keeps, met a buffer
 * that holds less than that slack: it overflows every round and the budget is never reached
 * (the tunnel's controller found this first; 5 ms buffers are common at gateways). Two such
 * rounds in a row make the queue they saw the buffer's depth. */
SAT_STEP learn_buffer(struct sat_model *m, const struct sat_ack *a)
{
	SAT_ARGS(m && a);
	u32 total = m->r.acked + m->r.lost;
	bool lossy = m->noise.drains && total >= 8 &&
		     beyond_noise(m, min(noise_upper_ppm(m), NOISE_MAX_PPM));

	if (!lossy || !short_queue(m, a)) {
		m->noise.shallow_rounds = 0;
		return 0;
	}
	if (++m->noise.shallow_rounds < SHALLOW_ROUNDS)
		return 0;
	m->noise.shallow_rounds = 0;
	know_buffer(m, a);
	return 0;
}

SAT_STEP end_round(struct sat_model *m, struct sat_window *w, const struct sat_ack *a)
{
	SAT_ARGS(m && w && a);
	u32 base = base_us(m), noise = min(m->noise.clean_ppm, NOISE_MAX_PPM);
	u32 total = m->r.acked + m->r.lost;
	u64 sample = min(crossed(m, noise), 0xffffffffULL);
	/* The rate the next round's window and pacing followed: this round's sample may
	 * raise it. */
	u32 bw_before = m->f.bw;
	/* A round that filled its window (lost segments count: an overflow filled it too). */
	bool filled = !m->r.app_limited && total >= m->r.cwnd / 2;
	bool idle, stood;
	u8 idle_enough;

	learn_buffer(m, a);
	if (m->phase == SAT_COMPETE && total >= 30) {
		u32 s = min((u32)((u64)m->r.lost * 256 / total), 255U);
		u32 l = m->comp.loss;

		m->comp.loss = s >= l ? l + (s - l) / 4 : l - (l - s) / 4;
	}
	if (sample && (filled || sample > m->f.bw))
		max2_sample(&m->f.rate, (u32)sample);
	m->f.bw = max2_get(&m->f.rate);
	max2_end_round(&m->f.rate, BW_BLOCK_ROUNDS);
	/* Not from the competitive mode or the drain that checks whether the competitor left:
	 * beside a full buffer their samples read high (a 3.4 Mbit/s link at 4.1, simulated),
	 * and the fair share would grow with them. */
	if (m->phase != SAT_COMPETE && !m->comp.checking)
		m->f.bw_peak = max(m->f.bw_peak, m->f.bw);
	/* A round that carried enough to queue half as much again as the mark at the model's
	 * rate met no queue at all: the model is too slow (a fade ended, other traffic left, a
	 * drain cut too deep). What the round carried, not the window: a window climbing back
	 * to its slack after a drain, or a sender paced at the model's rate, queues nothing at
	 * the matched rate either (over an 8 ms buffer, paced at 1.05 x, at 1 Gbit/s over 5 ms:
	 * such rounds looked idle, regrowth followed every few rounds and overflowed the
	 * buffer). A shallow buffer shows no queue even when the window is too large, but then
	 * it overflows: there the round must also have lost no more than the channel's noise.
	 * (Probes alone found the rate there: of a 240 Mbit/s link whose fade the start met,
	 * 6 ms buffer, 720 ms RTT, the model held a third for 20 s, simulated; 91 % with
	 * this.) */
	idle = filled && (m->phase == SAT_CRUISE || m->phase == SAT_PROBE) &&
	       (!m->noise.buffer_us ||
		(m->noise.drains && total >= 8 && !beyond_noise(m, noise))) &&
	       total >= segs_in(a, m->r.start_bw, base + queue_mark_us(m, a) * 3 / 2) &&
	       m->r.read && !m->r.queued;
	/* Under four fifths of the peak (a fade or a step ended, traffic beside left), one idle
	 * round is enough: the path carried the peak lately, and each round waited at a GEO
	 * RTT is 0.6 s at a fraction of the link (a GEO link halved and whole again: 84.5 %
	 * of it over the 6 s after with two rounds, 88.1 % with one, simulated). At the
	 * matched rate the slack's queue shows in every round, so no idle round comes of a
	 * link that stepped down for good. */
	idle_enough = below_peak(m, 4, 5) ? 1 : 2;
	/* A queue the whole round stood above what the window can hold (its slack), and the
	 * round delivered well under the model: the window no longer covers the path. A longer
	 * path (a LEO handover within the budget, 15 ms on seed 39's L06) did that, and the rate
	 * filter followed the window down for the base filter's 2 s span (126 -> 26 Mbit/s,
	 * simulated); so did a link that slowed. A drain tells which (`path_lengthened`). */
	stood = filled && (m->phase == SAT_CRUISE || m->phase == SAT_PROBE) && !m->r.reacted &&
		!tested_lately(m, a) && m->r.min_queue != SAT_NONE &&
		m->r.min_queue > beyond_slack_us(m, a) &&
		sample < bw_before - bw_before / 8;
	m->r.acked = 0;
	m->r.lost = 0;
	m->r.events = 0;
	/* Outside the start the latest sample stays until the next one: a queue met on the
	 * ACK that ends a round would otherwise read a rate of zero and cut the model to half
	 * of what the window delivers. */
	if (m->phase == SAT_START)
		m->r.bw = 0;
	m->r.cwnd = w->cwnd;
	m->r.start_bw = bw_before;
	m->r.app_limited = 0;
	m->r.reacted = 0;
	m->r.read = 0;
	m->r.queued = 0;
	m->r.max_queue = 0;
	m->r.min_queue = SAT_NONE;
	m->grow.resumed = 0;
	if (m->phase_rounds < 255)
		m->phase_rounds++;
	m->grow.idle_rounds = idle ? min(m->grow.idle_rounds + 1, 255) : 0;

	if (stood) {
		/* One drain at the model's rate tests it; a link that slowed is the usual
		 * reactions' (the queue passes the budget), and a test that finds no longer path
		 * leaves the model as it was (beside a competitor whose losses refuse the test,
		 * a cut here and the drains after it made the tunnel compete at each handover
		 * of seed 39's L06 in the lab). */
		remember_reaction(m);
		/* Entered before the round counts as reacted: not `busy`, so its reading of the
		 * rate lowers nothing either (`drain_reading`). */
		enter(m, w, a, SAT_DRAIN);
		m->r.reacted = 1;
		m->drain.testing = 1;
		return 0;
	}
	switch (m->phase) {
	case SAT_START:
		if (!filled)
			break;
		if (m->f.bw >= m->grow.ref_bw + m->grow.ref_bw / 4) {
			m->grow.ref_bw = m->f.bw;
			m->grow.full_rounds = 0;
		} else if (++m->grow.full_rounds >= 3) {
			enter(m, w, a, SAT_DRAIN);
		}
		break;
	case SAT_CRUISE:
		if (m->grow.idle_rounds >= idle_enough) {
			regrow(m, w, a);
		} else if (m->phase_rounds >= CRUISE_ROUNDS) {
			m->grow.ref_bw = m->f.bw;
			m->grow.probe_wins = 0;
			m->grow.probe_extra = max(segs_in(a, m->f.bw, slack_us(m, a)) / 2, 2U);
			enter(m, w, a, SAT_PROBE);
		}
		break;
	case SAT_PROBE:
		if (m->grow.idle_rounds >= idle_enough) {
			regrow(m, w, a);
		} else if (m->phase_rounds >= 2) {
			/* The extra could add extra / BDP to the rate: half of that (1 % at least)
			 * says there was room. */
			u64 bdp = max(segs_in(a, m->grow.ref_bw, base), 1U);
			u64 share = max((u64)m->grow.probe_extra * 1000000 / bdp / 2, 10000ULL);
			bool grew = (u64)m->f.bw * 1000000 > (u64)m->grow.ref_bw * (1000000 + share);

			/* Far below the peak, one win says a fade ended or a competitor left:
			 * regrow at once. A shallow buffer shows no idle round, so probes alone
			 * find the rate again, and 5 % a probe took seed 39's L07 (78 Mbit/s
			 * faded to 20 and back, 16 ms buffer) 8 s to regain half of it. */
			bool far_below = below_peak(m, 1, 2);

			if (grew && m->grow.probe_wins < 2 && !far_below) {
				m->grow.probe_wins++;
				m->grow.ref_bw = m->f.bw;
				m->grow.probe_extra *= 2;
				m->phase_rounds = 1;
			} else if (grew) {
				w->cwnd = max(target(m, w, a), MIN_CWND);
				regrow(m, w, a);
			} else if (now_ms(a) - m->drain.ended_ms > min_rtt_span_us(m) / 2000) {
				/* The base RTT was last sampled long ago: a drain samples it. */
				enter(m, w, a, SAT_DRAIN);
			} else {
				enter(m, w, a, SAT_CRUISE);
				/* The probe's extra is still queued for one round: not a slower
				 * link. */
				m->r.reacted = 1;
			}
		}
		break;
	case SAT_COMPETE:
		if (m->phase_rounds >= CRUISE_ROUNDS &&
		    now_ms(a) - m->drain.ended_ms >= COMPETE_AT_LEAST_MS) {
			/* Has the competitor left? A drain at our share tells. The base RTT from
			 * before it is what the drain compares with: competing did not age it. */
			set_bw(m, rate_at_queue(m, w, a));
			m->comp.checking = 1;
			m->drain.undrained = 2;
			m->f.base.stamp = now_ms(a);
			enter(m, w, a, SAT_DRAIN);
		}
		break;
	}
	return 0;
}

/* Step 1: one RTT sample (us) into the base RTT filter and the queue reading. */
SAT_STEP update_rtt(struct sat_model *m, const struct sat_ack *a)
{
	SAT_ARGS(m && a);
	u32 t = now_ms(a), q;

	if (a->rtt_us <= 0)
		return 0;
	/* Not against a competitor, whose queue never empties: the full buffer's RTT would
	 * become the base, and the drain that checks whether it left would find no queue. */
	if (m->phase != SAT_COMPETE)
		min2_update(&m->f.base, t, (u32)a->rtt_us, min_rtt_span_us(m) / 2000);
	min2_update(&m->f.recent, t, (u32)a->rtt_us,
		    max(RECENT_MIN_US, base_us(m) / RECENT_SHARE) / 2000);
	if (m->f.recent.n >= 3) {
		q = queue_us(m);
		m->r.max_queue = max(m->r.max_queue, q);
		m->r.min_queue = min(m->r.min_queue, q);
	}
	return 0;
}

/* Step 2: the ACK's deliveries, losses and rate sample into the round; the round's end
 * updates the model and the phase. */
SAT_STEP update_round(struct sat_model *m, struct sat_window *w, const struct sat_ack *a)
{
	SAT_ARGS(m && w && a);
	/* Whether the round met a queue is read through it, not at its last ACK: a window
	 * smaller than the link leaves a gap before each round, and the ACK that ends the round
	 * comes after that gap, with too few samples in the reading's span to count. */
	if (m->f.recent.n >= 3) {
		m->r.read = 1;
		if (queue_us(m) >= queue_mark_us(m, a))
			m->r.queued = 1;
	}
	m->r.acked += a->acked;
	m->r.lost += a->losses;
	if (a->losses)
		m->r.events++;
	if (a->app_limited)
		m->r.app_limited = 1;
	if (a->rs_delivered > 0 && a->interval_us > 0) {
		u64 s = (u64)a->rs_delivered * a->mss * USEC_PER_SEC / (u64)a->interval_us;

		s = min(s, 0xffffffffULL);
		/* The latest sample, not the round's highest: each spans about a round, and the
		 * highest of a round's many read the link 2-3 % fast, which then stood as 15 ms
		 * of queue on a GEO path. In the start the highest: the rate doubles within a
		 * round, and the start ends on what the last of it delivered. */
		if (!a->app_limited || s > m->f.bw)
			m->r.bw = m->phase == SAT_START || m->drain.after_start ?
					  max(m->r.bw, (u32)s) : (u32)s;
	}
	/* What was sent in the drain: its RTTs, deliveries and losses (a host may report
	 * losses without an RTT sample: quinn declares them apart from its ACKs). */
	if (m->phase == SAT_DRAIN && (s32)(a->prior_delivered - m->drain.delivered) >= 0) {
		/* The first ACKs of what the drain sent also show the drops of what was sent
		 * before it: the kernel marks a segment lost once one sent after it is delivered
		 * (RACK), so the last drops of a window that overflowed the buffer show on the
		 * drain's ACKs, within a reordering window (a quarter of the base RTT) of its
		 * first. Counted as the channel's, they read a 1 Gbit/s link with an 8 ms buffer
		 * as losing 7 % in bursts of 20 (split.csv), and the buffer was never found. So
		 * the noise is read after that window, deliveries and losses alike, unless the
		 * host dates its losses by their own send time (then `prior_delivered` already
		 * leaves out what was sent before the drain). */
		bool settled = a->losses_dated || (m->drain.first_us &&
			       (u32)a->now_us - m->drain.first_us > base_us(m) / 4);

		if (a->rtt_us > 0) {
			m->drain.min_rtt = min(m->drain.min_rtt, (u32)a->rtt_us);
			m->drain.acked += a->acked;
			if (!m->drain.first_us)
				m->drain.first_us = (u32)a->now_us | 1;
			if (!settled)
				m->drain.early += a->acked;
		}
		if (a->losses && settled) {
			m->drain.lost += a->losses;
			m->drain.events++;
		}
	}
	if (a->rs_delivered >= 0 && a->interval_us > 0 &&
	    (s32)(a->prior_delivered - m->r.next) >= 0) {
		m->r.next = a->delivered;
		end_round(m, w, a);
	}
	return 0;
}

/* DRAIN's reading of the rate: what was sent before it comes back at the rate the busy
 * bottleneck serves now, read over its first ACKs while they still show a queue (the
 * start's last round, sent at twice the rate, does for an RTT). The host's samples span an
 * RTT of ACKs, most of them from before: after the start they describe the round before,
 * after a step down in rate the faster link. After the start the reading raises the model,
 * and lowers it only to a link that serves under half of it; after a queue it only lowers
 * it. */
SAT_STEP drain_reading(struct sat_model *m, struct sat_window *w, const struct sat_ack *a)
{
	SAT_ARGS(m && w && a);
	u32 span, noise;
	bool queued, raise, faded, slower;
	u64 r;

	if (!(m->drain.after_start || m->drain.busy) ||
	    (s32)(a->prior_delivered - m->drain.delivered) >= 0)
		return 0;
	span = (u32)a->now_us - m->drain.began_us;
	if (span < max(RECENT_MIN_US, base_us(m) / RECENT_SHARE))
		return 0;
	queued = a->rtt_us > 0 && (u32)a->rtt_us >= base_us(m) + slack_us(m, a) / 2;
	if (!m->drain.after_start && !queued)
		return 0;
	noise = min(m->noise.clean_ppm, NOISE_MAX_PPM);
	r = (u64)(a->delivered - m->drain.delivered) * a->mss * USEC_PER_SEC / span;
	/* Lost segments used the link too. */
	r = r * USEC_PER_SEC / (USEC_PER_SEC - noise);
	/* After the start, lower only to a link that serves under half of what the start
	 * measured while a queue above the budget stands, read over half a base RTT at least
	 * (a fade met the start's end: seed 42's L11, where the drain held the start's window
	 * for 6 s and the queue grew to a second). A 1.1 Mbit/s upload (seed 39's L12) read
	 * under half with the 30-45 ms a few packets queue there, its window below the path's,
	 * and the tunnel stayed at half the link for 20 s. Lowered by half the model at most,
	 * as every other cut: the reading is taken on every ACK of the drain's first round,
	 * and the lowest of many short spans reads low when ACKs come in bursts (QUIC's ACK
	 * frames: the tunnel's model fell from 130 to 10 Mbit/s in one drain beside a
	 * competitor's start). */
	raise = m->drain.after_start && r > m->f.bw;
	faded = m->drain.after_start && r < m->f.bw / 2 && span >= base_us(m) / 2 &&
		a->rtt_us > 0 && (u32)a->rtt_us >= base_us(m) + budget_us(m, a);
	slower = !m->drain.after_start && queued && r < m->f.bw;
	if (!(raise || faded || slower))
		return 0;
	if (r < m->f.bw)
		r = max(r, (u64)m->f.bw / 2);
	if (r && r < 0xffffffffULL) {
		set_bw(m, (u32)r);
		w->cwnd = max(target(m, w, a), MIN_CWND);
	}
	return 0;
}

/* COMPETE's window: CUBIC's, with a floor at the fair share. */
SAT_STEP compete(struct sat_model *m, struct sat_window *w, const struct sat_ack *a,
		    bool too_long)
{
	SAT_ARGS(m && w && a);
	u32 q = queue_us(m);
	/* The queue is back where losses showed the buffer full: the drop-tail buffer drops
	 * whatever arrives, the competitor's bursts first. CUBIC backs off at its losses; a
	 * paced sender loses little there, and backing off only at its own losses it took 88 %
	 * of the link from a CUBIC download (simulated, 3.4 Mbit/s GEO). Both back off at the
	 * full buffer, once each time it fills, as two CUBIC senders do. */
	bool full = m->comp.full_us > margin_us(m, a) && !m->comp.at_full &&
		    q >= m->comp.full_us - m->comp.full_us / 16;

	/* The buffer's depth is the queue this sender's own losses met (a bloated buffer that
	 * the queue is still filling is not full at the longest queue so far). */
	if (m->f.recent.n >= 3) {
		if (a->losses > 0)
			m->comp.full_us = max(m->comp.full_us, q);
		if (q < m->comp.full_us / 4 * 3)
			m->comp.at_full = 0;
	}
	if (((a->losses > 0 && too_long) || full) && !m->r.reacted) {
		/* A loss with a queue: back off as the loss-based competitor does, by 0.85 (a
		 * CUBIC aggregate of two flows: this one arrives late, after the drains gave
		 * ground). */
		u32 cwnd = w->cwnd;
		u32 got = max(m->f.bw, m->r.bw);

		m->r.reacted = 1;
		m->comp.at_full = 1;
		/* The fair share is at most twice what this sender delivers (a link that slowed
		 * while competing would otherwise keep the floor above the whole link), but only
		 * once the rate samples are this mode's and for a shortfall of more than a third:
		 * a paced sender loses 10-15 % of its packets at a drop-tail buffer kept full. */
		if (got && m->phase_rounds >= COMPETE_OWN_ROUNDS && 3ULL * got < (u64)m->f.bw_peak) {
			/* Twice in a row: the mode's first back-offs still read the rounds a paced
			 * sender spent losing a third of its packets at a buffer the competitor keeps
			 * full, and one of them halved the floor in four of eight lab runs (GEO, cubic
			 * arriving: share 33.5-36.1 % there, 42.7-50.3 % in the others; 29.2 % in CI).
			 * A link that slowed stays short. */
			if (++m->comp.short_backoffs >= 2)
				m->f.bw_peak = 2 * got;
		} else {
			m->comp.short_backoffs = 0;
		}
		/* At the floor the curve goes on: restarting it there held the window flat on the
		 * curve's plateau while the competitor cut and grew back around it. */
		if (cwnd / 20 * 17 > fair_share(m, a)) {
			w->cwnd = cwnd / 20 * 17;
			cubic_epoch(m, w, a, cwnd);
		}
	} else if (!a->app_limited) {
		/* CUBIC's growth (the hosts' default sender), so that the two share a drop-tail
		 * buffer as two CUBIC senders do. The curve is read one base RTT ahead, as CUBIC
		 * does. */
		u32 t = sat_cubic_target(now_ms(a) - m->comp.epoch_ms + base_us(m) / 1000,
					 m->comp.k_ms, m->comp.w_max);
		u64 g = sat_cubic_grow(w->cwnd, w->cnt, a->acked, t);

		w->cwnd = (u32)(g >> 32);
		w->cnt = (u32)g;
		if (w->cwnd < fair_share(m, a))
			w->cnt = 0;
	}
	w->cwnd = max(w->cwnd, fair_share(m, a));
	return 0;
}

/* The round so far lost a quarter of its segments (and more than the measured noise
 * explains): a bottleneck that drops what exceeds it (a buffer too shallow to show a queue,
 * a policer), whatever the noise, since no channel loses that much for long. With a buffer
 * known to be shallow, any round lost beyond the noise ends growth. Read on every ACK, not
 * at the round's end: by then a tunnel beside a competitor, at 369 Mbit/s with a 22 ms
 * buffer, had lost 46 % of its packets, taking them all for noise, until its peer's
 * reassembly gave up (quinn keeps at most 1 024 gaps in a stream). */
SAT_FN bool dropping(const struct sat_model *m)
{
	u32 total = m->r.acked + m->r.lost;
	u32 noise = min(m->noise.clean_ppm, NOISE_MAX_PPM);
	bool quarter = total >= 16 && m->r.lost > total / 4;
	bool shallow_start = m->noise.buffer_us && m->phase == SAT_START && total >= 8;

	if (m->r.reacted ||
	    !(m->phase == SAT_START || m->phase == SAT_CRUISE || m->phase == SAT_PROBE))
		return false;
	/* One burst is not a bottleneck dropping what exceeds it: the kernel paces a connection
	 * only from its tenth segment, and those ten meeting a buffer of four frames (seed
	 * 46's L04, 3.5 Mbit/s over 720 ms) lost six in one event, a quarter of what the first
	 * ACKs reported: the start ended at the first round's 1.1 Mbit/s. A full pipe or a
	 * policer drops segment after segment (as in a drain, `DROPPING_EVENTS`). */
	if (quarter && !m->noise.drains && m->r.events >= DROPPING_EVENTS)
		return true;
	/* The noise bound (a square root) only when a rule may need it: this runs per ACK. */
	if (!m->noise.drains || !(quarter || shallow_start))
		return false;
	return beyond_noise(m, noise);
}

/* HyStart++'s delay threshold for leaving the start (RFC 9406: an eighth of the base RTT,
 * here between 10 and 16 ms), below the budget: a buffer that holds less than the budget
 * never shows the budget's queue, and the start's last round at twice the link's rate
 * overflowed it by half (a 22 ms buffer on a 171 ms path). */
SAT_FN u32 start_exit_us(const struct sat_model *m, const struct sat_ack *a)
{
	return min(budget_us(m, a), max(RECENT_MIN_US, min(base_us(m) / 8, 16000U)));
}

/* Step 3: the phase's reaction to this ACK. */
SAT_STEP update_phase(struct sat_model *m, struct sat_window *w, const struct sat_ack *a)
{
	SAT_ARGS(m && w && a);
	/* A probe means to queue its extra: above the budget by more than that, the link got
	 * slower. Growing again after rounds with no queue at all, any queue is this sender's
	 * own: the slack ends it (the window grows 1.5 x a round and the queue shows an RTT
	 * late, so each ms waited stands in the queue many times over). */
	u32 allowed = m->phase != SAT_START ? budget_us(m, a) :
		      m->grow.regrowth	     ? slack_us(m, a) :
						start_exit_us(m, a);
	bool too_long;

	if (dropping(m)) {
		/* What the round delivered is what the bottleneck passes: the model, halved at
		 * most; a drain then measures the channel's own noise. */
		u32 got = m->r.bw;

		/* A quarter lost, four times the noise's mean, with the queue short of the slack:
		 * no buffer as deep as the slack loses that. Known at once: at 1 Gbit/s over 5 ms
		 * with an 8 ms buffer the window overflowed it within a round of each drain, and
		 * no two lossy rounds ever came in a row (12 % of the packets lost, simulated).
		 * Not where the noise itself is a large share (a thin link losing one frame in
		 * nine loses a quarter of a short window now and then). */
		u64 total = m->r.acked + m->r.lost;

		if (m->noise.drains && !m->noise.buffer_us && short_queue(m, a) &&
		    (u64)m->r.lost * USEC_PER_SEC > 4 * total * m->noise.clean_ppm)
			know_buffer(m, a);
		m->r.reacted = 1;
		set_bw(m, m->f.bw ? min(m->f.bw, max(got, m->f.bw / 2)) : got);
		if (m->f.bw) {
			enter(m, w, a, SAT_DRAIN);
			return 0;
		}
	}

	if (m->phase == SAT_PROBE)
		allowed += segs_time(m, a, m->grow.probe_extra);
	too_long = m->f.recent.n >= 3 && queue_us(m) > allowed;
	/* A quarter of the base RTT is more queue than this sender's start or a probe leaves;
	 * the channel's noise loses without one. */
	if (a->losses > 0 && m->f.recent.n >= 3 && queue_us(m) > base_us(m) / 4 &&
	    queue_us(m) > 2 * budget_us(m, a) &&
	    (m->phase == SAT_DRAIN || m->phase == SAT_CRUISE))
		m->drain.overflow = 1;
	switch (m->phase) {
	case SAT_START:
		if (!a->app_limited) {
			if (m->grow.regrowth) {
				/* From below the peak (as it was when growth began: the filter
				 * follows the growth), x2 a round up to half the window that
				 * carried it (the path carried it lately: a fade that ended gives
				 * it back at once, and x1.5 took seed 42's L11 four rounds of
				 * 636 ms more to get back from a fifth of it), x1.5 up to that
				 * window, x1.125 for a quarter beyond it (the queue shows a round
				 * late, and a round at x1.5 past the link's rate left half a window
				 * queued: seed 41's L10, 13 Mbit/s over 690 ms, ACM steps, 400 ms)
				 * and x1.5 past that: the peak was read low (a start that ended in
				 * a fade: split on seed 42's L11 took 8 s at x1.125 from its 6.9
				 * Mbit/s to the link's 24). From the peak, x1.5: a peak read early
				 * in the start would hold growth back. */
				u32 c = w->cnt + a->acked;
				u32 peak = segs_in(a, m->grow.from_peak, base_us(m));
				bool below = m->grow.regrowth == REGROW_BELOW_PEAK;
				u32 shift = !below			     ? 1 :
					    w->cwnd >= peak + peak / 4 ? 1 :
					    w->cwnd >= peak		     ? 3 :
					    w->cwnd >= peak / 2	     ? 1 :
									       0;

				w->cwnd += c >> shift;
				w->cnt = c & ((1U << shift) - 1);
			} else {
				w->cwnd += a->acked;
			}
		}
		/* A timeout took the window to one segment: the rate found so far stays. */
		if (a->timeout && m->f.bw)
			w->cwnd = max(w->cwnd, segs_in(a, m->f.bw, base_us(m)));
		if (too_long)
			react(m, w, a);
		break;
	case SAT_CRUISE:
	case SAT_PROBE:
		if (too_long && !m->r.reacted)
			react(m, w, a);
		break;
	case SAT_DRAIN:
		drain_reading(m, w, a);
		/* Half a window of segments sent in the drain is back: the queue they met is
		 * what is left. */
		if (m->drain.acked >= w->cwnd / 2)
			end_drain(m, w, a);
		break;
	case SAT_COMPETE:
		compete(m, w, a, too_long);
		break;
	}
	return 0;
}

/* Step 4: the window towards the model's target (up by a quarter of what is acknowledged,
 * down at once) within the host's bounds. */
SAT_STEP set_window(struct sat_model *m, struct sat_window *w, const struct sat_ack *a)
{
	SAT_ARGS(m && w && a);
	if (m->phase != SAT_START && m->phase != SAT_COMPETE) {
		u32 t = target(m, w, a);

		if (t > w->cwnd) {
			u32 c = w->cnt + a->acked;

			w->cwnd = min(w->cwnd + c / 4, t);
			w->cnt = c & 3;
		} else {
			w->cwnd = t;
		}
	}
	w->cwnd = max(min(w->cwnd, w->clamp), MIN_CWND);
	return 0;
}

/* A new connection at `a->now_us` with `a->delivered` delivered; the window starts at 32
 * segments (or the host's, if larger). */
SAT_FN void sat_model_init(struct sat_model *m, struct sat_window *w, const struct sat_ack *a)
{
	__builtin_memset(m, 0, sizeof(*m));
	min2_reset(&m->f.base, now_ms(a));
	min2_reset(&m->f.recent, now_ms(a));
	m->drain.ended_ms = now_ms(a);
	m->drain.min_rtt = SAT_NONE;
	m->r.next = a->delivered;
	w->cwnd = max(w->cwnd, INITIAL_CWND);
	m->r.cwnd = w->cwnd;
}

/* Warm start: the path's rate and base RTT as an earlier connection measured them. The new
 * one cruises at that rate from its first round trip, paced, with the window at the
 * model's; if the path changed, the first queue drains as any other. */
SAT_FN void sat_model_resume(struct sat_model *m, struct sat_window *w, const struct sat_ack *a,
			     const struct sat_path *p)
{
	if (!p->bw || !p->base_us)
		return;
	m->f.base.cur = p->base_us;
	set_bw(m, p->bw);
	m->f.bw_peak = p->bw;
	m->phase = SAT_CRUISE;
	m->grow.resumed = 1;
	w->cwnd = max(min(target(m, w, a), w->clamp), w->cwnd);
	m->r.cwnd = w->cwnd;
	m->r.start_bw = p->bw;
}

/* A queue above this when the share grows: the carrier holds less than the shares say. */
#define SHARE_QUEUE_DIV 16U
#define SHARE_QUEUE_MIN_US 10000U
/* At most once in this many smoothed RTTs, and a second. */
#define SHARE_FOLLOW_RTTS 8U
#define SHARE_FOLLOW_MIN_MS 1000U

/*
 * A hub's gateway holds this connection to its share of a shared carrier, `share` bytes/s
 * (the tunnel's pacer, split's pacing ceiling), and counts the times it freed carrier (a
 * terminal went quiet, the settings were reloaded) in `freed`. When the share grew because
 * carrier was freed and is well above the model's rate, the model runs at it from now, as a
 * warm start does, instead of finding it by probing for seconds; at most once in eight RTTs
 * and a second, so a share the terminal's own link cannot carry (a fade the gateway was not
 * told of) is tried again only now and then. Only a share that grew with the count is
 * followed (one that grew because others sent less for a moment is a loan), and never over
 * a standing queue: a carrier in a fade holds less than the shares say, and lifting every
 * terminal to its share every few seconds there kept the `hub` preset's queue at 300 ms,
 * against 65 ms without sharing.
 */
SAT_FN void sat_model_follow_share(struct sat_model *m, struct sat_window *w,
				   const struct sat_ack *a, u32 share, u8 freed)
{
	u8 seen = (u8)(freed % 255 + 1);
	u32 base = base_us(m), srtt_ms = a->srtt_us / USEC_PER_MSEC;
	struct sat_path p;

	if (!share)
		return;
	/* A start (or regrowth) the ceiling holds fills no round, so nothing would end it: its
	 * window grew without bound (924 segments for a 26-segment path in CI's star test,
	 * where a model resumed at the whole carrier before a second terminal came read half
	 * of its peak, probed, and regrew under a ceiling of half the carrier). */
	if (m->phase == SAT_START && m->f.bw >= share - share / 8 && base) {
		p.bw = share;
		p.base_us = base;
		sat_model_resume(m, w, a, &p);
		return;
	}
	if (m->share_seen == seen)
		return;
	if (share <= m->f.bw + m->f.bw / 8) {
		/* Nothing to follow: the carrier freed went to others, or this one runs at it. */
		m->share_seen = seen;
		return;
	}
	if (m->shared_ms &&
	    now_ms(a) - m->shared_ms < max(SHARE_FOLLOW_RTTS * srtt_ms, SHARE_FOLLOW_MIN_MS))
		return;
	if (!base || queue_us(m) > max(base / SHARE_QUEUE_DIV, SHARE_QUEUE_MIN_US))
		return;
	p.bw = share;
	p.base_us = base;
	sat_model_resume(m, w, a, &p);
	m->shared_ms = now_ms(a) | 1;
	m->share_seen = seen;
}

/* One ACK: the model, then the phase, then the window (tcp_bbr.c's bbr_main). */
SAT_FN void sat_model_on_ack(struct sat_model *m, struct sat_window *w, const struct sat_ack *a)
{
	update_rtt(m, a);
	update_round(m, w, a);
	update_phase(m, w, a);
	set_window(m, w, a);
}

/* A retransmission timeout: what was in flight says nothing about the queue now. */
SAT_FN void sat_model_on_timeout(struct sat_model *m)
{
	m->f.recent.cur = SAT_NONE;
	m->f.recent.prev = SAT_NONE;
	m->f.recent.n = 0;
}

/* The pacing rate the model asks for, bytes/s (0: the host's own). */
SAT_FN u64 sat_model_pacing_rate(const struct sat_model *m, const struct sat_window *w,
				 const struct sat_ack *a)
{
	u64 rate;
	u32 rtt = a->srtt_us ? a->srtt_us : base_us(m);

	/* No RTT yet (a warm start's first packets): the window would leave as a burst. */
	if (!rtt)
		return 0;
	rate = (u64)w->cwnd * a->mss * USEC_PER_SEC / rtt;
	if (m->phase == SAT_START)
		return rate * 2;
	/* A drain, and a warm start's first round (nothing acknowledged yet holds the queue to
	 * the window's slack: at 1.25 x the rate it would fill a fifth of the window). */
	if ((m->phase == SAT_DRAIN || m->grow.resumed) && m->f.bw)
		return m->f.bw;
	/* A buffer too shallow to hold a pacing burst (a policer at the extreme): at 1.25 x
	 * the rate a fifth of what leaves is dropped there; at the model's rate and a little
	 * more, probes still find room. */
	if (m->noise.buffer_us && m->f.bw)
		return min(rate * 5 / 4, (u64)m->f.bw * 105 / 100);
	return rate * 5 / 4;
}

/*
 * A kernel host's send buffer, in the host's windows (`cwnd` segments of `mss`): the
 * multiplier of the kernel's `sndbuf_expand` hook, whose default is 2 (Reno's fast recovery).
 * A segment acknowledged selectively stays in the send queue until the hole before it is
 * repaired: a round trip to find the loss and one to repair it, a third when the
 * retransmission is lost too (a 2 600-segment window at 1.3 % loss loses one of its 34
 * retransmissions one round in three). With two windows the queue then held only
 * unacknowledged data, the relay could add nothing, and the link idled until the hole
 * closed. Once the connection has `lost` a segment: SEND_PATH_WINDOWS of the model's path
 * windows (rate x base RTT), not of the host's window, which the start's last round can
 * leave at twice the path's (the relay may fill the buffer: its size is what the proxy
 * holds). Never below the kernel's 2, never above SEND_WINDOWS_MAX.
 */
#define SEND_PATH_WINDOWS 4U
#define SEND_WINDOWS_MAX 16U

SAT_FN u32 sat_model_send_windows(const struct sat_model *m, u32 cwnd, u32 mss, bool lost)
{
	u64 want;

	cwnd = max(cwnd, 10U);
	if (!lost || !m->f.bw || !mss || !base_us(m))
		return 2;
	want = (u64)m->f.bw * base_us(m) / USEC_PER_SEC / mss * SEND_PATH_WINDOWS;
	want = (want + cwnd - 1) / cwnd;
	return want < 2 ? 2 : want > SEND_WINDOWS_MAX ? SEND_WINDOWS_MAX : (u32)want;
}

/* What a new connection on the same path may start from (warm start): the model's rate and
 * base RTT, once measured outside the start and the competitive mode. */
SAT_FN bool sat_model_path(const struct sat_model *m, struct sat_path *p)
{
	if (m->phase == SAT_START || m->phase == SAT_COMPETE || !m->f.bw || !base_us(m))
		return false;
	p->bw = m->f.bw;
	p->base_us = base_us(m);
	return true;
}

#endif
