//! The sender's data path (spec §8.8): read the receiver's CTS entries from our FIFO ring,
//! match isends to the buffers of the oldest group by tag, and when the group is complete post
//! RDMA WRITEs (split in 128-byte multiples over the chosen QPs) ending in one signaled
//! RDMA WRITE WITH IMMEDIATE per QP.
//!
//! Every data QP has [`SQ_DEPTH`] send-queue credits: a chain of k WRs takes k, and the polled
//! completion of its signaled last WR (which retires the whole chain, RC completes in order)
//! gives them back. A complete group whose chain does not fit waits (its requests are in flight,
//! not done) and is posted by a later `test` or `isend` once completions gave credits back.
//!
//! Nothing on this path allocates, locks or makes a syscall except `ibv_post_send` and the
//! rate-limited liveness probe when idle.

use super::conn::RegBuf;
use super::core::Core;
use super::fifo::{self, CtsEntry, GroupState, MAX_RECVS};
use super::request::{self, ReqKind, Request, RequestPool, SendWrId};
use super::split::{self, WrPlan, MAX_CHAIN};
use super::MemHandle;
use crate::error::{Error, Result};
use crate::ibv::cq::Completed;
use crate::ibv::sys;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

/// A grouped send stages its n sizes (the source of the completion-record write) in the first
/// FIFO entry of the group ([`fifo::SIZES_IN_ENTRY`]). The entry is dead for us once
/// [`SendDp::load_group`] copied the group: we read its stamp again only for a later posting
/// counter (the stamp is untouched, so it never matches). The receiver writes it again only
/// after this group's receive completed, so after every write reading these sizes executed at
/// the receiver (a retransmitted duplicate is not executed again, IBTA C9-105). So the FIFO
/// needs no separate sizes array.
/// Bytes of the sender's registered block: the CTS FIFO ring, 4 KiB (one page).
pub const SEND_BLOCK_BYTES: usize = fifo::RING_BYTES;

/// Send-queue credits of a data QP, its `max_send_wr`, and its CQ entries. Bound: WRs posted on
/// the QP and not yet retired by a polled completion ≤ SQ_DEPTH (the credits), so the send
/// queue cannot overflow, and neither can the CQ: a QP puts at most one entry per chain there
/// (its signaled WR), or one per WR when it fails and flushes them all. 64: 64 single messages
/// or 7 groups of 8 (9 WRs each) in flight per QP; a chain is ≤ 9 WRs, so an idle QP always
/// takes one.
pub const SQ_DEPTH: usize = 64;
const _: () = assert!(SQ_DEPTH >= MAX_CHAIN && SQ_DEPTH <= u16::MAX as usize);

/// The oldest group once all its entries have landed. `matched` full and `active` = complete
/// and waiting for send-queue credits.
struct CurGroup {
    active: bool,
    n: usize,
    entries: [CtsEntry; MAX_RECVS],
    matched: u8,
    reqs: [u16; MAX_RECVS],
    data: [usize; MAX_RECVS],
    len: [usize; MAX_RECVS],
    lkeys: [[u32; fifo::MAX_DEVS]; MAX_RECVS],
}

pub struct SendDp {
    /// First: QPs are destroyed before the FIFO memory they write into is freed.
    pub core: Core,
    /// One registered block: the CTS FIFO ring the receiver writes into (grouped sends stage
    /// their sizes in their group's consumed first entry, [`fifo::SIZES_IN_ENTRY`]).
    pub bufs: RegBuf,
    /// Groups consumed (posted) so far: the posting counter of the next group.
    counter: u64,
    /// Absolute FIFO entry where the next group starts.
    head: u64,
    /// Send-queue credits per QP of the connection.
    credits: Box<[u16]>,
    cur: CurGroup,
    ar: bool,
    ar_threshold: usize,
    truncate_warned: bool,
    /// When the current group's stamp was first seen without consistent entries.
    landing_since: Option<Instant>,
    plan: [WrPlan; MAX_CHAIN],
    wrs: [sys::ibv_send_wr; MAX_CHAIN],
    sges: [sys::ibv_sge; MAX_CHAIN],
}

// SAFETY: the raw pointers (requests' owner, WR chains) all point into this boxed object;
// it is used by one thread at a time (NCCL's contract), never shared.
unsafe impl Send for SendDp {}

impl SendDp {
    pub fn new(core: Core, bufs: RegBuf, ar: bool, ar_threshold: usize) -> Box<SendDp> {
        let credits = vec![SQ_DEPTH as u16; core.conn.qps.len()].into_boxed_slice();
        let mut dp = Box::new(SendDp {
            core,
            bufs,
            counter: 0,
            head: 0,
            credits,
            cur: CurGroup {
                active: false,
                n: 0,
                entries: [CtsEntry::default(); MAX_RECVS],
                matched: 0,
                reqs: [0; MAX_RECVS],
                data: [0; MAX_RECVS],
                len: [0; MAX_RECVS],
                lkeys: [[0; fifo::MAX_DEVS]; MAX_RECVS],
            },
            ar,
            ar_threshold,
            truncate_warned: false,
            landing_since: None,
            plan: [WrPlan::ZeroImm; MAX_CHAIN],
            // SAFETY: ibv_send_wr / ibv_sge are plain data; zero is a valid (empty) value.
            wrs: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            sges: unsafe { std::mem::zeroed() },
        });
        let owner = &mut *dp as *mut SendDp as *mut ();
        dp.core.pool.set_owner(owner);
        dp
    }

    /// Read the next group; true when all its entries are there and sealed.
    fn load_group(&mut self) -> Result<bool> {
        let base = self.bufs.addr() as *const CtsEntry;
        let mut es = [CtsEntry::default(); MAX_RECVS];
        let st = fifo::read_group(
            self.head,
            self.counter,
            |pos| {
                // SAFETY: pos < RING: inside the FIFO, which lives as long as self. The NIC
                // writes it concurrently: the stamp is loaded alone (one aligned 8-byte
                // volatile load), and the entries only after it matched (and this fence).
                let stamp = unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*base.add(pos)).stamp)) };
                fence(Ordering::Acquire);
                stamp
            },
            // SAFETY: pos < RING: an entry of the FIFO, read by value (sealed, so a torn
            // read is only "landing").
            |pos| unsafe { std::ptr::read_volatile(base.add(pos)) },
            &mut es,
        );
        match st {
            GroupState::Ready(n) => {
                fence(Ordering::Acquire);
                self.landing_since = None;
                self.cur.active = true;
                self.cur.n = n;
                self.cur.entries = es;
                self.cur.matched = 0;
                Ok(true)
            }
            GroupState::NotPosted => {
                self.landing_since = None;
                Ok(false)
            }
            GroupState::Landing => {
                // Still being written; a seal that never verifies means a broken peer.
                let now = Instant::now();
                let since = *self.landing_since.get_or_insert(now);
                if now.duration_since(since) > Duration::from_secs(crate::config::get().connect_timeout_sec.max(1)) {
                    return Err(self.core.fail(Error::remote(format!(
                        "the CTS entries from the receiver {} for group {} (FIFO entry {}) never became consistent (seal/count mismatch for {:?}): a corrupt or incompatible peer",
                        self.core.conn.chan.peer,
                        self.counter,
                        fifo::ring_pos(self.head),
                        now.duration_since(since)
                    ))));
                }
                Ok(false)
            }
        }
    }

    /// Poll the CQs; completions give back send-queue credits.
    fn poll(&mut self) -> Result<bool> {
        let SendDp { core, credits, .. } = self;
        core.poll(|pool, wr_id, c| on_completion(pool, credits, wr_id, c), describe)
    }

    /// Whether the current group is complete and waits for send-queue credits.
    fn waiting(&self) -> bool {
        self.cur.active && self.cur.matched == fifo::full_mask(self.cur.n)
    }

    /// Post the waiting group if its chains fit; a posting error fails the comm.
    fn try_post(&mut self) -> Result<()> {
        if let Err(e) = self.post_group() {
            return Err(self.core.fail(e));
        }
        Ok(())
    }

    /// No receive buffer to send into yet. Reaping completions meanwhile returns credits early,
    /// and lets a NIC whose completion poll can wait for its next event (softroce) put this
    /// thread to sleep until a CTS lands instead of spinning (the CQ is cheap to poll when empty).
    fn idle(&mut self) -> Result<Option<*mut Request>> {
        self.poll()?;
        if self.core.idle_probe()? {
            // Nothing to re-poll for a send that has not started: the receiver is gone.
            return Err(self.core.fail_peer_gone("a send waiting for the receiver's buffer"));
        }
        Ok(None)
    }

    pub fn isend(&mut self, data: usize, size: usize, tag: i32, mh: &MemHandle) -> Result<Option<*mut Request>> {
        self.core.check()?;
        if self.waiting() {
            // The group before this send waits for send-queue credits: reap, post, else retry.
            self.poll()?;
            self.try_post()?;
            if self.waiting() {
                return Ok(None);
            }
        }
        if !self.cur.active && !self.load_group()? {
            return self.idle();
        }
        let n = self.cur.n;
        let Some(i) = fifo::match_tag(&self.cur.entries[..n], self.cur.matched, tag) else {
            return self.idle();
        };
        mh.check(data, size, self.core.conn.devs.len())?;
        let Some(r) = self.core.pool.alloc(ReqKind::Send) else {
            return Ok(None);
        };
        let posted = self.cur.entries[i].size as usize;
        let len = size.min(posted);
        if size > posted && !self.truncate_warned {
            self.truncate_warned = true;
            crate::log_warn!(
                "isend of {size} bytes (tag {tag}) into a {posted}-byte receive buffer of {}: truncated to {posted} bytes (NCCL never does this; the receiver and sender disagree on sizes)",
                self.core.conn.chan.peer
            );
        }
        self.cur.reqs[i] = r;
        self.cur.data[i] = data;
        self.cur.len[i] = len;
        self.cur.lkeys[i] = mh.lkeys;
        self.cur.matched |= 1 << i;
        let pos = fifo::ring_pos(self.head);
        let req = self.core.pool.get_mut(r).expect("index from alloc");
        req.set_pos_n(pos, n);
        req.size = len as u32;
        // Not posted yet: one placeholder completion, replaced when the group is posted.
        req.pending = 1;
        let ptr = self.core.pool.ptr(r);
        if self.waiting() {
            // Posted now, or by a later test/isend once credits came back.
            self.try_post()?;
        }
        Ok(Some(ptr))
    }

    /// Post the complete current group if every chain fits its QP's credits (else leave it
    /// waiting).
    fn post_group(&mut self) -> Result<()> {
        if !self.waiting() {
            return Ok(());
        }
        let id = self.counter;
        let pos = fifo::ring_pos(self.head);
        let n = self.cur.n;
        let conn = &self.core.conn;
        let nq = conn.qps_per_req;
        let nqps = conn.qps.len();
        let ar_split = n == 1 && self.ar && self.cur.len[0] > self.ar_threshold;
        for j in 0..nq {
            let q = split::qp_for_chunk(id, nq, j, nqps);
            let k = split::plan_chain(&self.cur.len[..n], nq, j, ar_split, &mut self.plan);
            if usize::from(self.credits[q]) < k {
                return Ok(());
            }
        }
        let sizes_addr = self.bufs.addr() + pos * fifo::ENTRY_BYTES + fifo::SIZES_IN_ENTRY;
        if n > 1 {
            for i in 0..n {
                // SAFETY: bytes 16 + 4i of the group's first (consumed) entry, inside the
                // FIFO; no NIC writes it before this group's receive completed (see above).
                unsafe { std::ptr::write_volatile((sizes_addr as *mut u32).add(i), (self.cur.len[i] as u32).to_le()) };
            }
        }
        for j in 0..nq {
            let q = split::qp_for_chunk(id, nq, j, nqps);
            let cq = &conn.qps[q];
            let (ldev, rdev) = (cq.dev, cq.remote_dev);
            let k = split::plan_chain(&self.cur.len[..n], nq, j, ar_split, &mut self.plan);
            let wr_id = SendWrId::new(&self.cur.reqs[..n], k, q).0;
            for x in 0..k {
                let w = &mut self.wrs[x];
                w.wr_id = wr_id;
                match self.plan[x] {
                    WrPlan::Data { sub, off, len, imm } => {
                        let i = sub as usize;
                        let e = &self.cur.entries[i];
                        self.sges[x] = sys::ibv_sge {
                            addr: (self.cur.data[i] + off) as u64,
                            length: len as u32,
                            lkey: self.cur.lkeys[i][ldev],
                        };
                        w.sg_list = if len > 0 {
                            &mut self.sges[x]
                        } else {
                            std::ptr::null_mut()
                        };
                        w.num_sge = (len > 0) as i32;
                        w.wr.rdma = sys::rdma_t {
                            remote_addr: e.addr + off as u64,
                            rkey: e.rkeys[rdev.min(fifo::MAX_DEVS - 1)],
                        };
                        if imm {
                            w.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                            w.imm_data_invalidated_rkey_union.imm_data = (self.cur.len[0] as u32).to_be();
                            w.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
                        } else {
                            w.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                            w.send_flags = 0;
                        }
                    }
                    WrPlan::ZeroImm => {
                        // AR: a zero-length write carries the completion behind the bulk data.
                        let e = &self.cur.entries[0];
                        w.sg_list = std::ptr::null_mut();
                        w.num_sge = 0;
                        w.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                        w.imm_data_invalidated_rkey_union.imm_data = (self.cur.len[0] as u32).to_be();
                        w.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
                        w.wr.rdma = sys::rdma_t {
                            remote_addr: e.addr,
                            rkey: e.rkeys[rdev.min(fifo::MAX_DEVS - 1)],
                        };
                    }
                    WrPlan::SizesImm => {
                        // Grouped: the n sizes go into the receiver's completion record of the
                        // group (inside its CTS staging entry, fifo::SIZES_IN_ENTRY).
                        self.sges[x] = sys::ibv_sge {
                            addr: sizes_addr as u64,
                            length: (n * 4) as u32,
                            lkey: self.bufs.mrs[ldev].lkey(),
                        };
                        w.sg_list = &mut self.sges[x];
                        w.num_sge = 1;
                        w.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                        w.imm_data_invalidated_rkey_union.imm_data = (pos as u32).to_be();
                        w.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
                        w.wr.rdma = sys::rdma_t {
                            remote_addr: conn.peer.addr + (pos * fifo::ENTRY_BYTES) as u64,
                            rkey: conn.peer.devs[rdev].rkey,
                        };
                    }
                }
            }
            for x in 0..k {
                let next: *mut sys::ibv_send_wr = if x + 1 < k {
                    &mut self.wrs[x + 1]
                } else {
                    std::ptr::null_mut()
                };
                self.wrs[x].next = next;
            }
            // Taken before posting: a partly posted chain still counts against the queue.
            self.credits[q] -= k as u16;
            // SAFETY: the chain lives in self (stable, boxed) for the call; the local buffers
            // are registered user buffers (NCCL keeps them until the request completes) or our
            // consumed FIFO entry (lives as long as the QP); remote keys come from the CTS.
            unsafe { cq.qp.post_send(&mut self.wrs[0]) }?;
        }
        for &r in &self.cur.reqs[..n] {
            if let Some(req) = self.core.pool.get_mut(r) {
                req.pending = request::pending_count(nq);
            }
        }
        self.counter += 1;
        self.head += n as u64;
        self.cur.active = false;
        Ok(())
    }

    /// Progress the comm; report whether send request `req` is done (and reclaim it).
    ///
    /// # Safety
    /// `sizes` is NULL or points to room for one `i32`.
    pub unsafe fn test(&mut self, req: *const Request, sizes: *mut i32) -> Result<bool> {
        self.poll()?;
        if self.waiting() {
            self.try_post()?;
        }
        let Some((idx, r)) = self
            .core
            .pool
            .index_of(req)
            .and_then(|i| Some((i, self.core.pool.get(i)?)))
        else {
            return Err(Error::internal("test: unknown send request"));
        };
        if r.kind() != ReqKind::Send {
            return Err(Error::internal(
                "test: the request is not in flight (already completed?)",
            ));
        }
        if r.pending == 0 {
            if !sizes.is_null() {
                // SAFETY: NCCL passes NULL or room for one int for a send.
                unsafe { *sizes = r.size as i32 };
            }
            self.core.pool.free(idx);
            return Ok(true);
        }
        // A posted send to a dead peer fails by itself (transport retries exhausted within
        // NCCL_IB_TIMEOUT × NCCL_IB_RETRY_CNT); a closed side channel alone is not an error here
        // because the receiver may close as soon as the data has landed, before our ACK.
        self.core.idle_probe()?;
        Ok(false)
    }
}

/// A successful send completion: the final signaled write of one QP's chain for a group. It
/// retires the whole chain: its WRs' credits come back.
fn on_completion(pool: &mut RequestPool, credits: &mut [u16], wr_id: u64, _c: Completed) {
    let w = SendWrId(wr_id);
    if let Some(c) = credits.get_mut(w.qp()) {
        *c = (usize::from(*c) + w.chain()).min(SQ_DEPTH) as u16;
    }
    let n = pool.get(w.lane(0)).map(|r| r.n()).unwrap_or(1);
    for lane in 0..n {
        if let Some(r) = pool.get_mut(w.lane(lane)) {
            if r.kind() == ReqKind::Send {
                r.complete_one();
            }
        }
    }
}

fn describe(pool: &RequestPool, wr_id: u64) -> (&'static str, usize) {
    let w = SendWrId(wr_id);
    let n = pool.get(w.lane(0)).map(|r| r.n()).unwrap_or(1);
    let bytes = (0..n)
        .filter_map(|l| pool.get(w.lane(l)))
        .map(|r| r.size as usize)
        .sum();
    ("RDMA write (data)", bytes)
}
