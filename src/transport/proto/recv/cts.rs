//! The CTS path of the receiver: an irecv makes sure every QP the message will use has a
//! receive posted for it, stages the group's CTS entries, and writes them into the sender's
//! FIFO ring (receives posted back to back in one write, within [`CTS_DEPTH`] credits).

use super::super::eager::{EAGER_QP, SLOTS};
use super::super::fifo::{self, CtsEntry};
use super::super::limits::{MAX_DEVS, MAX_RECVS};
use super::super::plan::{Op, Post, Remote, Sge, WorkRequest};
use super::super::request::{self, ReqKind};
use super::super::split;
use super::rq::RQ_BATCH;
use super::wr_id::{cts_wr_id, wr_id, KIND_RECV};
use super::{
    Claimable, Irecv, PendingCts, RecvBuf, RecvCore, StagingRing, CLAIM_LIVE, CLAIM_OK, CTS_DEPTH, CTS_SIGNAL_EVERY,
    EAGER_SPARE,
};
use crate::error::{Error, Result};

impl RecvCore {
    /// Whether device `d`'s CTS QP takes `writes` more WRs within [`CTS_DEPTH`].
    pub(super) fn cts_room(&self, d: usize, writes: u64) -> bool {
        self.cts_posted[d] + writes - self.cts_retired[d] <= CTS_DEPTH as u64
    }

    /// Post a grouped receive of `bufs` (1..=8 buffers of ≤ `max_buffer_bytes` each).
    pub fn irecv(
        &mut self,
        ring: &mut impl StagingRing,
        bufs: &[RecvBuf],
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<Irecv> {
        self.state.check()?;
        let n = bufs.len();
        if n == 0 || n > MAX_RECVS {
            return Err(Error::internal(format!(
                "irecv: a group of {n} buffers (1..={MAX_RECVS})"
            )));
        }
        if let Some(b) = bufs.iter().find(|b| b.size > self.cfg.max_buffer_bytes) {
            return Err(Error::internal(format!(
                "irecv: a buffer of {} bytes is larger than the {} bytes this device takes in one message (the maxP2pBytes it reports)",
                b.size, self.cfg.max_buffer_bytes
            )));
        }
        // Everything that can say "retry later" is checked before anything changes. NCCL
        // never has more than 32 receives in flight; ring entries come back in posting order
        // as receives complete; CTS credits as signaled CTS writes complete.
        if self.recvs_in_flight >= request::RECVS_IN_FLIGHT || !self.ring.fits(n) || self.recovering {
            return Ok(Irecv::Busy);
        }
        let id = self.counter;
        let d = (id % self.cfg.cts_qps.max(1) as u64) as usize;
        let start = self.ring.next_start();
        // This group's writes, and the staged ones it may have to flush first.
        let staged = self
            .pending_cts
            .map_or(0, |p| fifo::pieces(p.start, p.n).iter().filter(|x| x.1 > 0).count());
        let writes = (fifo::pieces(start, n).iter().filter(|p| p.1 > 0).count() + staged) as u64;
        if !self.cts_room(d, writes) {
            return Ok(Irecv::NoCtsCredit);
        }
        let Some(r) = self.state.pool.alloc(ReqKind::Recv) else {
            return Ok(Irecv::Busy);
        };
        let Some(start) = self.ring.alloc(n) else {
            self.state.pool.free(r);
            return Ok(Irecv::Busy);
        };
        self.recvs_in_flight += 1;
        let nq = self.cfg.qps_per_req;
        if let Some(req) = self.state.pool.get_mut(r) {
            req.set_pos_n(fifo::ring_pos(start), n);
            req.pending = request::pending_count(nq);
        }
        if let Err(e) = self.post_group(ring, r, id, start, d, bufs, post) {
            return Err(self.state.fail(e));
        }
        self.counter += 1;
        // An eager message that arrived before this receive may claim it.
        self.decide_eager(ring, post)?;
        Ok(Irecv::Started(r))
    }

    /// The receives, the staged entries and the CTS writes of group `id` (request `r`, ring
    /// entries from `start`, CTS QP of device `d`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn post_group(
        &mut self,
        ring: &mut impl StagingRing,
        r: u16,
        id: u64,
        start: u64,
        d: usize,
        bufs: &[RecvBuf],
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<()> {
        // Receives for every eager message the credit this CTS grants may bring, before it.
        if self.eager.is_some() {
            self.keep_spare(EAGER_QP, EAGER_SPARE, post)?;
        }
        self.post_receives(r, id, post)?;
        self.stage_entries(ring, r, id, start, bufs);
        self.batch_cts(d, start, bufs.len(), post)
    }

    /// A posted receive for request `r` (group `id`) on every QP the sender will complete it
    /// on, taken from the ones to spare (a batch posted when none is).
    fn post_receives(&mut self, r: u16, id: u64, post: &mut impl FnMut(Post<'_>) -> Result<()>) -> Result<()> {
        for qp in self.qps_of(id) {
            let Some(rq) = self.rqs.get_mut(qp) else {
                return Err(Error::internal(format!(
                    "irecv: QP {qp} of a connection of {}",
                    self.rqs.len()
                )));
            };
            if rq.spare == 0 {
                post(Post::Recv {
                    qp,
                    wr_id: wr_id(KIND_RECV, qp as u16),
                    count: RQ_BATCH,
                })?;
                rq.spare = RQ_BATCH as u8;
            }
            if !rq.push(r) {
                return Err(Error::internal(format!(
                    "irecv: QP {qp} already owes {} receives",
                    request::RECVS_IN_FLIGHT
                )));
            }
            rq.spare -= 1;
        }
        Ok(())
    }

    /// Store group `id`'s CTS entries (request `r`) in the staging ring from `start`, with the
    /// eager credit and what a claim on the group needs when the eager path is on.
    fn stage_entries(&mut self, ring: &mut impl StagingRing, r: u16, id: u64, start: u64, bufs: &[RecvBuf]) {
        let n = bufs.len();
        self.req_at[fifo::ring_pos(start)] = r as u8;
        let eager_ok = n == 1 && bufs[0].host;
        let credit = self.eager.as_mut().map(|e| {
            e.granted = e.decided + SLOTS as u64;
            let pos = fifo::ring_pos(start);
            e.groups[pos] = Claimable {
                addr: bufs[0].data as u64,
                counter: id as u32,
                tag: bufs[0].tag,
            };
            e.marks[pos] = CLAIM_LIVE | if eager_ok { CLAIM_OK } else { 0 };
            e.granted
        });
        for (i, b) in bufs.iter().enumerate() {
            let mut e = CtsEntry::new(b.data as u64, b.size as u64, b.rkeys, n, b.tag, id);
            if let Some(credit) = credit {
                e = e.with_eager(credit, eager_ok);
            }
            // The ring gave these entries to this group: the group that had them before
            // completed and was reported (its CTS write was read by the NIC, its completion
            // record by us).
            let pos = fifo::ring_pos(start + i as u64);
            ring.store_entry(pos, &e.to_wire());
            self.posted[pos] = b.size as u64;
        }
    }

    /// The CTS write of the `n` entries from `start` waits for the next flush
    /// ([`RecvCore::flush_cts`]): receives posted back to back whose entries follow each other
    /// in the ring, on the same CTS QP and within one WR, go in one write. A receive with none
    /// other in flight goes at once: nothing to batch it with, and a caller that posts one
    /// receive and then waits on something else (its send to the same peer) would otherwise
    /// hold it back.
    fn batch_cts(
        &mut self,
        d: usize,
        start: u64,
        n: usize,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<()> {
        let joined = self.pending_cts.as_mut().is_some_and(|p| {
            let fits = p.d == d
                && p.start + p.n as u64 == start
                && fifo::ring_pos(p.start) + p.n + n <= fifo::RING
                && (p.n + n) * fifo::ENTRY_BYTES <= self.cfg.wr_bytes;
            if fits {
                p.n += n;
            }
            fits
        });
        if !joined {
            self.flush_cts(post)?;
            self.pending_cts = Some(PendingCts { d, start, n });
        }
        if self.recvs_in_flight <= 1 {
            self.flush_cts(post)?;
        }
        Ok(())
    }

    /// Whether CTS entries wait for [`RecvCore::flush_cts`].
    pub fn cts_staged(&self) -> bool {
        self.pending_cts.is_some()
    }

    /// Write the CTS entries staged since the last flush into the sender's FIFO: one RDMA
    /// write for receives posted back to back on one CTS QP (two when they straddle the ring's
    /// end). The I/O layer flushes in every call that looks at the comm after posting (test, a
    /// refused irecv), so a CTS waits at most until the caller next looks at it, which NCCL's
    /// proxy does in the same progress step; a comm nobody calls is flushed by the idle round
    /// of a comm that waits (`watch`, within about 100 ms).
    pub fn flush_cts(&mut self, post: &mut impl FnMut(Post<'_>) -> Result<()>) -> Result<()> {
        let Some(p) = self.pending_cts.take() else {
            return Ok(());
        };
        for (pos, len) in fifo::pieces(p.start, p.n) {
            if len == 0 {
                continue;
            }
            // Regularly reap the send queue (unsignaled WRs stay outstanding until then).
            let signaled = self.cts_posted[p.d] % CTS_SIGNAL_EVERY == CTS_SIGNAL_EVERY - 1;
            if let Err(e) = self.post_cts(p.d, pos, len, signaled, post) {
                return Err(self.state.fail(e));
            }
        }
        Ok(())
    }

    /// Post receives on QP `qp` in batches until it has at least `want` to spare.
    pub(super) fn keep_spare(
        &mut self,
        qp: usize,
        want: usize,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<()> {
        let Some(rq) = self.rqs.get_mut(qp) else {
            return Err(Error::internal(format!(
                "a receive on QP {qp} of a connection of {}",
                self.rqs.len()
            )));
        };
        while usize::from(rq.spare) < want {
            post(Post::Recv {
                qp,
                wr_id: wr_id(KIND_RECV, qp as u16),
                count: RQ_BATCH,
            })?;
            rq.spare += RQ_BATCH as u8;
        }
        Ok(())
    }

    /// Post the CTS write of the `len` staged entries from ring position `pos` into the same
    /// entries of the sender's FIFO, on device `d`'s CTS QP.
    pub(super) fn post_cts(
        &mut self,
        d: usize,
        pos: usize,
        len: usize,
        signaled: bool,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<()> {
        let rdev = self.cfg.routes.get(d).map_or(0, |r| r.remote_dev).min(MAX_DEVS - 1);
        let bytes = (len * fifo::ENTRY_BYTES) as u32;
        let wr = WorkRequest {
            wr_id: cts_wr_id(d, self.cts_posted[d]),
            op: Op::Write,
            // A close marker writes nothing (`post_close_markers`).
            local: (len > 0).then(|| Sge {
                addr: self.cfg.staging.addr + (pos * fifo::ENTRY_BYTES) as u64,
                len: bytes,
                lkey: self.cfg.staging.lkeys[d],
            }),
            remote: Remote {
                addr: self.cfg.peer_fifo.addr + (pos * fifo::ENTRY_BYTES) as u64,
                rkey: self.cfg.peer_fifo.rkeys[rdev],
            },
            signaled,
            inline: len > 0 && bytes <= self.cfg.cts_inline_max[d],
            prefix: None,
        };
        // Counted before posting: a WR the provider may hold counts against the queue.
        self.cts_posted[d] += 1;
        post(Post::Send {
            qp: d,
            chain: std::slice::from_ref(&wr),
        })
    }

    /// The QPs group `id`'s message completes on (one per QP it is spread over).
    pub(super) fn qps_of(&self, id: u64) -> impl Iterator<Item = usize> {
        let (nq, nqps) = (self.cfg.qps_per_req, self.cfg.routes.len());
        (0..nq).map(move |j| split::qp_for_chunk(id, nq, j, nqps))
    }

    /// The QPs the receive posted last completes on (for the profiler's per-QP events), with
    /// the `wr_id` of their receives.
    pub fn last_receive_qps(&self) -> impl Iterator<Item = (usize, u64)> {
        self.qps_of(self.counter.wrapping_sub(1))
            .map(|qp| (qp, wr_id(KIND_RECV, qp as u16)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{
        Bench, Posted, FIFO_ADDR, FIFO_RKEY, PLAIN, RECV_ADDR, RECV_RKEY, STAGING_ADDR, STAGING_LKEY,
    };
    use super::super::wr_id::cts_wr_id;
    use super::*;

    /// The first receive: a batch of receives on its QP, its entry staged (sealed, wire order),
    /// and at once (nothing else in flight) one unsignaled write of that entry into the same
    /// entry of the sender's FIFO.
    #[test]
    fn a_lone_receive_posts_receives_and_writes_its_cts_at_once() {
        let mut b = Bench::new(PLAIN);
        b.started(&[(1000, 7)]);
        assert_eq!(
            b.posted[0],
            Posted::Recv {
                qp: 0,
                wr_id: wr_id(KIND_RECV, 0),
                count: RQ_BATCH
            }
        );
        let want = CtsEntry::new(RECV_ADDR as u64, 1000, [RECV_RKEY; MAX_DEVS], 1, 7, 0).to_wire();
        assert_eq!(b.ring.entries[0], want);
        let Posted::Send { qp: 0, chain } = &b.posted[1] else {
            panic!("no CTS write: {:?}", b.posted);
        };
        let w = chain[0];
        assert_eq!(w.op, Op::Write);
        assert_eq!(
            w.local,
            Some(Sge {
                addr: STAGING_ADDR,
                len: 64,
                lkey: STAGING_LKEY
            })
        );
        assert_eq!(
            (w.remote.addr, w.remote.rkey, w.signaled),
            (FIFO_ADDR, FIFO_RKEY, false)
        );
        assert_eq!(b.core.spare_receives(), RQ_BATCH - 1);
    }

    /// Receives posted back to back while others are in flight wait for the flush, and go in
    /// one write when their entries follow each other.
    #[test]
    fn receives_posted_back_to_back_share_one_cts_write() {
        let mut b = Bench::new(PLAIN);
        b.started(&[(100, 1)]);
        b.started(&[(100, 2), (100, 3)]);
        b.started(&[(100, 4)]);
        assert!(b.core.cts_staged());
        b.flush_cts();
        assert_eq!(b.cts_writes(), vec![(0, 1, false), (1, 3, false)]);
        assert!(!b.core.cts_staged());
    }

    /// Every CTS_SIGNAL_EVERY-th write is signaled; CTS_DEPTH unretired writes refuse the next
    /// irecv until the completion of a signaled one retires it and all before it.
    #[test]
    fn cts_credits_run_out_and_come_back_with_a_signaled_completion() {
        let mut b = Bench::new(PLAIN);
        let mut first = None;
        for i in 0..CTS_DEPTH {
            let idx = b.started(&[(100, i as i32)]);
            first.get_or_insert(idx);
            b.flush_cts();
        }
        let writes = b.cts_writes();
        assert_eq!(writes.len(), CTS_DEPTH);
        assert!(writes
            .iter()
            .enumerate()
            .all(|(k, w)| w.2 == (k as u64 % CTS_SIGNAL_EVERY == CTS_SIGNAL_EVERY - 1)));
        // Make room for one more receive, so that only the CTS credit is missing.
        b.complete(0, Some(100));
        assert!(b.core.test(&b.ring, first.unwrap()).unwrap().is_some());
        assert_eq!(b.irecv(&[(100, 99)]).unwrap(), Irecv::NoCtsCredit);
        b.core.handle_completion(cts_wr_id(0, CTS_SIGNAL_EVERY - 1), None);
        assert!(matches!(b.irecv(&[(100, 99)]).unwrap(), Irecv::Started(_)));
    }

    #[test]
    fn a_group_of_no_or_too_many_or_too_large_buffers_is_an_error() {
        let mut b = Bench::new(PLAIN);
        assert!(b.irecv(&[]).is_err());
        assert!(b.irecv(&[(1, 1); MAX_RECVS + 1]).is_err());
        assert!(b.irecv(&[(2 << 20, 1)]).is_err());
        assert!(b.posted.is_empty());
    }
}
