//! Carrying a connection over a recovery ([`super::super::recovery`]): nothing is posted
//! between [`RecvCore::begin_recovery`] and [`RecvCore::resume`]; the new QPs get their
//! receives again, and the CTS entries the sender may not have read are written again.

use super::super::eager::EAGER_QP;
use super::super::fifo;
use super::super::limits::MAX_DEVS;
use super::super::plan::{Post, QpRoute};
use super::rq::RQ_BATCH;
use super::wr_id::{wr_id, KIND_RECV, KIND_SHIFT};
use super::{RecvCore, EAGER_SPARE};
use crate::error::{Error, Result};

impl RecvCore {
    /// Stop posting: the connection's QPs failed and are being replaced ([`super::super::recovery`]).
    /// irecv says "retry later" until [`RecvCore::resume`]. Completions polled from the old
    /// QPs meanwhile are still taken (each is a message that landed); failed ones are dropped.
    pub fn begin_recovery(&mut self) {
        self.recovering = true;
        // The resume writes every entry the sender has not read again, these among them.
        self.pending_cts = None;
    }

    /// The recovery placed the QPs on other members (failover, failback): the CTS writes,
    /// also the rewrite, take the new routes.
    pub fn reroute(&mut self, routes: &[QpRoute]) -> Result<()> {
        super::super::plan::reroute(&mut self.cfg.routes, routes, MAX_DEVS, MAX_DEVS)
    }

    pub fn recovering(&self) -> bool {
        self.recovering
    }

    /// The receiver's part of a recovery report: per QP, the write-with-immediate completions
    /// taken on it since the connection was made. Final once every completion of the old QPs
    /// was taken: the driver moves them to ERR and polls until each posted receive flushed,
    /// so a message the sender saw acknowledged is one this side counts.
    pub fn taken(&self) -> Vec<u64> {
        self.rqs.iter().map(|q| q.taken).collect()
    }

    /// Whether `wr_id` is one of our receives (a QP moved to ERR flushes each).
    pub fn is_receive(wr_id: u64) -> bool {
        wr_id >> KIND_SHIFT == KIND_RECV
    }

    /// Receives posted on each QP: one per request it owes a completion, and the ones to
    /// spare (what a QP moved to ERR flushes).
    pub fn posted_receives(&self, qp: usize) -> usize {
        self.rqs
            .get(qp)
            .map_or(0, |q| usize::from(q.len) + usize::from(q.spare))
    }

    /// Post the receives of the connection's new QPs (empty receive queues): one per request
    /// each QP still owes a completion, and a batch to spare.
    pub fn repost_receives(&mut self, post: &mut impl FnMut(Post<'_>) -> Result<()>) -> Result<()> {
        for qp in 0..self.rqs.len() {
            // In batches of at most RQ_BATCH, as every receive post; the eager QP keeps as
            // many to spare as the credit granted may need.
            let spare = if qp == EAGER_QP && self.eager.is_some() {
                EAGER_SPARE.next_multiple_of(RQ_BATCH)
            } else {
                RQ_BATCH
            };
            let mut left = usize::from(self.rqs[qp].len) + spare;
            while left > 0 {
                let count = left.min(RQ_BATCH);
                if let Err(e) = post(Post::Recv {
                    qp,
                    wr_id: wr_id(KIND_RECV, qp as u16),
                    count,
                }) {
                    return Err(self.state.fail(e));
                }
                left -= count;
            }
            self.rqs[qp].spare = spare as u8;
        }
        Ok(())
    }

    /// Carry on over the new QPs once the sender said where its next group starts in the FIFO
    /// ring (`sender_head`): the CTS entries from there on may not have reached it, so they
    /// are written again (the same bytes; at most two signaled writes, on device 0's CTS QP).
    /// The sender must not take an entry from there before [`RecvCore::rewrites_landed`]
    /// (a rewrite landing late would cover the sizes a grouped send stages in its entry), so
    /// the recovery sends its Ready only then. Every CTS write of the old QPs is gone. A head
    /// outside the entries this side posted fails the comm. Returns the entries written again.
    pub fn resume(&mut self, sender_head: u64, post: &mut impl FnMut(Post<'_>) -> Result<()>) -> Result<usize> {
        self.state.check()?;
        let (oldest, next) = (self.ring.oldest(), self.ring.next_start());
        if sender_head < oldest || sender_head > next {
            return Err(self.state.fail(Error::remote(format!(
                "the sender {} says its next CTS entry is {sender_head}, but this side's entries in flight are {oldest}..{next}: a corrupt or lying peer",
                self.cfg.peer
            ))));
        }
        self.cts_retired = self.cts_posted;
        self.ring.prove(sender_head);
        let n = (next - sender_head) as usize;
        let d = 0;
        for (pos, len) in fifo::pieces(sender_head, n) {
            if len == 0 {
                continue;
            }
            // Signaled: its completion says it landed.
            if let Err(e) = self.post_cts(d, pos, len, true, post) {
                return Err(self.state.fail(e));
            }
        }
        self.rewritten_until = self.cts_posted[d];
        self.recovering = false;
        Ok(n)
    }

    /// Whether the CTS writes of the last [`RecvCore::resume`] have landed at the sender.
    pub fn rewrites_landed(&self) -> bool {
        self.cts_retired[0] >= self.rewritten_until
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{Bench, Posted, PLAIN};
    use super::*;

    fn resume(b: &mut Bench, head: u64) -> Result<usize> {
        let Bench { core, posted, .. } = b;
        core.resume(head, &mut |p| {
            if let Post::Send { qp, chain } = p {
                posted.push(Posted::Send {
                    qp,
                    chain: chain.to_vec(),
                });
            }
            Ok(())
        })
    }

    /// The recovery report counts the completions taken on each QP.
    #[test]
    fn taken_counts_completions_per_qp() {
        let mut b = Bench::new(PLAIN);
        b.started(&[(100, 1)]);
        b.started(&[(100, 1)]);
        b.complete(0, Some(1));
        assert_eq!(b.core.taken(), vec![1]);
        assert_eq!(b.core.posted_receives(0), RQ_BATCH - 1, "one of the batch was taken");
    }

    /// The entries from the sender's head on are written again, signaled, and the sender may
    /// take them only once that write completed.
    #[test]
    fn entries_the_sender_has_not_read_are_written_again() {
        let mut b = Bench::new(PLAIN);
        for _ in 0..3 {
            b.started(&[(100, 1)]);
        }
        b.flush_cts();
        b.core.begin_recovery();
        assert_eq!(b.irecv(&[(100, 1)]).unwrap(), super::super::Irecv::Busy);
        let before = b.cts_writes().len();
        assert_eq!(resume(&mut b, 1).unwrap(), 2);
        assert_eq!(&b.cts_writes()[before..], &[(1, 2, true)]);
        assert!(!b.core.rewrites_landed() && !b.core.recovering());
        let Some(Posted::Send { chain, .. }) = b.posted.last() else {
            panic!("no rewrite");
        };
        b.core.handle_completion(chain[0].wr_id, None);
        assert!(b.core.rewrites_landed());
    }

    /// A head outside the entries in flight fails the comm.
    #[test]
    fn a_head_outside_the_entries_in_flight_fails_the_comm() {
        let mut b = Bench::new(PLAIN);
        b.started(&[(100, 1)]);
        b.core.begin_recovery();
        assert!(resume(&mut b, 2).is_err());
        assert!(b.core.state.check().is_err());
    }

    /// The new QPs get one receive per request still owed, and a batch to spare.
    #[test]
    fn the_new_qps_get_their_owed_receives_and_a_batch() {
        let mut b = Bench::new(PLAIN);
        b.started(&[(100, 1)]);
        b.started(&[(100, 1)]);
        b.posted.clear();
        let Bench { core, posted, .. } = &mut b;
        core.repost_receives(&mut |p| {
            if let Post::Recv { qp, wr_id, count } = p {
                posted.push(Posted::Recv { qp, wr_id, count });
            }
            Ok(())
        })
        .unwrap();
        let counts: Vec<usize> = b
            .posted
            .iter()
            .map(|p| match p {
                Posted::Recv { count, .. } => *count,
                _ => 0,
            })
            .collect();
        assert_eq!(counts, vec![RQ_BATCH, 2]);
        assert_eq!(b.core.posted_receives(0), 2 + RQ_BATCH);
    }
}
