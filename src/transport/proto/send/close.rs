//! The receiver closed (wire version 7, docs/design/data-path.md#closing): before destroying
//! its QPs it said what it took ([`PeerClose`], and per QP the write-with-immediate completions
//! it took since the connection was made). The sends it took are done even when the
//! acknowledgement of their last write was lost (the retransmission would meet a QP that no
//! longer exists and end in "retry counter exceeded"); the sends it never took fail at once,
//! naming themselves, instead of when the transport's retries run out. Nothing is posted
//! after the close: a CTS entry still in the ring names a receive the receiver abandoned.

use super::super::request::ReqKind;
use super::chains::eager_chain;
use super::{FifoRing, Isend, SendCore};
use crate::error::{Error, Result};
use std::fmt::Write;

/// What a closing receiver said of its receives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerClose {
    /// Receives it took (completed), grouped receives counting once.
    pub receives: u64,
    /// Receives it had posted and never took (closed with them in flight).
    pub in_flight: u32,
}

/// The most unsent sends a close error names one by one.
const NAMED: usize = 8;

impl SendCore {
    /// The receiver closed, having taken `taken[q]` write-with-immediate completions on each
    /// QP `q`: the chains up to that count landed, and their sends are done (a late
    /// acknowledgement is ignored from now on); later chains never will be, unless they were
    /// acknowledged already (the receiver counts what it polled, and may close before it
    /// polled a message whose write was acknowledged). Returns the chains that landed without
    /// their acknowledgement here. A count past what was posted fails the comm, as in a
    /// recovery. A second close report changes nothing.
    pub fn handle_peer_close(&mut self, ring: &impl FifoRing, close: PeerClose, taken: &[u64]) -> Result<usize> {
        self.state.check()?;
        if self.peer_closed.is_some() {
            return Ok(0);
        }
        self.check_taken(taken, true)?;
        let mut landed_here = 0;
        for (q, &t) in taken.iter().enumerate() {
            let log = self.chains[q];
            // An acknowledged chain is done whatever the receiver polled.
            let landed = t.saturating_sub(log.retired()) as usize;
            for k in 0..landed {
                let lane0 = log.at(k);
                if let Some(slot) = eager_chain(lane0) {
                    self.eager_acked(slot);
                } else if let Some((g, _)) = self.kept_group(ring, lane0) {
                    for &r in &g.reqs[..g.n] {
                        if let Some(req) = self.state.pool.get_mut(r) {
                            req.complete_one();
                        }
                    }
                }
                landed_here += 1;
            }
            for _ in 0..landed {
                self.chains[q].pop();
            }
        }
        self.peer_closed = Some(close);
        self.recovering = false;
        Ok(landed_here)
    }

    /// What the receiver said at its close, once it did.
    pub fn peer_closed(&self) -> Option<PeerClose> {
        self.peer_closed
    }

    /// After the receiver's close (and a last look at the ring for the verdicts on eager
    /// messages, which land before the close report is sent): every send not done now never
    /// will be. Fails the comm with an error that names them (count, tags and sizes); the sends
    /// that are done stay done ([`SendCore::test`] reports them). `Ok` when none is left.
    pub fn fail_untaken(&mut self) -> Result<()> {
        let Some(close) = self.peer_closed else {
            return Ok(());
        };
        self.state.check()?;
        let mut count = 0;
        let mut named = String::new();
        for idx in 0..self.kept.len() as u16 {
            let Some(r) = self.state.pool.get(idx) else { continue };
            if r.kind() != ReqKind::Send || r.is_done() {
                continue;
            }
            if count < NAMED {
                let sep = if count == 0 { "" } else { ", " };
                let tag = self.kept_tags.get(usize::from(idx)).copied().unwrap_or(0);
                let _ = write!(named, "{sep}tag {tag} ({} bytes)", r.size);
            }
            count += 1;
        }
        if count == 0 {
            return Ok(());
        }
        let more = if count > NAMED { ", …" } else { "" };
        Err(self.state.fail_undone(Error::remote(format!(
            "the peer {} closed the connection while {count} send(s) it never took were in flight ({named}{more}): its recv comm took {} receive(s) and closed with {} posted; the sends it took completed, the ones waiting for the receiver's answer or acknowledgement fail — the receiver closed before its sender was done (NCCL never does; another client must not close a comm with receives or sends still expected)",
            self.cfg.peer, close.receives, close.in_flight
        ))))
    }

    /// An isend after the receiver closed: there is no receive left to send into. While a
    /// send the receiver took is done and not yet tested, "retry later" (a client that stops
    /// at its first error still sees those completions); then the comm fails as
    /// [`SendCore::fail_untaken`] does, naming this send.
    pub(super) fn send_after_close(&mut self, tag: i32, size: usize) -> Result<Isend> {
        let untested = (0..self.kept.len() as u16)
            .filter_map(|i| self.state.pool.get(i))
            .any(|r| r.kind() == ReqKind::Send && r.is_done() && !r.failed());
        if untested {
            return Ok(Isend::Busy);
        }
        let close = self.peer_closed.unwrap_or_default();
        Err(self.state.fail_undone(Error::remote(format!(
            "the peer {} closed the connection: isend of {size} bytes (tag {tag}) finds no receiver's buffer and fails at once (its recv comm took {} receive(s) and closed with {} posted; no CTS it wrote is used after its close)",
            self.cfg.peer, close.receives, close.in_flight
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{started, Bench, Opts, PLAIN};
    use super::*;

    fn close(b: &mut Bench, receives: u64, in_flight: u32, taken: &[u64]) -> Result<usize> {
        let Bench { core, ring, .. } = b;
        core.handle_peer_close(ring, PeerClose { receives, in_flight }, taken)
    }

    /// The receiver took the send but the acknowledgement of its write was lost: its close
    /// report completes it, and the acknowledgement's retransmission, whatever comes of it,
    /// changes nothing.
    #[test]
    fn a_send_whose_last_ack_was_lost_is_done_at_the_receiver_s_close() {
        let mut b = Bench::new(PLAIN);
        b.cts(&[(1000, 7)]);
        let idx = started(b.isend(600, 7).unwrap());
        assert_eq!(close(&mut b, 1, 0, &[1]).unwrap(), 1);
        assert!(!b.core.chains_in_flight());
        b.core.fail_untaken().unwrap();
        b.complete_from(0);
        assert_eq!(b.core.test(idx).unwrap(), Some(600));
        assert!(b.core.state.check().is_ok());
    }

    /// A close report is final: a second one (or one after the acknowledgement came) changes
    /// nothing, and a count past what was posted fails the comm as in a recovery.
    #[test]
    fn a_second_report_changes_nothing_and_a_lying_one_fails_the_comm() {
        let mut b = Bench::new(PLAIN);
        b.cts(&[(1000, 7)]);
        let idx = started(b.isend(600, 7).unwrap());
        b.complete_from(0);
        assert_eq!(close(&mut b, 1, 0, &[1]).unwrap(), 0, "acknowledged already");
        assert_eq!(close(&mut b, 1, 0, &[5]).unwrap(), 0);
        assert_eq!(b.core.test(idx).unwrap(), Some(600));
        let mut b = Bench::new(PLAIN);
        b.cts(&[(1000, 7)]);
        b.isend(600, 7).unwrap();
        assert!(close(&mut b, 1, 0, &[2]).is_err());
    }

    /// Two sends in flight, the receiver took the first only (it closed with a receive in
    /// flight): the first is done, the second fails at once with an error naming it, and the
    /// first stays done for its test.
    #[test]
    fn a_send_the_receiver_never_took_fails_at_once_and_names_itself() {
        let mut b = Bench::new(PLAIN);
        b.cts(&[(1000, 7)]);
        b.cts(&[(1000, 8)]);
        let first = started(b.isend(600, 7).unwrap());
        let second = started(b.isend(300, 8).unwrap());
        assert_eq!(b.posted.len(), 2);
        assert_eq!(close(&mut b, 1, 1, &[1]).unwrap(), 1);
        let e = b.core.fail_untaken().unwrap_err();
        assert!(
            e.message
                .contains("1 send(s) it never took were in flight (tag 8 (300 bytes))"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("took 1 receive(s) and closed with 1 posted"),
            "{}",
            e.message
        );
        assert_eq!(b.core.test(first).unwrap(), Some(600));
        assert!(b.core.test(second).is_err());
    }

    /// Split over two QPs, the receiver took one QP's half of a message only: the send is not
    /// done and fails.
    #[test]
    fn a_message_half_taken_is_not_taken() {
        let mut b = Bench::new(Opts {
            qps: 2,
            qps_per_req: 2,
            ..PLAIN
        });
        b.cts(&[(1 << 16, 7)]);
        let idx = started(b.isend(1 << 16, 7).unwrap());
        assert_eq!(b.posted.len(), 2, "one chain per QP");
        close(&mut b, 0, 1, &[1, 0]).unwrap();
        assert!(b.core.fail_untaken().is_err());
        assert!(b.core.test(idx).is_err());
    }

    /// The CTS rule at close: an entry the receiver wrote before it closed names a receive it
    /// abandoned. An isend after the close fails at once, naming itself; nothing is posted.
    #[test]
    fn after_the_close_no_cts_is_used_and_an_isend_fails_at_once() {
        let mut b = Bench::new(PLAIN);
        b.cts(&[(1000, 7)]);
        close(&mut b, 0, 1, &[0]).unwrap();
        let e = b.isend(600, 7).unwrap_err();
        assert!(
            e.message
                .contains("isend of 600 bytes (tag 7) finds no receiver's buffer"),
            "{}",
            e.message
        );
        assert!(b.posted.is_empty());
    }

    /// An isend after the close waits ("retry later") while a send the receiver took is done
    /// and untested, so a client that stops at its first error still sees it complete.
    #[test]
    fn an_isend_after_the_close_waits_for_the_done_sends_to_be_tested() {
        let mut b = Bench::new(PLAIN);
        b.cts(&[(1000, 7)]);
        let idx = started(b.isend(600, 7).unwrap());
        close(&mut b, 1, 0, &[1]).unwrap();
        assert_eq!(b.isend(10, 8).unwrap(), Isend::Busy);
        assert_eq!(b.core.test(idx).unwrap(), Some(600));
        assert!(b.isend(10, 8).is_err());
    }

    /// A group matched in part when the receiver closed: its sends are never posted and fail.
    #[test]
    fn a_group_matched_in_part_fails_at_the_close() {
        let mut b = Bench::new(PLAIN);
        b.cts(&[(1000, 7), (1000, 8)]);
        let idx = started(b.isend(600, 7).unwrap());
        close(&mut b, 0, 1, &[0]).unwrap();
        b.progress().unwrap();
        assert!(b.posted.is_empty());
        let e = b.core.fail_untaken().unwrap_err();
        assert!(e.message.contains("tag 7 (600 bytes)"), "{}", e.message);
        assert!(b.core.test(idx).is_err());
    }
}
