//! The receiver's eager path ([`super::super::eager`]): the eager messages that landed are
//! decided in their order as their claimed groups are posted (bound: copied into the buffer,
//! the receive completes; refused: dropped, the sender sends it again through the CTS path).

use super::super::eager::{self, GroupView, Header, EAGER_QP};
use super::super::fifo;
use super::super::plan::Post;
use super::super::split;
use super::{EagerRecv, RecvCore, StagingRing, CLAIM_BOUND, CLAIM_LIVE, CLAIM_OK};
use crate::error::{Error, Result};

/// Why an eager header cannot come from an honest sender, if it cannot.
fn eager_header_lie(e: &EagerRecv, h: &Header) -> Option<String> {
    if u64::from(h.seq) != e.decided & u64::from(u32::MAX) {
        return Some(format!("says it is message {} where {} is due", h.seq, e.decided));
    }
    if h.len as usize > e.cfg.max {
        return Some(format!("says {} bytes, past the {} a slot holds", h.len, e.cfg.max));
    }
    // Claims increase within an epoch; a new epoch starts at the sender's next group, which a
    // refused claim of the last one may have named already.
    let again = h.epoch == e.last_epoch && e.last_claim.is_some_and(|c| h.claim <= c);
    if again || h.epoch < e.last_epoch {
        return Some(format!(
            "claims receive {} in epoch {} after receive {:?} in epoch {}",
            h.claim, h.epoch, e.last_claim, e.last_epoch
        ));
    }
    None
}

impl RecvCore {
    /// Decide the eager messages that arrived, in their order, as far as the groups they claim
    /// are posted ([`super::super::eager`]): a bound one is copied into its buffer and completes the
    /// receive; a refused one is dropped (the sender sends it again through the CTS path).
    /// Either way its slot is free, which the next CTS write's credit says. A header no honest
    /// sender writes fails the comm.
    pub fn decide_eager(
        &mut self,
        ring: &impl StagingRing,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<()> {
        let Some(e) = self.eager.as_mut() else {
            return Ok(());
        };
        while e.decided < e.arrived {
            let slot = eager::slot_of(e.decided);
            let h = Header::parse(&ring.load_eager_header(slot));
            if let Some(why) = eager_header_lie(e, &h) {
                let err = Error::remote(format!(
                    "the sender {} wrote an eager message (slot {slot}) whose header {why}: a corrupt or lying peer",
                    self.cfg.peer
                ));
                return Err(self.state.fail(err));
            }
            if e.refused_epoch == Some(h.epoch) {
                // A claim of an epoch already refused is refused whatever its group: decided at
                // once, so that it never waits for a receive NCCL may post only after later
                // messages (of the next epoch) arrived.
                e.refused += 1;
                e.last_claim = Some(h.claim);
                e.decided += 1;
                self.ring.prove(h.head);
                continue;
            }
            if h.claim >= self.counter {
                // Its group is not posted yet: decided at the irecv that posts it.
                return Ok(());
            }
            let pos = (0..fifo::RING).find(|&p| e.marks[p] & CLAIM_LIVE != 0 && e.groups[p].counter == h.claim as u32);
            let Some(pos) = pos else {
                let err = Error::remote(format!(
                    "the sender {} sent an eager message for receive {}, which this side has already completed: a corrupt or lying peer",
                    self.cfg.peer, h.claim
                ));
                return Err(self.state.fail(err));
            };
            let g = e.groups[pos];
            let view = GroupView {
                eager_ok: e.marks[pos] & CLAIM_OK != 0,
                tag: g.tag,
            };
            let req = u16::from(self.req_at[pos]);
            if eager::binds(view, h.tag, e.refused_epoch == Some(h.epoch)) {
                let len = u64::from(h.len).min(self.posted[pos]) as usize;
                let src = e.cfg.landing + (slot * e.cfg.slot_bytes + eager::EAGER_HEADER_BYTES) as u64;
                if len > 0 {
                    if let Err(err) = post(Post::Deliver { src, dst: g.addr, len }) {
                        return Err(self.state.fail(err));
                    }
                }
                e.marks[pos] |= CLAIM_BOUND;
                e.bound += 1;
                if let Some(r) = self.state.pool.get_mut(req) {
                    r.size = len as u32;
                    r.pending = 0;
                }
                let (nq, nqps) = (self.cfg.qps_per_req, self.cfg.routes.len());
                for j in 0..nq {
                    if let Some(rq) = self.rqs.get_mut(split::qp_for_chunk(h.claim, nq, j, nqps)) {
                        rq.forget(req);
                    }
                }
            } else {
                e.refused_epoch = Some(h.epoch);
                e.refused += 1;
            }
            e.last_claim = Some(h.claim);
            e.last_epoch = h.epoch;
            e.decided += 1;
            // The sender had read every CTS entry before `head` when it sent this.
            self.ring.prove(h.head);
        }
        Ok(())
    }

    /// An eager message arrived in landing slot `slot` over QP `qp` (decided by
    /// [`RecvCore::decide_eager`]). It must come on the eager QP, in order, within the credit.
    pub(super) fn eager_arrived(&mut self, qp: usize, slot: u32) {
        let Some(e) = self.eager.as_mut() else {
            return;
        };
        let due = eager::slot_of(e.arrived);
        let lie = if qp != EAGER_QP {
            Some(format!("on QP {qp}, not the eager QP {EAGER_QP}"))
        } else if slot as usize != due {
            Some(format!("into slot {slot} where slot {due} is due"))
        } else if e.arrived >= e.granted {
            Some(format!("past the credit of {} messages this side granted", e.granted))
        } else {
            None
        };
        let rq = self.rqs.get_mut(EAGER_QP);
        match (lie, rq) {
            (None, Some(rq)) if rq.spare > 0 => {
                rq.spare -= 1;
                rq.taken += 1;
                e.arrived += 1;
            }
            (lie, _) => {
                let why = lie.unwrap_or_else(|| "with no receive to spare for it".to_string());
                self.state.fail(Error::remote(format!(
                    "the sender {} wrote an eager message {why}: a corrupt or lying peer",
                    self.cfg.peer
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{Bench, Posted, EAGER, LANDING_ADDR, RECV_ADDR};
    use super::*;

    fn header(claim: u64, tag: i32, len: u32, seq: u32) -> Header {
        Header {
            claim,
            head: 0,
            tag,
            len,
            epoch: 0,
            seq,
        }
    }

    /// An eager message claiming a posted single host receive of its tag binds: its payload is
    /// copied into the buffer and the receive is done with its size.
    #[test]
    fn a_message_claiming_a_matching_receive_is_delivered() {
        let mut b = Bench::new(EAGER);
        let idx = b.started(&[(1000, 5)]);
        b.eager_lands(header(0, 5, 10, 0));
        b.decide_eager().unwrap();
        let src = LANDING_ADDR + eager::EAGER_HEADER_BYTES as u64;
        assert_eq!(
            b.posted.last(),
            Some(&Posted::Deliver {
                src,
                dst: RECV_ADDR as u64,
                len: 10
            })
        );
        assert_eq!(b.core.eager_counts().bound, 1);
        let done = b.core.test(&b.ring, idx).unwrap().expect("done");
        assert_eq!((done.n, done.sizes[0]), (1, 10));
    }

    /// A claim on a receive of another tag is refused: nothing delivered, the receive waits
    /// for the sender's write through the CTS path.
    #[test]
    fn a_message_claiming_another_tag_is_refused() {
        let mut b = Bench::new(EAGER);
        let idx = b.started(&[(1000, 5)]);
        b.eager_lands(header(0, 6, 10, 0));
        b.decide_eager().unwrap();
        assert_eq!(b.core.eager_counts().refused, 1);
        assert!(!b.posted.iter().any(|p| matches!(p, Posted::Deliver { .. })));
        assert_eq!(b.core.test(&b.ring, idx).unwrap(), None);
    }

    /// A claim on a receive not posted yet waits for the irecv that posts it.
    #[test]
    fn a_message_ahead_of_its_receive_is_decided_when_it_is_posted() {
        let mut b = Bench::new(EAGER);
        let first = b.started(&[(1000, 5)]);
        b.eager_lands(header(1, 5, 10, 0));
        b.decide_eager().unwrap();
        assert_eq!(b.core.eager_counts().bound, 0);
        let second = b.started(&[(1000, 5)]);
        assert_eq!(b.core.eager_counts().bound, 1);
        assert_eq!(b.core.test(&b.ring, first).unwrap(), None);
        assert!(b.core.test(&b.ring, second).unwrap().is_some());
    }

    /// A header no honest sender writes (out of order, past a slot) fails the comm.
    #[test]
    fn a_lying_header_fails_the_comm() {
        let mut b = Bench::new(EAGER);
        b.started(&[(1000, 5)]);
        b.eager_lands(header(0, 5, EAGER_MAX_PLUS, 0));
        assert!(b.decide_eager().is_err());
        assert!(b.core.state.check().is_err());
    }
    const EAGER_MAX_PLUS: u32 = super::super::tests::EAGER_MAX as u32 + 1;

    /// An eager message before any credit was granted is a lie too.
    #[test]
    fn a_message_past_the_credit_fails_the_comm() {
        let mut b = Bench::new(EAGER);
        b.eager_lands(header(0, 5, 10, 0));
        assert!(b.core.state.check().is_err());
    }
}
