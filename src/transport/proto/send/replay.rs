//! Carrying a connection over a recovery ([`super::super::recovery`]): nothing is posted
//! between [`SendCore::begin_recovery`] and [`SendCore::resume`]; then, per QP, the chains the
//! receiver took count as done and the rest are posted again, in order, on the new QPs.

use super::super::fifo::{self, CtsEntry};
use super::super::limits::{MAX_CHAIN, MAX_DEVS, MAX_RECVS};
use super::super::plan::{Post, QpRoute, WorkRequest};
use super::super::request::ReqKind;
use super::super::split::{self, WrPlan};
use super::chains::{eager_chain, SQ_DEPTH};
use super::kept::KEPT_COUNTER_MASK;
use super::{CurGroup, FifoRing, SendCore};
use crate::error::{Error, Result};

/// What [`SendCore::resume`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Chains the receiver had taken although their completions never came back here.
    pub landed: usize,
    /// Chains posted again, and their bytes.
    pub chains: usize,
    pub bytes: u64,
}

impl SendCore {
    /// Stop posting: the connection's QPs failed and are being replaced ([`super::super::recovery`]).
    /// isend says "retry later" until [`SendCore::resume`]. Completions polled meanwhile are
    /// still taken (a success is a chain the receiver has), failed ones are dropped.
    pub fn begin_recovery(&mut self) {
        self.recovering = true;
    }

    /// The recovery placed the QPs on other members (failover, failback): later chains and
    /// the replay take the new routes.
    pub fn reroute(&mut self, routes: &[QpRoute]) -> Result<()> {
        super::super::plan::reroute(&mut self.cfg.routes, routes, self.nldevs, self.nrdevs)
    }

    #[cfg(any(test, feature = "testing"))]
    pub fn recovering(&self) -> bool {
        self.recovering
    }

    /// The sender's part of a recovery report: the absolute FIFO entry its next group starts
    /// at (every CTS entry before it was consumed; the receiver writes the rest again).
    pub fn fifo_head(&self) -> u64 {
        self.head
    }

    /// Carry on over the connection's new QPs (empty send queues) once the receiver said how
    /// many write-with-immediate completions it took on each QP since the connection was made
    /// (`taken`, one per QP). On each QP the chains up to that count landed: those whose
    /// completion never came back here count as done; the rest are posted again, in their
    /// order, into `post`. Nothing the receiver took is written again, so no buffer NCCL may
    /// already reuse is touched. A count no honest receiver gives (fewer than this side saw
    /// acknowledged, more than it posted) fails the comm.
    pub fn resume(
        &mut self,
        ring: &impl FifoRing,
        taken: &[u64],
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<Replayed> {
        self.state.check()?;
        self.check_taken(taken, false)?;
        let mut done = Replayed::default();
        for (q, &t) in taken.iter().enumerate() {
            self.credits[q] = SQ_DEPTH as u16;
            let log = self.chains[q];
            let landed = (t - log.retired()) as usize;
            for k in 0..usize::from(log.len) {
                let lane0 = log.at(k);
                if let Some(slot) = eager_chain(lane0) {
                    if k < landed {
                        self.eager_acked(slot);
                        done.landed += 1;
                    } else {
                        done.chains += 1;
                        done.bytes += self.replay_eager(slot, post)?;
                    }
                    continue;
                }
                let Some((g, pos)) = self.kept_group(ring, lane0) else {
                    return Err(self.state.fail(Error::internal(format!(
                        "recovery: chain {k} of QP {q} names no send in flight"
                    ))));
                };
                if k < landed {
                    for &r in &g.reqs[..g.n] {
                        if let Some(req) = self.state.pool.get_mut(r) {
                            req.complete_one();
                        }
                    }
                    done.landed += 1;
                    continue;
                }
                done.chains += 1;
                done.bytes += self.replay_chain(&g, pos, q, self.kept_counter(lane0), post)?;
            }
            // The landed chains are retired; the log keeps the ones posted again, in order.
            let log = &mut self.chains[q];
            for _ in 0..landed {
                log.pop();
            }
        }
        self.recovering = false;
        Ok(done)
    }

    /// Fail the comm unless `taken` has one count per QP, each at most the chains this side
    /// posted there and, unless `acked_may_lead`, at least the chains it saw acknowledged (a
    /// recovery's counts are final; a close's are what the receiver polled, and an
    /// acknowledgement may come before the receiver polls the write's completion).
    pub(super) fn check_taken(&mut self, taken: &[u64], acked_may_lead: bool) -> Result<()> {
        if taken.len() != self.qps() {
            return Err(self.state.fail(Error::remote(format!(
                "the receiver {} reported completions for {} QPs in its recovery or close message, the connection has {}: a corrupt or incompatible peer",
                self.cfg.peer,
                taken.len(),
                self.qps()
            ))));
        }
        for (q, (&t, log)) in taken.iter().zip(self.chains.iter()).enumerate() {
            if t < log.retired() && !acked_may_lead || t > log.posted {
                return Err(self.state.fail(Error::remote(format!(
                    "the receiver {} says it took {t} messages on QP {q}, but this side posted {} there and {} were acknowledged: a corrupt or lying peer",
                    self.cfg.peer,
                    log.posted,
                    log.retired()
                ))));
            }
        }
        Ok(())
    }

    /// Post group `g`'s (posting counter `id`, ring position `pos`) chain of QP `q` again, as it
    /// was planned; its payload bytes.
    fn replay_chain(
        &mut self,
        g: &CurGroup,
        pos: usize,
        q: usize,
        id: u64,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<u64> {
        let mut plan = [WrPlan::ZeroImm; MAX_CHAIN];
        let mut chain = [WorkRequest::EMPTY; MAX_CHAIN];
        let nq = self.cfg.qps_per_req;
        let nqps = self.qps();
        let Some(j) = (0..nq).find(|&j| split::qp_for_chunk(id, nq, j, nqps) == q) else {
            return Err(self
                .state
                .fail(Error::internal(format!("recovery: group {id} has no chunk on QP {q}"))));
        };
        let ar_split = g.n == 1 && self.cfg.ar_threshold.is_some_and(|t| g.len[0] > t);
        let record = self.record_form(&g.len[..g.n]);
        let planned = split::plan_chain_as(&g.len[..g.n], nq, j, ar_split, record, self.cfg.wr_bytes, &mut plan);
        let Some(wrs) = planned else {
            return Err(self.state.fail(self.oversized_group()));
        };
        self.build_chain(g, q, &plan[..wrs], pos, &mut chain);
        self.credits[q] = self.credits[q].saturating_sub(wrs as u16);
        let bytes = chain[..wrs]
            .iter()
            .map(|w| w.local.map_or(0, |s| u64::from(s.len)))
            .sum::<u64>();
        if let Err(e) = post(Post::Send {
            qp: q,
            chain: &chain[..wrs],
        }) {
            return Err(self.state.fail(e));
        }
        Ok(bytes)
    }

    /// Post the eager write of slot `slot` again (a recovery found it had not landed); its
    /// payload bytes.
    pub(super) fn replay_eager(&mut self, slot: usize, post: &mut impl FnMut(Post<'_>) -> Result<()>) -> Result<u64> {
        if self.eager.is_none() {
            return Err(self.state.fail(Error::internal(
                "recovery: an eager chain on a connection without the eager path",
            )));
        }
        let send = self.eager_kept_send(slot);
        // The chain log keeps the chain where it was (the recovery posts in its order).
        self.post_eager(slot, send, post)?;
        Ok(send.size as u64)
    }

    /// The posting counter of the group request `r` belongs to (its low bits are kept; the
    /// group is one of the last 2^26 posted).
    pub(super) fn kept_counter(&self, r: u16) -> u64 {
        let low = self.kept.get(usize::from(r)).map_or(0, |k| k.counter_low());
        let back = self.counter.wrapping_sub(low) & KEPT_COUNTER_MASK;
        self.counter.wrapping_sub(back)
    }

    /// The posted group request `r` belongs to, as it was planned: its requests, buffers and
    /// CTS entries (from our FIFO ring, where they stay until the receiver completed the group:
    /// only then does it post into these entries again; the first entry's rkeys from
    /// `first_rkeys`), and its ring position. `None`: `r` is not a send in flight.
    pub(super) fn kept_group(&self, ring: &impl FifoRing, r: u16) -> Option<(CurGroup, usize)> {
        let req = self.state.pool.get(r).filter(|q| q.kind() == ReqKind::Send)?;
        let (pos, n) = (req.pos(), req.n());
        let low = self.kept.get(usize::from(r))?.counter_low();
        let mut g = CurGroup {
            active: false,
            n,
            entries: [CtsEntry::default(); MAX_RECVS],
            matched: fifo::full_mask(n),
            reqs: [0; MAX_RECVS],
            data: [0; MAX_RECVS],
            len: [0; MAX_RECVS],
            lkeys: [[0; MAX_DEVS]; MAX_RECVS],
        };
        let mut found = 0u8;
        for idx in 0..self.kept.len() as u16 {
            let Some(other) = self.state.pool.get(idx) else {
                continue;
            };
            let k = self.kept[usize::from(idx)];
            if other.kind() != ReqKind::Send || other.pos() != pos || k.counter_low() != low {
                continue;
            }
            let i = k.buf().min(n - 1);
            g.reqs[i] = idx;
            g.data[i] = k.data as usize;
            g.len[i] = k.len();
            let l = usize::from(idx) * self.nldevs;
            g.lkeys[i][..self.nldevs].copy_from_slice(&self.kept_lkeys[l..l + self.nldevs]);
            found |= 1 << i;
        }
        if found != fifo::full_mask(n) {
            return None;
        }
        for i in 0..n {
            g.entries[i] = CtsEntry::from_wire(&ring.load_entry(fifo::ring_pos((pos + i) as u64)));
        }
        let f = pos * self.nrdevs;
        g.entries[0].rkeys[..self.nrdevs].copy_from_slice(&self.first_rkeys[f..f + self.nrdevs]);
        Some((g, pos))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{Bench, PLAIN};
    use super::super::Isend;
    use super::*;

    fn resume(b: &mut Bench, taken: &[u64]) -> Result<Replayed> {
        let Bench { core, ring, posted, .. } = b;
        core.resume(ring, taken, &mut |p| {
            if let Post::Send { qp, chain } = p {
                posted.push((qp, chain.to_vec()));
            }
            Ok(())
        })
    }

    /// One send posted whose completion never came: the bench's state before each case.
    fn one_in_flight() -> (Bench, u16) {
        let mut b = Bench::new(PLAIN);
        b.cts(&[(1000, 7)]);
        let Isend::Started { idx, .. } = b.isend(600, 7).unwrap() else {
            panic!("not started")
        };
        b.core.begin_recovery();
        (b, idx)
    }

    /// Recovering: nothing is posted.
    #[test]
    fn a_recovering_sender_posts_nothing() {
        let (mut b, _) = one_in_flight();
        b.cts(&[(1000, 7)]);
        assert_eq!(b.isend(10, 7).unwrap(), Isend::Busy);
        assert_eq!(b.posted.len(), 1);
    }

    /// The receiver took nothing: the chain is posted again, the same WRs.
    #[test]
    fn a_chain_the_receiver_did_not_take_is_posted_again() {
        let (mut b, idx) = one_in_flight();
        let done = resume(&mut b, &[0]).unwrap();
        assert_eq!(
            done,
            Replayed {
                landed: 0,
                chains: 1,
                bytes: 600
            }
        );
        assert_eq!(b.posted[1].1, b.posted[0].1);
        assert!(!b.core.recovering());
        assert_eq!(b.core.test(idx).unwrap(), None);
    }

    /// The receiver took it though its completion never came back: done, nothing written again.
    #[test]
    fn a_chain_the_receiver_took_counts_as_done() {
        let (mut b, idx) = one_in_flight();
        let done = resume(&mut b, &[1]).unwrap();
        assert_eq!((done.landed, done.chains), (1, 0));
        assert_eq!(b.posted.len(), 1);
        assert_eq!(b.core.test(idx).unwrap(), Some(600));
    }

    /// A count no honest receiver gives (more than was posted, or not one per QP) fails the comm.
    #[test]
    fn a_count_past_what_was_posted_fails_the_comm() {
        let (mut b, _) = one_in_flight();
        assert!(resume(&mut b, &[2]).is_err());
        assert!(b.core.state.check().is_err());
        let (mut b, _) = one_in_flight();
        assert!(resume(&mut b, &[0, 0]).is_err());
    }
}
