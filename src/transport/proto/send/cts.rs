//! The CTS path: an isend takes the buffer with its tag in the oldest group; once every buffer
//! of the group has a send, the group's chains are planned (split over the chosen QPs, ending in
//! one signaled write with immediate per QP) and posted if they fit the QPs' credits.

use super::super::eager::{self, Imm};
use super::super::fifo;
use super::super::limits::{self, MAX_CHAIN, MAX_DEVS, MAX_RECVS};
use super::super::plan::{Op, Post, Remote, Sge, WorkRequest};
use super::super::request::{self, ReqKind, SendWrId};
use super::super::split::{self, WrPlan};
use super::super::time::Time;
use super::kept::Kept;
use super::{reported_size, CurGroup, FifoRing, Isend, SendBuf, SendCore};
use crate::error::{Error, Result};

impl SendCore {
    /// Start a send of `size` bytes at `data` (lkeys per member device) to the buffer with
    /// `tag` in the oldest posted group. The group is planned into `post` as soon as every one
    /// of its buffers has a send (and its chains fit the credits). With the eager path on, a
    /// small send whose group's CTS has not landed goes at once ([`super::super::eager`]).
    pub fn isend(
        &mut self,
        ring: &mut impl FifoRing,
        now: impl Fn() -> Time + Copy,
        send: SendBuf,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<Isend> {
        self.state.check()?;
        if self.peer_closed.is_some() {
            return self.send_after_close(send.tag, send.size);
        }
        if self.waiting() || self.recovering {
            return Ok(Isend::Busy);
        }
        self.advance(ring, now, post)?;
        if self.waiting() {
            return Ok(Isend::Busy);
        }
        if let Some(e) = self.eager.as_deref() {
            // Earlier sends go first: after open claims only another claim can follow; a
            // refused send of the same tag goes through the CTS path before this one.
            if !e.claims.is_empty() {
                return self.send_eager(send, post);
            }
            if e.deferred_tag(send.tag) {
                return Ok(Isend::NoBuffer);
            }
        }
        if !self.cur.active && !self.load_group(ring, now)? {
            return self.send_eager(send, post);
        }
        let n = self.cur.n;
        let Some(i) = fifo::match_tag(&self.cur.entries[..n], self.cur.matched, send.tag) else {
            return Ok(Isend::NoBuffer);
        };
        let Some(r) = self.state.pool.alloc(ReqKind::Send) else {
            return Ok(Isend::Busy);
        };
        let truncated_to = self.take_entry(i, r, send);
        self.post_waiting(ring, post)?;
        Ok(Isend::Started {
            idx: r,
            truncated_to,
            eager: false,
        })
    }

    /// Request `r` fills buffer `i` of the current group with `send`; the posted size when it
    /// is smaller than the send (reported once per comm).
    pub(super) fn take_entry(&mut self, i: usize, r: u16, send: SendBuf) -> Option<usize> {
        let n = self.cur.n;
        let posted = usize::try_from(self.cur.entries[i].posted_size()).unwrap_or(usize::MAX);
        let len = send.size.min(posted);
        let truncated_to = (send.size > posted && !self.truncate_reported).then_some(posted);
        self.truncate_reported |= truncated_to.is_some();
        self.cur.reqs[i] = r;
        self.cur.data[i] = send.data;
        self.cur.len[i] = len;
        self.cur.lkeys[i] = send.lkeys;
        self.cur.matched |= 1 << i;
        if let Some(t) = self.kept_tags.get_mut(usize::from(r)) {
            *t = send.tag;
        }
        if let Some(k) = self.kept.get_mut(usize::from(r)) {
            *k = Kept::new(send.data, len, i);
            // The counter the group will be posted with (the current group is posted next,
            // as `self.counter`): never one of a group in flight.
            k.set_counter(self.counter);
        }
        let l = usize::from(r) * self.nldevs;
        if let Some(dst) = self.kept_lkeys.get_mut(l..l + self.nldevs) {
            dst.copy_from_slice(&send.lkeys[..self.nldevs]);
        }
        let pos = fifo::ring_pos(self.head);
        if let Some(req) = self.state.pool.get_mut(r) {
            req.set_pos_n(pos, n);
            req.size = reported_size(len);
            // Not posted yet: one placeholder completion, replaced when the group is posted.
            req.pending = 1;
        }
        truncated_to
    }

    /// Progress without a new send: decide claims, send refused messages, post the complete
    /// current group if its chains fit.
    pub fn progress(
        &mut self,
        ring: &mut impl FifoRing,
        now: impl Fn() -> Time + Copy,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<()> {
        self.state.check()?;
        self.advance(ring, now, post)?;
        self.post_waiting(ring, post)
    }

    /// Plan the complete current group into `post` if every chain fits its QP's credits (else
    /// leave it waiting). A posting error fails the comm.
    pub fn post_waiting(
        &mut self,
        ring: &mut impl FifoRing,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<()> {
        if !self.waiting() || self.recovering || self.peer_closed.is_some() {
            return Ok(());
        }
        let id = self.counter;
        let n = self.cur.n;
        let nq = self.cfg.qps_per_req;
        let nqps = self.qps();
        let ar_split = n == 1 && self.cfg.ar_threshold.is_some_and(|t| self.cur.len[0] > t);
        let record = self.record_form(&self.cur.len[..n]);
        // On the stack: a comm keeps no plan between calls (memory per connection).
        let mut plan = [WrPlan::ZeroImm; MAX_CHAIN];
        let mut chain = [WorkRequest::EMPTY; MAX_CHAIN];
        let wr_bytes = self.cfg.wr_bytes;
        for j in 0..nq {
            let q = split::qp_for_chunk(id, nq, j, nqps);
            let Some(k) = split::plan_chain_as(&self.cur.len[..n], nq, j, ar_split, record, wr_bytes, &mut plan) else {
                return Err(self.state.fail(self.oversized_group()));
            };
            if usize::from(self.credits[q]) < k {
                return Ok(());
            }
        }
        let pos = fifo::ring_pos(self.head);
        if n > 1 || record {
            let mut sizes = [0u32; MAX_RECVS];
            for (s, &l) in sizes.iter_mut().zip(&self.cur.len[..n]) {
                *s = reported_size(l);
            }
            ring.store_sizes(pos, &sizes[..n]);
        }
        for j in 0..nq {
            let q = split::qp_for_chunk(id, nq, j, nqps);
            // Planned above, so it fits.
            let k = split::plan_chain_as(&self.cur.len[..n], nq, j, ar_split, record, wr_bytes, &mut plan).unwrap_or(0);
            self.build_chain(&self.cur, q, &plan[..k], pos, &mut chain);
            // Taken before posting: a partly posted chain still counts against the queue.
            self.credits[q] -= k as u16;
            self.chains[q].push(self.cur.reqs[0]);
            if let Err(e) = post(Post::Send {
                qp: q,
                chain: &chain[..k],
            }) {
                return Err(self.state.fail(e));
            }
        }
        for &r in &self.cur.reqs[..n] {
            if let Some(req) = self.state.pool.get_mut(r) {
                req.pending = request::pending_count(nq);
            }
        }
        self.counter += 1;
        self.head += n as u64;
        self.cur.active = false;
        Ok(())
    }

    /// Whether a group with buffers of `lens` bytes completes with its sizes record: a grouped
    /// one, or on a version-5 connection a single one too large for the immediate.
    pub(super) fn record_form(&self, lens: &[usize]) -> bool {
        self.cfg.named_imm && lens.len() == 1 && lens[0] > eager::IMM_SIZE_MAX
    }

    /// Why the complete current group cannot be posted: a buffer takes more WRs than one chain
    /// holds (the receiver posted more than this side's `maxP2pBytes`).
    pub(super) fn oversized_group(&self) -> Error {
        let largest = self.cur.len[..self.cur.n].iter().copied().max().unwrap_or(0);
        Error::internal(format!(
            "a send of {largest} bytes to {} needs more than {MAX_CHAIN} RDMA writes on one QP: this side carries at most {} bytes per message (maxP2pBytes: {} pieces of {} bytes, the devices' max_msg_sz); the receiver posted a larger buffer — check that both sides run the same ferroce and NICs with the same max_msg_sz",
            self.cfg.peer,
            split::max_buffer_bytes(self.cfg.wr_bytes),
            limits::PIECES_PER_BUFFER,
            split::piece_bytes(self.cfg.wr_bytes),
        ))
    }

    /// Turn the planned WRs of QP `q` for group `cur` into work requests in `chain`.
    pub(super) fn build_chain(
        &self,
        cur: &CurGroup,
        q: usize,
        plan: &[WrPlan],
        pos: usize,
        chain: &mut [WorkRequest; MAX_CHAIN],
    ) {
        let k = plan.len();
        let route = self.cfg.routes[q];
        let (ldev, rdev) = (route.dev.min(MAX_DEVS - 1), route.remote_dev.min(MAX_DEVS - 1));
        let n = cur.n;
        let wr_id = SendWrId::new(&cur.reqs[..n], k, q).0;
        let (completion_imm, record_imm) = if self.cfg.named_imm {
            let size = reported_size(cur.len[0]);
            (Imm::Single { pos, size }.to_u32(), Imm::Record { pos }.to_u32())
        } else {
            (reported_size(cur.len[0]), pos as u32)
        };
        for x in 0..k {
            chain[x] = match plan[x] {
                WrPlan::Data { sub, off, len, imm } => {
                    let i = usize::from(sub);
                    let e = &cur.entries[i];
                    WorkRequest {
                        wr_id,
                        op: if imm { Op::WriteImm(completion_imm) } else { Op::Write },
                        local: (len > 0).then(|| Sge {
                            addr: (cur.data[i] + off) as u64,
                            len: len as u32,
                            lkey: cur.lkeys[i][ldev],
                        }),
                        remote: Remote {
                            addr: e.addr.wrapping_add(off as u64),
                            rkey: e.rkeys[rdev],
                        },
                        signaled: imm,
                        inline: false,
                        prefix: None,
                    }
                }
                // AR: a zero-length write carries the completion behind the bulk data.
                WrPlan::ZeroImm => WorkRequest {
                    wr_id,
                    op: Op::WriteImm(completion_imm),
                    local: None,
                    remote: Remote {
                        addr: cur.entries[0].addr,
                        rkey: cur.entries[0].rkeys[rdev],
                    },
                    signaled: true,
                    inline: false,
                    prefix: None,
                },
                // Grouped: the n sizes go into the receiver's completion record of the group
                // (inside its CTS staging entry, fifo::SIZES_IN_ENTRY).
                WrPlan::SizesImm => WorkRequest {
                    wr_id,
                    op: Op::WriteImm(record_imm),
                    local: Some(Sge {
                        addr: self.cfg.fifo.addr + (pos * fifo::ENTRY_BYTES + fifo::SIZES_IN_ENTRY) as u64,
                        len: (n * 4) as u32,
                        lkey: self.cfg.fifo.lkeys[ldev],
                    }),
                    remote: Remote {
                        addr: self.cfg.peer_records.addr + (pos * fifo::ENTRY_BYTES) as u64,
                        rkey: self.cfg.peer_records.rkeys[rdev],
                    },
                    signaled: true,
                    inline: false,
                    prefix: None,
                },
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::plan::Sge;
    use super::super::tests::{
        Bench, Opts, FIFO_ADDR, FIFO_LKEY, PLAIN, RECORDS_ADDR, RECORDS_RKEY, RECV_ADDR, RECV_RKEY, SEND_ADDR,
        SEND_LKEY,
    };
    use super::super::SQ_DEPTH;
    use super::*;

    /// A single buffer's CTS, then its isend: one chain on QP 0, one signaled write with
    /// immediate of the whole message into the posted buffer, the size as the immediate.
    #[test]
    fn a_matched_single_send_is_one_write_with_its_size_as_immediate() {
        let mut b = Bench::new(PLAIN);
        b.cts(&[(1000, 7)]);
        let got = b.isend(600, 7).unwrap();
        assert!(
            matches!(
                got,
                Isend::Started {
                    truncated_to: None,
                    eager: false,
                    ..
                }
            ),
            "{got:?}"
        );
        assert_eq!(b.posted.len(), 1);
        let (qp, chain) = &b.posted[0];
        assert_eq!((*qp, chain.len()), (0, 1));
        let w = chain[0];
        assert_eq!(w.op, Op::WriteImm(600));
        assert_eq!(
            w.local,
            Some(Sge {
                addr: SEND_ADDR as u64,
                len: 600,
                lkey: SEND_LKEY
            })
        );
        assert_eq!((w.remote.addr, w.remote.rkey, w.signaled), (RECV_ADDR, RECV_RKEY, true));
        assert_eq!((b.core.credits[0] as usize, b.core.head), (SQ_DEPTH - 1, 1));
    }

    /// A send whose tag no buffer of the oldest group has waits; nothing is posted.
    #[test]
    fn a_tag_the_group_lacks_has_no_buffer() {
        let mut b = Bench::new(PLAIN);
        b.cts(&[(1000, 7)]);
        assert_eq!(b.isend(10, 8).unwrap(), Isend::NoBuffer);
        assert!(b.posted.is_empty());
    }

    /// A group of two is posted once both buffers have their send: the data writes, then the
    /// sizes staged in the group's first FIFO entry written into the receiver's record with
    /// the ring position as the immediate.
    #[test]
    fn a_group_is_posted_when_its_last_buffer_is_matched() {
        let mut b = Bench::new(PLAIN);
        b.cts(&[(1000, 1), (1000, 2)]);
        b.isend(300, 2).unwrap();
        assert!(b.posted.is_empty() && b.core.group_open());
        b.isend(200, 1).unwrap();
        assert_eq!(b.ring.staged, vec![(0, vec![200, 300])]);
        let chain = &b.posted[0].1;
        assert_eq!(chain.len(), 3);
        assert_eq!((chain[0].op, chain[0].remote.addr), (Op::Write, RECV_ADDR));
        assert_eq!((chain[1].op, chain[1].remote.addr), (Op::Write, RECV_ADDR + 0x10_0000));
        let sizes = chain[2];
        assert_eq!(sizes.op, Op::WriteImm(0));
        assert_eq!((sizes.remote.addr, sizes.remote.rkey), (RECORDS_ADDR, RECORDS_RKEY));
        let staged = FIFO_ADDR + fifo::SIZES_IN_ENTRY as u64;
        assert_eq!(
            sizes.local,
            Some(Sge {
                addr: staged,
                len: 8,
                lkey: FIFO_LKEY
            })
        );
    }

    /// A send larger than the posted buffer carries the posted size; the truncation is
    /// reported once per comm.
    #[test]
    fn a_truncated_send_carries_the_posted_size_and_is_reported_once() {
        let mut b = Bench::new(PLAIN);
        b.cts(&[(1000, 7)]);
        b.cts(&[(500, 7)]);
        let first = b.isend(2000, 7).unwrap();
        assert!(
            matches!(
                first,
                Isend::Started {
                    truncated_to: Some(1000),
                    ..
                }
            ),
            "{first:?}"
        );
        let second = b.isend(2000, 7).unwrap();
        assert!(
            matches!(second, Isend::Started { truncated_to: None, .. }),
            "{second:?}"
        );
        assert_eq!(b.posted[0].1[0].op, Op::WriteImm(1000));
        assert_eq!(b.posted[1].1[0].op, Op::WriteImm(500));
    }

    /// Groups of 8 take 9 WRs each: 7 fit the 64 credits, the 8th waits complete (isend says
    /// busy meanwhile) and goes out once a completion gave credits back.
    #[test]
    fn a_group_whose_chain_does_not_fit_waits_for_credits() {
        let mut b = Bench::new(PLAIN);
        for _ in 0..8 {
            b.cts(&[(64, 1); 8]);
            for _ in 0..8 {
                b.isend(64, 1).unwrap();
            }
        }
        assert_eq!(b.posted.len(), 7);
        assert_eq!(b.core.credits[0], 1);
        assert!(b.core.waiting());
        b.cts(&[(64, 1)]);
        assert_eq!(b.isend(64, 1).unwrap(), Isend::Busy);
        b.complete_from(0);
        b.progress().unwrap();
        assert_eq!(b.posted.len(), 8);
        assert!(!b.core.waiting());
    }

    /// A version-5 connection names the receive in the immediate: the ring position and the
    /// size of a single message.
    #[test]
    fn a_named_immediate_carries_the_position_and_size() {
        let mut b = Bench::new(Opts {
            named_imm: true,
            ..PLAIN
        });
        b.cts(&[(1000, 7)]);
        b.cts(&[(1000, 7)]);
        b.isend(10, 7).unwrap();
        b.isend(20, 7).unwrap();
        let imm = Imm::Single { pos: 1, size: 20 }.to_u32();
        assert_eq!(b.posted[1].1[0].op, Op::WriteImm(imm));
    }
}
