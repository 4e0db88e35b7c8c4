//! The work-request latency monitor's bookkeeping (`NCCL_IB_WQE_LATENCY_THRESHOLD_NS`,
//! `NCCL_IB_WQE_LATENCY_REPORT`): per QP, the signaled send work requests posted and not yet
//! completed, in post order, with their post times; a completion gives the request's
//! post-to-completion time and whether it was slow; [`WrLatency::stalls`] names the oldest
//! request of a QP that has waited past the threshold with no completion, once per request.
//!
//! Pure: the driver passes the times (it reads the clock only while the monitor is on) and turns
//! what comes back into statistics and WARNs. A send queue completes in post order, so a
//! completion retires its request and any older one left without a completion (an unsignaled
//! request is never entered).

use super::time::Time;
use std::collections::VecDeque;

/// One completed request: on QP `qp`, `ns` from post to completion; `slow` when past the
/// threshold, `first_slow` for the first such request of its QP (the one WARN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    pub qp: usize,
    pub ns: u64,
    pub slow: bool,
    pub first_slow: bool,
}

/// A request of QP `qp` with no completion `waited_ns` after its post (past the threshold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    pub qp: usize,
    pub wr_id: u64,
    pub waited_ns: u64,
}

#[derive(Default)]
struct QpTrack {
    pending: VecDeque<(u64, Time)>,
    /// The request a stall was reported for (each is reported once).
    stall_reported: Option<u64>,
    slow: u64,
}

/// Per-QP tracking of one comm's signaled send requests.
pub struct WrLatency {
    /// 0: no slow or stalled request is reported (latencies are still measured).
    threshold_ns: u64,
    qps: Vec<QpTrack>,
}

impl WrLatency {
    pub fn new(threshold_ns: u64, qps: usize) -> WrLatency {
        WrLatency {
            threshold_ns,
            qps: (0..qps).map(|_| QpTrack::default()).collect(),
        }
    }

    /// A signaled request `wr_id` posted on QP `qp` at `now`.
    pub fn posted(&mut self, qp: usize, wr_id: u64, now: Time) {
        if let Some(t) = self.qps.get_mut(qp) {
            t.pending.push_back((wr_id, now));
        }
    }

    /// Whether QP `qp` has a request `wr_id` waiting (a send completion the monitor tracks).
    pub fn tracks(&self, qp: usize, wr_id: u64) -> bool {
        self.qps
            .get(qp)
            .is_some_and(|t| t.pending.iter().any(|&(w, _)| w == wr_id))
    }

    /// The completion of request `wr_id` on QP `qp` at `now`; `None` for one not tracked (a
    /// receive, or a request of QPs a recovery replaced).
    pub fn completed(&mut self, qp: usize, wr_id: u64, now: Time) -> Option<Done> {
        let threshold = self.threshold_ns;
        let t = self.qps.get_mut(qp)?;
        let at = t.pending.iter().position(|&(w, _)| w == wr_id)?;
        let (_, posted) = t.pending.drain(..=at).next_back()?;
        let ns = u64::try_from(now.saturating_since(posted).as_nanos()).unwrap_or(u64::MAX);
        let slow = threshold > 0 && ns > threshold;
        if slow {
            t.slow += 1;
        }
        Some(Done {
            qp,
            ns,
            slow,
            first_slow: slow && t.slow == 1,
        })
    }

    /// The oldest waiting request of each QP that has had no completion for longer than the
    /// threshold at `now`, each reported once; none while the threshold is 0.
    pub fn stalls(&mut self, now: Time) -> Vec<Stall> {
        let mut out = Vec::new();
        if self.threshold_ns == 0 {
            return out;
        }
        for (qp, t) in self.qps.iter_mut().enumerate() {
            let Some(&(wr_id, posted)) = t.pending.front() else {
                continue;
            };
            let waited_ns = u64::try_from(now.saturating_since(posted).as_nanos()).unwrap_or(u64::MAX);
            if waited_ns > self.threshold_ns && t.stall_reported != Some(wr_id) {
                t.stall_reported = Some(wr_id);
                out.push(Stall { qp, wr_id, waited_ns });
            }
        }
        out
    }

    /// A recovery replaced the QPs: their waiting requests will never complete.
    pub fn reset(&mut self) {
        for t in &mut self.qps {
            t.pending.clear();
            t.stall_reported = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(us: u64) -> Time {
        Time::from_nanos(us * 1000)
    }

    #[test]
    fn a_completion_retires_its_request_and_older_ones() {
        let mut m = WrLatency::new(0, 2);
        m.posted(0, 10, at(0));
        m.posted(0, 11, at(5));
        m.posted(1, 10, at(7));
        assert!(m.tracks(0, 11) && !m.tracks(0, 12) && !m.tracks(5, 10));
        // A receive's completion (not tracked) changes nothing.
        assert_eq!(m.completed(0, 99, at(8)), None);
        let d = m.completed(0, 11, at(25)).expect("tracked");
        assert_eq!((d.qp, d.ns, d.slow), (0, 20_000, false));
        assert!(!m.tracks(0, 10), "the older request went with it");
        assert_eq!(m.completed(1, 10, at(9)).map(|d| d.ns), Some(2_000));
        assert_eq!(m.completed(3, 10, at(9)), None);
        assert!(m.stalls(at(1_000_000)).is_empty(), "no threshold, no stall");
    }

    #[test]
    fn slow_at_the_threshold_is_not_slow_past_it_is() {
        let mut m = WrLatency::new(1_000, 1);
        m.posted(0, 1, at(0));
        m.posted(0, 2, at(0));
        m.posted(0, 3, at(0));
        let ok = m.completed(0, 1, Time::from_nanos(1_000)).expect("tracked");
        assert!(!ok.slow);
        let first = m.completed(0, 2, Time::from_nanos(1_001)).expect("tracked");
        assert!(first.slow && first.first_slow);
        let second = m.completed(0, 3, Time::from_nanos(5_000)).expect("tracked");
        assert!(second.slow && !second.first_slow);
    }

    #[test]
    fn a_stall_is_the_oldest_waiting_request_reported_once() {
        let mut m = WrLatency::new(100_000, 2);
        m.posted(0, 7, at(0));
        m.posted(0, 8, at(50));
        assert!(m.stalls(at(100)).is_empty(), "at the threshold");
        let s = m.stalls(at(101));
        assert_eq!(
            s,
            vec![Stall {
                qp: 0,
                wr_id: 7,
                waited_ns: 101_000
            }]
        );
        assert!(m.stalls(at(500)).is_empty(), "reported once");
        m.completed(0, 7, at(600));
        assert_eq!(m.stalls(at(700)).len(), 1, "the next one waits too");
        m.reset();
        assert!(m.stalls(at(10_000)).is_empty() && !m.tracks(0, 8));
    }
}
