//! Per-direction counters, shared between a direction's thread (which writes them) and the
//! control socket and exit report (which read them).

use hdrhistogram::Histogram;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// Live counters of one direction.
pub struct DirStats {
    /// Frames read from the ingress interface.
    pub frames_in: AtomicU64,
    /// Bytes of those frames.
    pub bytes_in: AtomicU64,
    /// Frames written to the egress interface.
    pub delivered: AtomicU64,
    /// Bytes of those frames.
    pub delivered_bytes: AtomicU64,
    /// Frames dropped because the bottleneck queue was full.
    pub dropped_queue: AtomicU64,
    /// Frames dropped as corrupted (BER, PER, Gilbert–Elliott).
    pub dropped_error: AtomicU64,
    /// Frames lost because the link was down.
    pub dropped_outage: AtomicU64,
    /// Frames larger than the interface MTU allows (GSO/GRO super-frames, jumbo frames).
    pub dropped_oversize: AtomicU64,
    /// Frames the kernel dropped before the emulator could read them (socket buffer full).
    pub dropped_kernel: AtomicU64,
    /// Frames the egress interface refused.
    pub tx_errors: AtomicU64,
    /// Frames queued or on the wire right now.
    pub backlog_frames: AtomicU64,
    /// Bytes queued or on the wire right now.
    pub backlog_bytes: AtomicU64,
    /// Frames propagating (serialized, not yet delivered).
    pub in_flight: AtomicU64,
    /// Queueing delay of admitted frames, µs.
    pub queue_delay_us: Mutex<Histogram<u64>>,
    /// How late frames were written compared with their scheduled delivery time, µs: the
    /// emulator's own timing error.
    pub late_us: Mutex<Histogram<u64>>,
    /// How long frames waited in the emulator's socket before it read them, µs (from the
    /// kernel's receive stamps): the link counts them from when they arrived.
    pub read_late_us: Mutex<Histogram<u64>>,
}

impl Default for DirStats {
    fn default() -> Self {
        DirStats {
            frames_in: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            delivered_bytes: AtomicU64::new(0),
            dropped_queue: AtomicU64::new(0),
            dropped_error: AtomicU64::new(0),
            dropped_outage: AtomicU64::new(0),
            dropped_oversize: AtomicU64::new(0),
            dropped_kernel: AtomicU64::new(0),
            tx_errors: AtomicU64::new(0),
            backlog_frames: AtomicU64::new(0),
            backlog_bytes: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            // 1 µs … 1 h at 3 significant digits.
            queue_delay_us: Mutex::new(Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap()),
            late_us: Mutex::new(Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap()),
            read_late_us: Mutex::new(Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap()),
        }
    }
}

/// A point-in-time copy of one direction's counters, as printed and as served in JSON.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct DirSnapshot {
    /// Frames read from the ingress interface.
    pub frames_in: u64,
    /// Bytes read.
    pub bytes_in: u64,
    /// Frames delivered.
    pub delivered: u64,
    /// Bytes delivered.
    pub delivered_bytes: u64,
    /// Dropped by the full queue.
    pub dropped_queue: u64,
    /// Dropped as corrupted.
    pub dropped_error: u64,
    /// Dropped during outages.
    pub dropped_outage: u64,
    /// Dropped as larger than a wire frame.
    pub dropped_oversize: u64,
    /// Dropped by the kernel before the emulator read them.
    pub dropped_kernel: u64,
    /// Refused by the egress interface.
    pub tx_errors: u64,
    /// Frames queued or on the wire.
    pub backlog_frames: u64,
    /// Bytes queued or on the wire.
    pub backlog_bytes: u64,
    /// Frames propagating.
    pub in_flight: u64,
    /// Median queueing delay, ms.
    pub queue_delay_p50_ms: f64,
    /// 99th percentile queueing delay, ms.
    pub queue_delay_p99_ms: f64,
    /// Largest queueing delay, ms.
    pub queue_delay_max_ms: f64,
    /// Median lateness of frame release against schedule, ms.
    pub late_p50_ms: f64,
    /// 99th percentile lateness, ms.
    pub late_p99_ms: f64,
    /// Largest lateness, ms.
    pub late_max_ms: f64,
    /// 99th percentile of how long frames waited in the socket before the emulator read
    /// them, ms (absent from emulators before it was counted).
    #[serde(default)]
    pub read_late_p99_ms: f64,
    /// Longest such wait, ms.
    #[serde(default)]
    pub read_late_max_ms: f64,
}

impl DirStats {
    /// Copies the counters.
    pub fn snapshot(&self) -> DirSnapshot {
        let h = self.queue_delay_us.lock().unwrap().clone();
        let l = self.late_us.lock().unwrap().clone();
        let r = self.read_late_us.lock().unwrap().clone();
        let ms = |h: &Histogram<u64>, p: f64| {
            if h.is_empty() {
                0.0
            } else if p >= 1.0 {
                h.max() as f64 / 1000.0
            } else {
                h.value_at_quantile(p) as f64 / 1000.0
            }
        };
        DirSnapshot {
            frames_in: self.frames_in.load(Relaxed),
            bytes_in: self.bytes_in.load(Relaxed),
            delivered: self.delivered.load(Relaxed),
            delivered_bytes: self.delivered_bytes.load(Relaxed),
            dropped_queue: self.dropped_queue.load(Relaxed),
            dropped_error: self.dropped_error.load(Relaxed),
            dropped_outage: self.dropped_outage.load(Relaxed),
            dropped_oversize: self.dropped_oversize.load(Relaxed),
            dropped_kernel: self.dropped_kernel.load(Relaxed),
            tx_errors: self.tx_errors.load(Relaxed),
            backlog_frames: self.backlog_frames.load(Relaxed),
            backlog_bytes: self.backlog_bytes.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
            queue_delay_p50_ms: ms(&h, 0.5),
            queue_delay_p99_ms: ms(&h, 0.99),
            queue_delay_max_ms: ms(&h, 1.0),
            late_p50_ms: ms(&l, 0.5),
            late_p99_ms: ms(&l, 0.99),
            late_max_ms: ms(&l, 1.0),
            read_late_p99_ms: ms(&r, 0.99),
            read_late_max_ms: ms(&r, 1.0),
        }
    }
}

/// Both directions' counters plus the time the emulator has been running.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct LinkSnapshot {
    /// Seconds since the emulator started forwarding.
    pub uptime_s: f64,
    /// Gateway → terminal.
    pub forward: DirSnapshot,
    /// Terminal → gateway.
    #[serde(rename = "return")]
    pub ret: DirSnapshot,
}

/// A table row: label and how to format a direction's value.
type Row = (&'static str, fn(&DirSnapshot) -> String);

impl LinkSnapshot {
    /// A fixed-width table for people.
    pub fn table(&self) -> String {
        let mut s = format!(
            "satpep link counters after {:.1} s\n{:<18}{:>16}{:>16}\n",
            self.uptime_s, "", "forward", "return"
        );
        let rows: [Row; 18] = [
            ("frames in", |d| d.frames_in.to_string()),
            ("bytes in", |d| d.bytes_in.to_string()),
            ("delivered", |d| d.delivered.to_string()),
            ("delivered bytes", |d| d.delivered_bytes.to_string()),
            ("drop: queue", |d| d.dropped_queue.to_string()),
            ("drop: error", |d| d.dropped_error.to_string()),
            ("drop: outage", |d| d.dropped_outage.to_string()),
            ("drop: oversize", |d| d.dropped_oversize.to_string()),
            ("drop: kernel", |d| d.dropped_kernel.to_string()),
            ("tx errors", |d| d.tx_errors.to_string()),
            ("in queue now", |d| format!("{} fr", d.backlog_frames)),
            ("queue delay p50", |d| {
                format!("{:.3} ms", d.queue_delay_p50_ms)
            }),
            ("queue delay p99", |d| {
                format!("{:.3} ms", d.queue_delay_p99_ms)
            }),
            ("queue delay max", |d| {
                format!("{:.3} ms", d.queue_delay_max_ms)
            }),
            ("release late p99", |d| format!("{:.3} ms", d.late_p99_ms)),
            ("release late max", |d| format!("{:.3} ms", d.late_max_ms)),
            ("read late p99", |d| format!("{:.3} ms", d.read_late_p99_ms)),
            ("read late max", |d| format!("{:.3} ms", d.read_late_max_ms)),
        ];
        for (name, f) in rows {
            s += &format!("{name:<18}{:>16}{:>16}\n", f(&self.forward), f(&self.ret));
        }
        s
    }
}
