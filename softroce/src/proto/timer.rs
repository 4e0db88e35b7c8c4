//! Per-QP timers in a table indexed by [`Timer`] (quinn-proto style).

use super::time::{Duration, Instant};

/// The timers of one QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// Requester retransmission (local ACK timeout), 4.096 µs · 2^timeout.
    Retransmit = 0,
    /// Requester waiting out an RNR NAK.
    Rnr = 1,
    /// Adaptive retransmission probe: go-back-N before the local ACK timeout
    /// when the measured RTT says an answer is overdue (does not consume
    /// `retry_cnt`; see `QpCore::set_adaptive_retransmit`).
    Probe = 2,
}

impl Timer {
    pub const VALUES: [Timer; 3] = [Timer::Retransmit, Timer::Rnr, Timer::Probe];
}

/// Deadlines, one slot per [`Timer`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimerTable {
    data: [Option<Instant>; 3],
}

impl TimerTable {
    pub fn set(&mut self, t: Timer, at: Instant) {
        self.data[t as usize] = Some(at);
    }
    pub fn get(&self, t: Timer) -> Option<Instant> {
        self.data[t as usize]
    }
    pub fn stop(&mut self, t: Timer) {
        self.data[t as usize] = None;
    }
    pub fn is_expired(&self, t: Timer, now: Instant) -> bool {
        self.data[t as usize].is_some_and(|at| at <= now)
    }
    pub fn next_timeout(&self) -> Option<Instant> {
        self.data.iter().flatten().min().copied()
    }
    pub fn clear(&mut self) {
        self.data = [None; 3];
    }
}

/// Local ACK timeout: `4.096 µs × 2^timeout`; `None` for 0 (infinite).
//= IBTA Vol 1 §9.7.6.1.3 / docs/softroce-internals.md#rc-reliability
//# Retransmission timer per QP: 4.096 µs × 2^timeout (timeout 14 → 67.1 ms; 0 = never)
pub fn local_ack_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        None
    } else {
        Some(Duration::from_nanos(4096u64 << u32::from(timeout.min(31))))
    }
}

/// RNR NAK timer code → delay.
//= IBTA Vol 1 §9.7.5.2.8, Table 45 / docs/softroce-internals.md#aeth-syndrome
//# 0 = 655.36 ms, 1 = 0.01, 2 = 0.02, … 12 = 0.64, … 31 = 491.52 ms
pub fn rnr_delay(code: u8) -> Duration {
    const MICROS: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840, 5_120, 7_680,
        10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760, 327_680, 491_520,
    ];
    Duration::from_micros(MICROS[usize::from(code & 0x1F)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts() {
        assert_eq!(local_ack_timeout(0), None);
        assert_eq!(local_ack_timeout(14), Some(Duration::from_nanos(67_108_864)));
        assert_eq!(rnr_delay(12), Duration::from_micros(640));
        assert_eq!(rnr_delay(0), Duration::from_micros(655_360));
        assert_eq!(rnr_delay(31), Duration::from_micros(491_520));
    }

    #[test]
    fn table() {
        let mut t = TimerTable::default();
        assert_eq!(t.next_timeout(), None);
        t.set(Timer::Rnr, Instant(50));
        t.set(Timer::Retransmit, Instant(20));
        assert_eq!(t.next_timeout(), Some(Instant(20)));
        assert!(t.is_expired(Timer::Retransmit, Instant(20)));
        assert!(!t.is_expired(Timer::Rnr, Instant(20)));
        t.stop(Timer::Retransmit);
        assert_eq!(t.next_timeout(), Some(Instant(50)));
        assert_eq!((t.get(Timer::Retransmit), t.get(Timer::Rnr)), (None, Some(Instant(50))));
        t.set(Timer::Probe, Instant(70));
        t.clear();
        assert_eq!(t, TimerTable::default());
        assert_eq!(t.next_timeout(), None);
    }
}
