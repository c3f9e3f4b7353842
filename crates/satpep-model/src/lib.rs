//! satpep's satellite congestion-control model, for userspace hosts.
//!
//! The model is C (`c/sat_model.h`, integers only) so that one source drives both of
//! satpep's satellite controllers: the BPF `struct_ops` controller `satpep_sat` includes the
//! header, and this crate compiles it into the process (`c/sat_model.c`) and wraps it. A host
//! turns its own events into [`Ack`]s (the kernel's ACK and rate sample, counted in segments)
//! and applies the window [`Model::on_ack`] leaves; the state diagram and the reasoning are
//! at the top of `c/sat_model.h`.

use std::fmt;

pub mod sim;

/// One ACK as the host saw it, in segments (`struct sat_ack`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ack {
    /// The sender's clock, µs.
    pub now_us: u64,
    /// Payload bytes per segment.
    pub mss: u32,
    /// Smoothed RTT, µs (0 while unknown).
    pub srtt_us: u32,
    /// Segments delivered so far (wraps).
    pub delivered: u32,
    /// `delivered` when the newest segment this ACK covers was sent.
    pub prior_delivered: u32,
    /// Rate sample: segments delivered over `interval_us` (negative: no sample).
    pub rs_delivered: i32,
    /// The rate sample's span, µs (≤ 0: no sample).
    pub interval_us: i64,
    /// RTT sample, µs (≤ 0: none).
    pub rtt_us: i32,
    /// Segments this ACK acknowledged.
    pub acked: u32,
    /// Segments newly found lost.
    pub losses: u32,
    /// The rate sample is application limited (1) or not (0).
    pub app_limited: u8,
    /// Recovering from a retransmission timeout (1) or not (0).
    pub timeout: u8,
    /// The host dates losses by the lost packet's own send time (1: `prior_delivered` of a
    /// loss report is when it left, as quinn's host gives it) or by the ACK that revealed
    /// them (0: the kernel's).
    pub losses_dated: u8,
}

/// The window the host lends the model on each call (`struct sat_window`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Segments.
    pub cwnd: u32,
    /// Growth not yet applied.
    pub cnt: u32,
    /// The host's ceiling, segments.
    pub clamp: u32,
}

/// A path's rate and base RTT, for a warm start (`struct sat_path`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Path {
    /// Bytes per second.
    pub bw: u32,
    /// Base RTT, µs.
    pub base_us: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Readings {
    bw: u32,
    base_us: u32,
    queue_us: u32,
    noise_ppm: u32,
    buffer_us: u32,
    burst: u32,
    phase: u8,
    drains: u8,
}

/// Room for `struct sat_model` (224 bytes today), in words; checked against the C
/// compiler's figure when a model is made.
const STATE_WORDS: usize = 58;

/// `struct sat_model`, opaque here: only the C code reads or writes it.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct State([u32; STATE_WORDS]);

extern "C" {
    fn satm_init(m: *mut State, w: *mut Window, a: *const Ack);
    fn satm_resume(m: *mut State, w: *mut Window, a: *const Ack, p: *const Path);
    fn satm_follow_share(m: *mut State, w: *mut Window, a: *const Ack, share: u32, freed: u8);
    fn satm_on_ack(m: *mut State, w: *mut Window, a: *const Ack);
    fn satm_on_timeout(m: *mut State);
    fn satm_pacing_rate(m: *const State, w: *const Window, a: *const Ack) -> u64;
    fn satm_send_windows(m: *const State, cwnd: u32, mss: u32, lost: bool) -> u32;
    fn satm_path(m: *const State, p: *mut Path) -> bool;
    fn satm_read(m: *const State, r: *mut Readings);
    fn satm_sizeof() -> u32;
}

/// Where the model is in its cycle (the state diagram's boxes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Doubling every round until a queue shows (or growing again, by ×1.5).
    Startup,
    /// One round below the model, so the queue empties and the rate is read again.
    Drain,
    /// At the model: rate × (base RTT + slack).
    Cruise,
    /// Above the model, looking for more rate.
    Probe,
    /// Another sender keeps the buffer full: CUBIC's window, with a floor at a fair share.
    Compete,
}

impl Phase {
    /// Every phase, in the model's order.
    pub const ALL: [Phase; 5] = [
        Phase::Startup,
        Phase::Drain,
        Phase::Cruise,
        Phase::Probe,
        Phase::Compete,
    ];

    /// The phase's name in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Startup => "startup",
            Phase::Drain => "drain",
            Phase::Cruise => "cruise",
            Phase::Probe => "probe",
            Phase::Compete => "compete",
        }
    }
}

/// One connection's model and the window it lends it.
#[derive(Clone)]
pub struct Model {
    state: State,
    window: Window,
}

impl fmt::Debug for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Model")
            .field("phase", &self.phase())
            .field("bw", &self.bw())
            .field("base_rtt_us", &self.base_rtt_us())
            .field("window", &self.window)
            .finish()
    }
}

impl Model {
    /// A new connection's model, at `a.now_us` with `a.delivered` delivered; the window
    /// starts at 32 segments, or `initial` if larger, and never exceeds `clamp`.
    pub fn new(a: &Ack, initial: u32, clamp: u32) -> Model {
        // SAFETY: satm_sizeof only returns a constant.
        let size = unsafe { satm_sizeof() } as usize;
        assert!(
            size <= std::mem::size_of::<State>(),
            "struct sat_model is {size} bytes, the Rust copy {}: update STATE_WORDS",
            std::mem::size_of::<State>()
        );
        let mut m = Model {
            state: State([0; STATE_WORDS]),
            window: Window {
                cwnd: initial,
                cnt: 0,
                clamp,
            },
        };
        // SAFETY: both pointers are to owned, initialised values of the C layout.
        unsafe { satm_init(&mut m.state, &mut m.window, a) };
        m
    }

    /// Starts from a path an earlier connection measured (warm start).
    pub fn resume(&mut self, a: &Ack, p: &Path) {
        // SAFETY: as in `new`.
        unsafe { satm_resume(&mut self.state, &mut self.window, a, p) };
    }

    /// A hub's gateway holds the connection to `share` bytes/s and has freed carrier
    /// `freed` times (modulo 256): a share that grew with that count is run at from now
    /// (`sat_model_follow_share`).
    pub fn follow_share(&mut self, a: &Ack, share: u32, freed: u8) {
        // SAFETY: as in `new`.
        unsafe { satm_follow_share(&mut self.state, &mut self.window, a, share, freed) };
    }

    /// One ACK (or a loss report: `acked` 0, no rate sample).
    pub fn on_ack(&mut self, a: &Ack) {
        // SAFETY: as in `new`.
        unsafe { satm_on_ack(&mut self.state, &mut self.window, a) };
    }

    /// A retransmission timeout: the queue readings are stale.
    pub fn on_timeout(&mut self) {
        // SAFETY: as in `new`.
        unsafe { satm_on_timeout(&mut self.state) };
    }

    /// The window, segments.
    pub fn cwnd(&self) -> u32 {
        self.window.cwnd
    }

    /// Sets the window (the host changed it: a timeout's cut, a new ceiling).
    pub fn set_window(&mut self, cwnd: u32, clamp: u32) {
        self.window.cwnd = cwnd;
        self.window.clamp = clamp;
    }

    /// The pacing rate the model asks for, bytes/s (0: none yet); `a` gives the smoothed
    /// RTT and segment size.
    pub fn pacing_rate(&self, a: &Ack) -> u64 {
        // SAFETY: as in `new`.
        unsafe { satm_pacing_rate(&self.state, &self.window, a) }
    }

    /// A kernel host's send buffer in windows of `cwnd` segments of `mss` bytes (the
    /// kernel's `sndbuf_expand`: 2 by default), once the connection has `lost` a segment:
    /// four of the model's path windows, because selectively acknowledged data waits in it
    /// behind each hole.
    pub fn send_windows(&self, cwnd: u32, mss: u32, lost: bool) -> u32 {
        // SAFETY: as in `new`.
        unsafe { satm_send_windows(&self.state, cwnd, mss, lost) }
    }

    /// The path as measured, once the model holds outside the start and the competitive mode.
    pub fn path(&self) -> Option<Path> {
        let mut p = Path::default();
        // SAFETY: as in `new`.
        unsafe { satm_path(&self.state, &mut p) }.then_some(p)
    }

    /// Everything the model shows, read at once (one call into the model).
    pub fn snapshot(&self) -> Snapshot {
        let mut r = Readings::default();
        // SAFETY: as in `new`.
        unsafe { satm_read(&self.state, &mut r) };
        Snapshot(r)
    }

    /// The phase.
    pub fn phase(&self) -> Phase {
        self.snapshot().phase()
    }

    /// The model's rate, bytes/s (0 until measured).
    pub fn bw(&self) -> u64 {
        self.snapshot().bw()
    }

    /// The base RTT, µs (None until measured).
    pub fn base_rtt_us(&self) -> Option<u32> {
        self.snapshot().base_rtt_us()
    }

    /// The queue the latest RTT samples show, µs.
    pub fn queue_us(&self) -> u32 {
        self.snapshot().queue_us()
    }

    /// The share of segments the channel loses to noise (see [`Snapshot::channel_loss`]).
    pub fn channel_loss(&self) -> Option<f64> {
        self.snapshot().channel_loss()
    }

    /// The channel's mean burst of losses (see [`Snapshot::loss_burst`]).
    pub fn loss_burst(&self) -> Option<u32> {
        self.snapshot().loss_burst()
    }

    /// A shallow buffer's depth (see [`Snapshot::shallow_buffer_us`]).
    pub fn shallow_buffer_us(&self) -> Option<u32> {
        self.snapshot().shallow_buffer_us()
    }
}

/// What the model shows at one moment ([`Model::snapshot`]).
#[derive(Debug, Clone, Copy)]
pub struct Snapshot(Readings);

impl Snapshot {
    /// What a model's raw state shows: `state` is a `struct sat_model` as another host keeps
    /// it (the BPF controller's socket storage, read from userspace). None if its size is
    /// not this build's (another build of the model).
    pub fn of_state(state: &[u8]) -> Option<Snapshot> {
        // SAFETY: satm_sizeof only returns a constant.
        let size = unsafe { satm_sizeof() } as usize;
        if state.len() != size || size > std::mem::size_of::<State>() {
            return None;
        }
        let mut s = State([0; STATE_WORDS]);
        // SAFETY: `s` has room for `size` bytes (checked above); the state is plain integers,
        // so any bytes are a valid value of it.
        unsafe { std::ptr::copy_nonoverlapping(state.as_ptr(), s.0.as_mut_ptr() as *mut u8, size) };
        let mut r = Readings::default();
        // SAFETY: as in `Model::new`.
        unsafe { satm_read(&s, &mut r) };
        Some(Snapshot(r))
    }

    /// The phase.
    pub fn phase(&self) -> Phase {
        Phase::ALL
            .get(self.0.phase as usize)
            .copied()
            .unwrap_or(Phase::Startup)
    }

    /// The model's rate, bytes/s (0 until measured).
    pub fn bw(&self) -> u64 {
        self.0.bw as u64
    }

    /// The base RTT, µs (None until measured).
    pub fn base_rtt_us(&self) -> Option<u32> {
        Some(self.0.base_us).filter(|&b| b > 0)
    }

    /// The queue the latest RTT samples show, µs.
    pub fn queue_us(&self) -> u32 {
        self.0.queue_us
    }

    /// The share of segments the channel loses to noise, as drains measured it (None until
    /// a drain did).
    pub fn channel_loss(&self) -> Option<f64> {
        (self.0.drains > 0).then(|| self.0.noise_ppm as f64 / 1e6)
    }

    /// The channel's mean burst of losses, segments (1: independent losses), as drains
    /// measured it (None until a drain did).
    pub fn loss_burst(&self) -> Option<u32> {
        (self.0.drains > 0).then_some(self.0.burst)
    }

    /// The depth of a buffer shallower than the slack, µs, once losses showed one.
    pub fn shallow_buffer_us(&self) -> Option<u32> {
        Some(self.0.buffer_us).filter(|&b| b > 0)
    }
}

#[cfg(test)]
mod tests;
