//! The receive path's fault injector: `SOFTROCE_LOSS` drops a packet,
//! `SOFTROCE_REORDER` holds one back and hands it to its QP after the next
//! packet, `SOFTROCE_DUP` hands one to its QP twice. Every decision comes from
//! one generator per device seeded by `SOFTROCE_SEED`, so a run repeats for a
//! given arrival order. The counts are process-wide; with
//! `SOFTROCE_FAULT_COUNTS=DIR` they are also kept in
//! `DIR/softroce-faults-<pid>.txt` (a process may be killed at any time, so the
//! file is rewritten while faults happen, not at exit).

use std::sync::atomic::{AtomicU64, Ordering};

use super::rng::Rng;
use crate::config;

static LOST: AtomicU64 = AtomicU64::new(0);
static REORDERED: AtomicU64 = AtomicU64::new(0);
static DUPLICATED: AtomicU64 = AtomicU64::new(0);

/// How often (ns) the counts file may be rewritten.
const REPORT_EVERY_NS: u64 = 500_000_000;

/// Packets the injectors of this process dropped, reordered and duplicated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultCounts {
    pub lost: u64,
    pub reordered: u64,
    pub duplicated: u64,
}

/// The counts so far, over every device of the process.
pub fn counts() -> FaultCounts {
    FaultCounts {
        lost: LOST.load(Ordering::Relaxed),
        reordered: REORDERED.load(Ordering::Relaxed),
        duplicated: DUPLICATED.load(Ordering::Relaxed),
    }
}

/// What happens to a packet that passed its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Deliver,
    /// Handed to its QP twice in a row.
    Twice,
    /// Kept ([`Injector::hold`]) and handed over after the next packet.
    Hold,
}

/// One device's injector (part of its receive state).
pub struct Injector {
    loss: f64,
    reorder: f64,
    dup: f64,
    rng: Rng,
    held: Option<Vec<u8>>,
    reported: FaultCounts,
    reported_at_ns: u64,
}

impl Default for Injector {
    fn default() -> Self {
        Self::new()
    }
}

impl Injector {
    /// Reads `SOFTROCE_LOSS`, `SOFTROCE_REORDER`, `SOFTROCE_DUP` and `SOFTROCE_SEED`.
    pub fn new() -> Injector {
        Injector {
            loss: config::loss(),
            reorder: config::reorder(),
            dup: config::dup(),
            rng: Rng::new(config::seed()),
            held: None,
            reported: FaultCounts::default(),
            reported_at_ns: 0,
        }
    }

    /// Whether to drop the next packet (drawn before any check of it, as a
    /// lossy link drops good and bad packets alike).
    pub fn lose(&mut self) -> bool {
        let lost = self.loss > 0.0 && self.rng.next_f64() < self.loss;
        if lost {
            LOST.fetch_add(1, Ordering::Relaxed);
        }
        lost
    }

    /// The fate of a packet that parsed: at most one packet is held at a time.
    pub fn fate(&mut self) -> Fate {
        if self.dup > 0.0 && self.rng.next_f64() < self.dup {
            DUPLICATED.fetch_add(1, Ordering::Relaxed);
            return Fate::Twice;
        }
        if self.held.is_none() && self.reorder > 0.0 && self.rng.next_f64() < self.reorder {
            REORDERED.fetch_add(1, Ordering::Relaxed);
            return Fate::Hold;
        }
        Fate::Deliver
    }

    /// Keeps a copy of `packet` (after [`Fate::Hold`]).
    pub fn hold(&mut self, packet: &[u8]) {
        self.held = Some(packet.to_vec());
    }

    /// The packet held back, if any: to be handled now (after the packet that
    /// overtook it, or at the end of a receive batch, so none waits for traffic
    /// that may never come).
    pub fn take_held(&mut self) -> Option<Vec<u8>> {
        self.held.take()
    }

    /// Rewrites the counts file (`SOFTROCE_FAULT_COUNTS`) when the counts
    /// changed and the last write is older than half a second.
    pub fn report_if_due(&mut self, now_ns: u64) {
        let now_counts = counts();
        if now_counts == self.reported || now_ns.saturating_sub(self.reported_at_ns) < REPORT_EVERY_NS {
            return;
        }
        let Some(dir) = config::fault_counts_dir() else { return };
        self.reported = now_counts;
        self.reported_at_ns = now_ns;
        write_counts(&dir, now_counts);
    }
}

/// Writes `lost=N reordered=N duplicated=N` atomically (a reader never sees half a file).
fn write_counts(dir: &std::path::Path, c: FaultCounts) {
    let pid = std::process::id();
    let tmp = dir.join(format!(".softroce-faults-{pid}.tmp"));
    let line = format!(
        "lost={} reordered={} duplicated={}\n",
        c.lost, c.reordered, c.duplicated
    );
    let written =
        std::fs::write(&tmp, line).and_then(|()| std::fs::rename(&tmp, dir.join(format!("softroce-faults-{pid}.txt"))));
    if let Err(e) = written {
        if config::debug() {
            eprintln!("softroce: cannot write the fault counts to {}: {e}", dir.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn injector(loss: f64, reorder: f64, dup: f64) -> Injector {
        Injector {
            loss,
            reorder,
            dup,
            rng: Rng::new(7),
            held: None,
            reported: FaultCounts::default(),
            reported_at_ns: 0,
        }
    }

    #[test]
    fn nothing_is_injected_at_probability_zero() {
        let mut i = injector(0.0, 0.0, 0.0);
        for _ in 0..10_000 {
            assert!(!i.lose());
            assert_eq!(i.fate(), Fate::Deliver);
        }
    }

    #[test]
    fn only_one_packet_is_held_at_a_time() {
        let mut i = injector(0.0, 1.0, 0.0);
        assert_eq!(i.fate(), Fate::Hold);
        i.hold(b"first");
        assert_eq!(i.fate(), Fate::Deliver, "a second packet is never held while one is");
        assert_eq!(i.take_held().as_deref(), Some(&b"first"[..]));
        assert_eq!(i.take_held(), None);
        assert_eq!(i.fate(), Fate::Hold);
    }

    #[test]
    fn every_packet_is_duplicated_at_probability_one() {
        let mut i = injector(0.0, 0.0, 1.0);
        for _ in 0..100 {
            assert_eq!(i.fate(), Fate::Twice);
        }
    }
}
