//! The books of each data QP's send queue: its credits ([`SQ_DEPTH`]) and the chains posted on
//! it and not yet retired ([`ChainLog`]), oldest first, each named by the request in its lane 0
//! or, for an eager message, by its slot ([`EAGER_CHAIN`]). RC retires a QP's chains in order,
//! so a completion is always the oldest chain's, and a recovery knows which chains the
//! receiver's count of taken messages covers.

use super::super::eager;
use super::super::limits::MAX_CHAIN;
use super::super::request;

/// Send-queue credits of a data QP, its `max_send_wr`, and its CQ entries. Bound: WRs posted on
/// the QP and not yet retired by a polled completion ≤ SQ_DEPTH (the credits), so the send
/// queue cannot overflow, and neither can the CQ: a QP puts at most one entry per chain there
/// (its signaled WR), or one per WR when it fails and flushes them all. 64: 64 single messages
/// or 7 groups of 8 (9 WRs each) in flight per QP; a chain is ≤ [`MAX_CHAIN`] WRs, so an idle
/// QP always takes one.
pub const SQ_DEPTH: usize = 64;
const _: () = assert!(SQ_DEPTH >= MAX_CHAIN && SQ_DEPTH <= u16::MAX as usize);

/// The chains of one QP posted and not yet retired by a successful completion, oldest first
/// (RC retires them in that order), each named by the request in its lane 0, and how many
/// chains the QP was given since the connection was made.
#[derive(Clone, Copy)]
pub(super) struct ChainLog {
    lane0: [u8; SQ_DEPTH],
    head: u8,
    pub(super) len: u8,
    pub(super) posted: u64,
}

const _: () = assert!(SQ_DEPTH < u8::MAX as usize, "a chain count fits u8");
/// A chain log entry of an eager message: this bit and its slot (request indices stay below).
pub(super) const EAGER_CHAIN: u16 = 0x80;
const _: () = assert!(
    request::SEND_REQUESTS <= EAGER_CHAIN as usize,
    "request indices stay below the mark"
);
const _: () = assert!(eager::SLOTS < EAGER_CHAIN as usize, "a slot fits beside the mark");

/// The slot of an eager chain's log entry (`None`: a group's chain).
pub(super) fn eager_chain(lane0: u16) -> Option<usize> {
    (lane0 & EAGER_CHAIN != 0).then_some(usize::from(lane0 & !EAGER_CHAIN))
}
const _: () = assert!(request::SEND_REQUESTS <= u8::MAX as usize, "a request index fits u8");

impl ChainLog {
    pub(super) const EMPTY: ChainLog = ChainLog {
        lane0: [0; SQ_DEPTH],
        head: 0,
        len: 0,
        posted: 0,
    };
    pub(super) fn push(&mut self, lane0: u16) {
        // A chain takes ≥ 1 credit of SQ_DEPTH, so at most SQ_DEPTH are unretired.
        if usize::from(self.len) < SQ_DEPTH {
            self.lane0[(usize::from(self.head) + usize::from(self.len)) % SQ_DEPTH] = lane0 as u8;
            self.len += 1;
        }
        self.posted += 1;
    }
    pub(super) fn pop(&mut self) {
        if self.len > 0 {
            self.head = ((usize::from(self.head) + 1) % SQ_DEPTH) as u8;
            self.len -= 1;
        }
    }
    pub(super) fn at(&self, k: usize) -> u16 {
        u16::from(self.lane0[(usize::from(self.head) + k) % SQ_DEPTH])
    }
    /// The oldest unretired chain's entry (the one the next completion retires).
    pub(super) fn front(&self) -> Option<u16> {
        (self.len > 0).then(|| self.at(0))
    }
    /// Chains retired so far.
    pub(super) fn retired(&self) -> u64 {
        self.posted - u64::from(self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chains retire oldest first; the log counts every chain posted, so a recovery can tell
    /// how many were retired from the receiver's count.
    #[test]
    fn chains_retire_in_posting_order_and_are_counted() {
        let mut log = ChainLog::EMPTY;
        assert_eq!((log.front(), log.retired()), (None, 0));
        for lane0 in [5, 9, EAGER_CHAIN | 3] {
            log.push(lane0);
        }
        assert_eq!((log.front(), log.len, log.posted, log.retired()), (Some(5), 3, 3, 0));
        log.pop();
        assert_eq!((log.front(), log.at(1), log.retired()), (Some(9), EAGER_CHAIN | 3, 1));
        log.pop();
        log.pop();
        log.pop();
        assert_eq!(
            (log.front(), log.len, log.retired()),
            (None, 0, 3),
            "popping an empty log does nothing"
        );
    }

    /// The log holds at most SQ_DEPTH chains (a chain takes at least one credit); one more is
    /// still counted as posted.
    #[test]
    fn the_log_wraps_around_its_ring_and_holds_sq_depth_chains() {
        let mut log = ChainLog::EMPTY;
        for i in 0..SQ_DEPTH as u16 + 10 {
            log.push(i % 64);
            if i >= 10 {
                log.pop();
            }
        }
        assert_eq!((usize::from(log.len), log.posted), (10, SQ_DEPTH as u64 + 10));
        assert_eq!(log.front(), Some(SQ_DEPTH as u16 % 64));
    }

    #[test]
    fn an_eager_entry_names_its_slot_and_a_group_entry_none() {
        assert_eq!(eager_chain(EAGER_CHAIN | 15), Some(15));
        assert_eq!(eager_chain(0), None);
        assert_eq!(eager_chain(63), None);
    }
}
