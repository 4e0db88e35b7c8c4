//! Completions and requests: a successful completion retires its QP's oldest chain (credits
//! back, one QP fewer for each request of the group to wait for); `test` reports a request
//! done and frees its slot.

use super::super::request::{ReqKind, SendWrId};
use super::chains::{eager_chain, SQ_DEPTH};
use super::SendCore;
use crate::error::{Error, Result};

impl SendCore {
    /// A successful completion: the final signaled write of one QP's chain for a group. It
    /// retires the whole chain: its WRs' credits come back, and each request of the group
    /// counts one of the QPs it waits for.
    pub fn handle_completion(&mut self, wr_id: u64) {
        // After the receiver's close its report settled every chain: a late acknowledgement
        // is one of those.
        if self.peer_closed.is_some() {
            return;
        }
        let w = SendWrId(wr_id);
        if let Some(c) = self.credits.get_mut(w.qp()) {
            *c = (usize::from(*c) + w.chain()).min(SQ_DEPTH) as u16;
        }
        // RC completes a QP's chains in order, each by its one signaled WR: this completion is
        // the oldest unretired chain's.
        let front = self.chains.get_mut(w.qp()).and_then(|log| {
            let f = log.front();
            log.pop();
            f
        });
        if let Some(slot) = front.and_then(eager_chain) {
            self.eager_acked(slot);
            return;
        }
        let pool = &mut self.state.pool;
        let n = pool.get(w.lane(0)).map_or(1, |r| r.n());
        for lane in 0..n {
            if let Some(r) = pool.get_mut(w.lane(lane)) {
                if r.kind() == ReqKind::Send {
                    r.complete_one();
                }
            }
        }
    }

    /// The eager write of slot `slot` was acknowledged (the receiver's NIC has it).
    pub(super) fn eager_acked(&mut self, slot: usize) {
        let Some(e) = self.eager.as_deref_mut() else {
            return;
        };
        if e.acked(slot) || e.busy & (1 << slot) == 0 {
            return;
        }
        e.acked |= 1 << slot;
        if !e.undecided(slot) {
            e.busy &= !(1 << slot);
        }
        if let Some(r) = self.state.pool.get_mut(e.req[slot]) {
            if r.kind() == ReqKind::Send {
                r.complete_one();
            }
        }
    }

    /// Whether send request `idx` is done: its size, and the slot is reclaimed. `None`: still
    /// in flight. A failed comm reports its error for every request but those a closed
    /// receiver took ([`SendCore::fail_untaken`]).
    pub fn test(&mut self, idx: u16) -> Result<Option<u32>> {
        let Some(r) = self.state.pool.get(idx) else {
            return Err(Error::internal("test: unknown send request"));
        };
        if !(r.kind() == ReqKind::Send && r.is_done() && !r.failed()) {
            self.state.check()?;
        }
        if r.kind() != ReqKind::Send {
            return Err(Error::internal(
                "test: the request is not in flight (already completed?)",
            ));
        }
        if r.pending != 0 {
            return Ok(None);
        }
        let size = r.size;
        self.state.pool.free(idx);
        Ok(Some(size))
    }

    /// The operation and byte count of a send `wr_id` (for a completion error's WARN).
    pub fn describe(&self, wr_id: u64) -> (&'static str, usize) {
        let w = SendWrId(wr_id);
        let pool = &self.state.pool;
        let n = pool.get(w.lane(0)).map_or(1, |r| r.n());
        let bytes = (0..n)
            .filter_map(|l| pool.get(w.lane(l)))
            .map(|r| r.size as usize)
            .sum();
        ("RDMA write (data)", bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{started, Bench, PLAIN};
    use super::*;

    /// A request is in flight until its chain's completion; then `test` reports its size once
    /// and frees the slot (a second test of it is an error).
    #[test]
    fn a_send_is_done_at_its_completion_and_reported_once() {
        let mut b = Bench::new(PLAIN);
        b.cts(&[(1000, 7)]);
        let idx = started(b.isend(600, 7).unwrap());
        assert_eq!(b.core.test(idx).unwrap(), None);
        assert!(b.core.chains_in_flight());
        b.complete_from(0);
        assert!(!b.core.chains_in_flight());
        assert_eq!(b.core.test(idx).unwrap(), Some(600));
        assert!(b.core.test(idx).is_err());
    }

    /// The completion of a chain of k WRs gives its k credits back.
    #[test]
    fn a_completion_gives_the_chain_s_credits_back() {
        let mut b = Bench::new(PLAIN);
        b.cts(&[(64, 1), (64, 1), (64, 1)]);
        for _ in 0..3 {
            b.isend(64, 1).unwrap();
        }
        assert_eq!(usize::from(b.core.credits[0]), SQ_DEPTH - 4);
        let (_, chain) = &b.posted[0];
        b.core.handle_completion(chain[3].wr_id);
        assert_eq!(usize::from(b.core.credits[0]), SQ_DEPTH);
        assert!(!b.core.chains_in_flight());
    }

    /// Every request of the group waits for its one QP; the group's completion ends both.
    #[test]
    fn a_group_s_completion_ends_each_of_its_requests() {
        let mut b = Bench::new(PLAIN);
        b.cts(&[(64, 1), (64, 2)]);
        let first = started(b.isend(10, 1).unwrap());
        let second = started(b.isend(20, 2).unwrap());
        assert_eq!(b.core.describe(b.posted[0].1[0].wr_id), ("RDMA write (data)", 30));
        b.complete_from(0);
        assert_eq!(b.core.test(first).unwrap(), Some(10));
        assert_eq!(b.core.test(second).unwrap(), Some(20));
    }

    #[test]
    fn testing_an_unknown_request_is_an_error() {
        let mut b = Bench::new(PLAIN);
        assert!(b.core.test(3).is_err());
    }
}
