//! What a send that completes nothing waits for, decided from facts: the cause its hang report
//! names (docs/observability.md#hang-reports). Pure: the I/O layer gathers the facts — whether
//! the peer's comm closed (its side channel), and, where the NIC counts them per QP (softroce),
//! the transport events of the comm's QPs since the wait began — and words the report from the
//! cause this module picks.
//!
//! The three causes it tells apart, each from what only it produces:
//!
//! * **The peer's comm closed** (its `CommClosed` arrived, or its side channel ended): the
//!   writes wait for ACKs from QPs that are gone. Seen first, whatever the QPs show: a closed
//!   peer also makes them time out.
//! * **Receiver not ready** (RNR NAKs arrived): the peer's NIC answers, but no receive was
//!   posted for the write with immediate, and with `rnr_retry` 7 the NIC retries without end.
//! * **A silent peer** (ACK timeouts, no RNR NAK, side channel up): the process is alive but
//!   its NIC, or the path to it, does not answer.
//!
//! Without per-QP counters (a real NIC) RNR and silence look alike from here: the report says so
//! and names both.

/// Transport events of a comm's QPs (summed), as the NIC counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpEvents {
    /// Local ACK timeouts: a request went unanswered for the QP's timeout.
    pub timeouts: u64,
    /// Request packets sent again (after timeouts, NAKs, probes).
    pub retransmits: u64,
    /// RNR NAKs received: the peer's receive queue was empty.
    pub rnr_naks: u64,
}

impl QpEvents {
    /// The events since `earlier` (a snapshot of the same QPs).
    pub fn since(self, earlier: QpEvents) -> QpEvents {
        QpEvents {
            timeouts: self.timeouts.saturating_sub(earlier.timeouts),
            retransmits: self.retransmits.saturating_sub(earlier.retransmits),
            rnr_naks: self.rnr_naks.saturating_sub(earlier.rnr_naks),
        }
    }

    /// The sum of two QPs' events.
    pub fn plus(self, other: QpEvents) -> QpEvents {
        QpEvents {
            timeouts: self.timeouts + other.timeouts,
            retransmits: self.retransmits + other.retransmits,
            rnr_naks: self.rnr_naks + other.rnr_naks,
        }
    }
}

/// What the I/O layer knows when a comm has made no progress for the hang interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// The peer closed its comm or its process ended (side channel closed, `CommClosed` seen).
    pub peer_closed: bool,
    /// The QPs' transport events since the wait began; `None`: the NIC does not count them.
    pub qp: Option<QpEvents>,
}

/// Why posted writes complete nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The peer's comm closed while the writes wait for their ACKs.
    PeerClosed,
    /// The peer's NIC answers with RNR NAKs (this many since the wait began).
    ReceiverNotReady { rnr_naks: u64 },
    /// The peer is alive (side channel up) but its NIC does not answer (ACK timeouts, no RNR).
    PeerSilent { timeouts: u64 },
    /// Side channel up and no transport event since the wait began: the NIC has not retried
    /// yet (its ACK timeout, NCCL_IB_TIMEOUT, is longer than the wait so far).
    NoEventYet,
    /// Side channel up, and the NIC counts nothing per QP: RNR or a silent peer.
    Unknown,
}

/// The cause the facts show (see the module doc for the order).
pub fn cause(f: &Facts) -> Cause {
    if f.peer_closed {
        return Cause::PeerClosed;
    }
    match f.qp {
        None => Cause::Unknown,
        Some(e) if e.rnr_naks > 0 => Cause::ReceiverNotReady { rnr_naks: e.rnr_naks },
        Some(e) if e.timeouts > 0 => Cause::PeerSilent { timeouts: e.timeouts },
        Some(_) => Cause::NoEventYet,
    }
}

/// The hang report's words for `c` (what follows "waiting for <completions of N posted sends>").
pub fn describe(c: Cause) -> String {
    const BOUND: &str = "NCCL_IB_TIMEOUT x NCCL_IB_RETRY_CNT bounds that wait, and then the send fails";
    match c {
        Cause::PeerClosed => format!(
            "Cause: the peer closed its comm (its side channel closed) while these writes wait for their ACKs, which QPs that are gone never send; {BOUND} — look at why the peer closed (its log)"
        ),
        Cause::ReceiverNotReady { rnr_naks } => format!(
            "Cause: receiver-not-ready (RNR): the peer's NIC answered with {rnr_naks} RNR NAK(s) since the wait began — the peer posted no receive for the write with immediate, which the NIC retries without end (rnr_retry 7, as NCCL sets it): is the peer a ferroce or NCCL receiver, and is its proxy thread alive?"
        ),
        Cause::PeerSilent { timeouts } => format!(
            "Cause: the peer is alive (its side channel is up) but its NIC does not answer: {timeouts} ACK timeout(s) and no RNR NAK since the wait began — check the link, the GIDs and the routing between the two NICs; {BOUND}"
        ),
        Cause::NoEventYet => format!(
            "Cause not known yet: the peer's side channel is up and the QPs have seen no ACK timeout and no RNR NAK since the wait began (the NIC's ACK timeout, NCCL_IB_TIMEOUT, is longer than the wait so far); {BOUND}"
        ),
        Cause::Unknown => format!(
            "Cause: the peer's side channel is up, and this NIC does not count retries per QP, so either receiver-not-ready (RNR) — the peer posted no receive for the write with immediate, which the NIC retries without end (rnr_retry 7, as NCCL sets it): is the peer a ferroce or NCCL receiver, and alive? — or the network or the peer's NIC does not answer (check the link and the GID; {BOUND})"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUIET: QpEvents = QpEvents {
        timeouts: 0,
        retransmits: 0,
        rnr_naks: 0,
    };

    fn facts(peer_closed: bool, qp: Option<QpEvents>) -> Facts {
        Facts { peer_closed, qp }
    }

    #[test]
    fn a_closed_peer_is_named_whatever_the_qps_show() {
        for qp in [
            None,
            Some(QUIET),
            Some(QpEvents { timeouts: 3, ..QUIET }),
            Some(QpEvents { rnr_naks: 9, ..QUIET }),
        ] {
            assert_eq!(cause(&facts(true, qp)), Cause::PeerClosed, "{qp:?}");
        }
        let text = describe(Cause::PeerClosed);
        assert!(
            text.contains("the peer closed its comm") && !text.contains("RNR"),
            "{text}"
        );
    }

    #[test]
    fn rnr_naks_mean_receiver_not_ready_even_with_timeouts() {
        let e = QpEvents {
            timeouts: 2,
            retransmits: 40,
            rnr_naks: 17,
        };
        assert_eq!(cause(&facts(false, Some(e))), Cause::ReceiverNotReady { rnr_naks: 17 });
        let text = describe(Cause::ReceiverNotReady { rnr_naks: 17 });
        assert!(
            text.contains("receiver-not-ready (RNR)") && text.contains("17 RNR NAK"),
            "{text}"
        );
        assert!(!text.contains("closed"), "{text}");
    }

    #[test]
    fn timeouts_without_rnr_on_an_open_side_channel_mean_a_silent_peer() {
        let e = QpEvents {
            timeouts: 4,
            retransmits: 4,
            rnr_naks: 0,
        };
        assert_eq!(cause(&facts(false, Some(e))), Cause::PeerSilent { timeouts: 4 });
        let text = describe(Cause::PeerSilent { timeouts: 4 });
        assert!(
            text.contains("alive") && text.contains("does not answer") && !text.contains("receiver-not-ready"),
            "{text}"
        );
        // Retransmissions alone (probes, sequence NAKs) are no silence: the peer answers.
        let e = QpEvents {
            retransmits: 5,
            ..QUIET
        };
        assert_eq!(cause(&facts(false, Some(e))), Cause::NoEventYet);
    }

    #[test]
    fn no_counters_or_no_event_yet_say_what_is_not_known() {
        assert_eq!(cause(&facts(false, None)), Cause::Unknown);
        assert_eq!(cause(&facts(false, Some(QUIET))), Cause::NoEventYet);
        let text = describe(Cause::Unknown);
        assert!(
            text.contains("either receiver-not-ready (RNR)") && text.contains("or the network"),
            "{text}"
        );
        assert!(describe(Cause::NoEventYet).contains("not known yet"));
    }

    #[test]
    fn events_since_a_snapshot_and_summed_over_qps() {
        let a = QpEvents {
            timeouts: 1,
            retransmits: 2,
            rnr_naks: 3,
        };
        let b = QpEvents {
            timeouts: 10,
            retransmits: 20,
            rnr_naks: 30,
        };
        assert_eq!(
            a.plus(b),
            QpEvents {
                timeouts: 11,
                retransmits: 22,
                rnr_naks: 33
            }
        );
        assert_eq!(
            b.since(a),
            QpEvents {
                timeouts: 9,
                retransmits: 18,
                rnr_naks: 27
            }
        );
        // A QP replaced meanwhile (recovery) counts from zero again: never negative.
        assert_eq!(a.since(b), QUIET);
    }
}
