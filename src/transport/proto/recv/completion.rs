//! Completions and requests: a receive's completion goes to the request it is owed to (in
//! posting order on its QP, or the one its immediate names on a version-5 connection); `test`
//! reports a request's sizes, never more than was posted.

use super::super::eager::Imm;
use super::super::fifo;
use super::super::limits::MAX_RECVS;
use super::super::request::ReqKind;
use super::rq::ReceiveQueue;
use super::wr_id::{cts_parts, index, KIND_CTS, KIND_FLUSH, KIND_RECV, KIND_SHIFT};
use super::{Oversized, RecvCore, RecvDone, StagingRing, CLAIM_BOUND, SIZE_IN_RECORD};
use crate::error::{Error, Result};

impl RecvCore {
    /// A successful completion on a data CQ: a receive (with the sender's immediate) or a
    /// signaled CTS write (it and every CTS write before it on that QP are retired).
    ///
    /// The immediate of a single receive is its size; a grouped receive's names the ring
    /// position of the group's completion record, which must be the group's own: anything else
    /// is a replayed or forged completion (an honest sender's receives complete in posting
    /// order on each QP), and fails the comm.
    pub fn handle_completion(&mut self, wr_id: u64, imm: Option<u32>) {
        match wr_id >> KIND_SHIFT {
            KIND_RECV if self.cfg.named_imm => {
                let qp = usize::from(index(wr_id));
                self.named_completion(qp, imm);
            }
            KIND_RECV => {
                let qp = usize::from(index(wr_id));
                let Some(idx) = self.rqs.get_mut(qp).and_then(ReceiveQueue::pop) else {
                    self.state.fail(Error::remote(format!(
                        "the sender {} completed a message on QP {qp} that no posted receive waits for (an RDMA write with immediate it was not asked for: a replayed, duplicated or forged completion)",
                        self.cfg.peer
                    )));
                    return;
                };
                let Some(r) = self.state.pool.get_mut(idx) else {
                    return;
                };
                if r.kind() != ReqKind::Recv {
                    return;
                }
                let (n, pos) = (r.n(), r.pos());
                match imm {
                    Some(imm) if n > 1 && imm as usize != pos => {
                        let e = Error::remote(format!(
                            "the sender {} completed a grouped receive of {n} buffers (completion record at staging entry {pos}) with the immediate {imm}, which names another group's record: a replayed or forged completion from a corrupt or lying peer",
                            self.cfg.peer
                        ));
                        // The comm's error from now on (state.check returns it).
                        self.state.fail(e);
                    }
                    Some(imm) => {
                        r.size = imm;
                        r.complete_one();
                    }
                    None => {
                        r.complete_one();
                    }
                }
            }
            KIND_CTS => {
                let (d, seq) = cts_parts(wr_id);
                if let Some(r) = self.cts_retired.get_mut(d) {
                    *r = (*r).max(seq + 1);
                }
            }
            _ => {}
        }
    }

    /// A completion on QP `qp` of a version-5 connection: its immediate names the receive.
    pub(super) fn named_completion(&mut self, qp: usize, imm: Option<u32>) {
        let (pos, size) = match imm.map(Imm::parse) {
            Some(Imm::Eager { slot }) if self.eager.is_some() => return self.eager_arrived(qp, slot as u32),
            Some(Imm::Single { pos, size }) => (pos, Some(size)),
            Some(Imm::Record { pos }) => (pos, None),
            _ => (fifo::RING, None),
        };
        let r = self.req_at.get(pos).map_or(u16::MAX, |&r| u16::from(r));
        let live = self
            .state
            .pool
            .get(r)
            .is_some_and(|q| q.kind() == ReqKind::Recv && q.pos() == pos && (q.n() == 1 || size.is_none()));
        if !live || !self.rqs.get_mut(qp).is_some_and(|q| q.take(r)) {
            self.state.fail(Error::remote(format!(
                "the sender {} completed a message on QP {qp} with the immediate {imm:?}, which names no receive waiting there: a replayed or forged completion (or a duplicated one)",
                self.cfg.peer
            )));
            return;
        }
        if let Some(q) = self.state.pool.get_mut(r) {
            q.size = size.unwrap_or(SIZE_IN_RECORD);
            q.complete_one();
        }
    }

    /// A successful read on a flush CQ: one device of the flush request is done.
    pub fn handle_flush_completion(&mut self, wr_id: u64) {
        if wr_id >> KIND_SHIFT != KIND_FLUSH {
            return;
        }
        if let Some(r) = self.state.pool.get_mut(index(wr_id)) {
            if r.kind() == ReqKind::Flush {
                r.complete_one();
            }
        }
    }

    /// The kind of request `idx` (`None`: not one of ours).
    pub fn kind_of(&self, idx: u16) -> Option<ReqKind> {
        self.state.pool.get(idx).map(|r| r.kind())
    }

    /// Whether request `idx` is done: a receive reports its sizes (never more than was
    /// posted, whatever the peer claims) and gives its ring entries back; the slot is
    /// reclaimed. `None`: still in flight. A failed comm reports its error for every request.
    pub fn test(&mut self, ring: &impl StagingRing, idx: u16) -> Result<Option<RecvDone>> {
        self.state.check()?;
        let Some(r) = self.state.pool.get(idx) else {
            return Err(Error::internal("test: unknown receive request"));
        };
        let kind = r.kind();
        if kind != ReqKind::Recv && kind != ReqKind::Flush {
            return Err(Error::internal(
                "test: the request is not in flight (already completed?)",
            ));
        }
        if r.pending != 0 {
            return Ok(None);
        }
        let mut done = RecvDone {
            n: 0,
            sizes: [0; MAX_RECVS],
            oversized: None,
        };
        if kind == ReqKind::Recv {
            let (n, pos) = (r.n(), r.pos());
            for i in 0..n {
                let got = if n == 1 && r.size != SIZE_IN_RECORD {
                    r.size
                } else {
                    ring.load_record(pos, i)
                };
                let posted = self.posted[fifo::ring_pos((pos + i) as u64)];
                if u64::from(got) > posted && !self.oversized_reported {
                    self.oversized_reported = true;
                    done.oversized = Some(Oversized {
                        buffer: i,
                        n,
                        claimed: got,
                        posted,
                    });
                }
                done.sizes[i] = u64::from(got).min(posted) as u32;
            }
            done.n = n;
            self.recvs_in_flight -= 1;
            // We have read the group's record, and unless an eager message filled it the
            // sender consumed it (it sent), and every group before it: its ring entries are
            // free once every group posted before it is too. An eager group's entries wait
            // until the sender is known to have read them. The ring position is mod RING; the
            // absolute start is the one at or below the ring's next start.
            let start = self.ring.abs_start(pos);
            let bound = match self.eager.as_mut() {
                Some(e) => {
                    let bound = e.marks[pos] & CLAIM_BOUND != 0;
                    e.marks[pos] = 0;
                    bound
                }
                None => false,
            };
            if !bound {
                self.ring.prove(start + n as u64);
            }
            self.ring.release(start, n);
        } else {
            self.flushes_in_flight -= 1;
        }
        self.state.pool.free(idx);
        Ok(Some(done))
    }

    /// The operation and byte count of a `wr_id` (for a completion error's WARN).
    pub fn describe(&self, wr_id: u64) -> (&'static str, usize) {
        let low = index(wr_id);
        let r = match wr_id >> KIND_SHIFT {
            KIND_RECV => self.rqs.get(usize::from(low)).and_then(ReceiveQueue::front),
            _ => Some(low),
        }
        .and_then(|i| self.state.pool.get(i));
        match wr_id >> KIND_SHIFT {
            // (The byte count of a failed receive is the announced size, when one arrived.)
            KIND_RECV => (
                "receive (RDMA write with immediate from the sender)",
                r.map_or(0, |r| r.size as usize),
            ),
            KIND_CTS => ("RDMA write (CTS to the sender)", fifo::ENTRY_BYTES),
            KIND_FLUSH => ("RDMA read (GPU flush)", 1),
            _ => ("unknown operation", 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{Bench, EAGER, PLAIN};
    use super::*;

    /// A single receive is done at its completion; its size is the immediate.
    #[test]
    fn a_single_receive_reports_the_immediate_as_its_size() {
        let mut b = Bench::new(PLAIN);
        let idx = b.started(&[(1000, 1)]);
        assert_eq!(b.core.test(&b.ring, idx).unwrap(), None);
        b.complete(0, Some(700));
        let done = b.core.test(&b.ring, idx).unwrap().expect("done");
        assert_eq!((done.n, done.sizes[0], done.oversized), (1, 700, None));
        assert!(b.core.test(&b.ring, idx).is_err(), "reported once");
    }

    /// A size past the posted one is clamped, and reported (once per comm) as a lying peer.
    #[test]
    fn a_claim_past_the_posted_size_is_clamped_and_reported_once() {
        let mut b = Bench::new(PLAIN);
        let first = b.started(&[(1000, 1)]);
        let second = b.started(&[(1000, 1)]);
        b.complete(0, Some(5000));
        b.complete(0, Some(5000));
        let done = b.core.test(&b.ring, first).unwrap().expect("done");
        let claim = Oversized {
            buffer: 0,
            n: 1,
            claimed: 5000,
            posted: 1000,
        };
        assert_eq!((done.sizes[0], done.oversized), (1000, Some(claim)));
        let done = b.core.test(&b.ring, second).unwrap().expect("done");
        assert_eq!((done.sizes[0], done.oversized), (1000, None));
    }

    /// A grouped receive's sizes are in its completion record; its immediate names the
    /// record's ring position, and one naming another fails the comm.
    #[test]
    fn a_grouped_receive_reads_its_record_and_checks_the_immediate() {
        let mut b = Bench::new(PLAIN);
        b.started(&[(10, 1)]);
        let idx = b.started(&[(1000, 2), (1000, 3)]);
        b.complete(0, Some(10));
        b.ring.records[1][..2].copy_from_slice(&[300, 400]);
        b.complete(0, Some(1));
        let done = b.core.test(&b.ring, idx).unwrap().expect("done");
        assert_eq!((done.n, &done.sizes[..2]), (2, &[300, 400][..]));
        let mut b = Bench::new(PLAIN);
        b.started(&[(1000, 2), (1000, 3)]);
        b.complete(0, Some(5));
        assert!(b.core.state.check().is_err());
    }

    /// A completion no receive waits for fails the comm (plain and named immediates).
    #[test]
    fn a_completion_nobody_is_owed_fails_the_comm() {
        let mut b = Bench::new(PLAIN);
        b.complete(0, Some(1));
        assert!(b.core.state.check().is_err());
        let mut b = Bench::new(EAGER);
        b.started(&[(1000, 1)]);
        b.complete(0, Some(Imm::Single { pos: 3, size: 1 }.to_u32()));
        assert!(b.core.state.check().is_err());
    }

    /// A named completion finds its receive by ring position.
    #[test]
    fn a_named_completion_finds_its_receive() {
        let mut b = Bench::new(EAGER);
        b.started(&[(1000, 1)]);
        let idx = b.started(&[(1000, 1)]);
        b.complete(0, Some(Imm::Single { pos: 1, size: 9 }.to_u32()));
        assert_eq!(b.core.test(&b.ring, idx).unwrap().map(|d| d.sizes[0]), Some(9));
    }
}
