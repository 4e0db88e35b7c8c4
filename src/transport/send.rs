//! The sender's data path (spec §8.8): read the receiver's CTS entries from our FIFO, match
//! isends to the buffers of the oldest slot by tag, and when a slot's group is complete post
//! RDMA WRITEs (split in 128-byte multiples over the chosen QPs) ending in one signaled
//! RDMA WRITE WITH IMMEDIATE per QP.
//!
//! Nothing on this path allocates, locks or makes a syscall except `ibv_post_send` and the
//! rate-limited liveness probe when idle.

use super::conn::RegBuf;
use super::core::Core;
use super::fifo::{self, CtsEntry, SlotState, MAX_RECVS};
use super::request::{self, pack_wr_id, wr_id_lane, ReqKind, Request, RequestPool};
use super::split::{self, WrPlan, MAX_CHAIN};
use super::MemHandle;
use crate::error::{Error, Result};
use crate::ibv::cq::Completed;
use crate::ibv::sys;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

/// A grouped send stages its n sizes (the source of the completion-record write) in the FIFO
/// slot the group was matched in ([`fifo::SIZES_IN_SLOT`]). The slot is dead for us once
/// [`SendDp::load_slot`] copied it: we read it again only for the posting counter SLOTS later
/// (entry 0's stamp, untouched). The receiver writes it again only for that counter, i.e.
/// after this group's receive completed, so after every write reading these sizes executed at
/// the receiver (a retransmitted duplicate is not executed again, IBTA C9-105). So the FIFO
/// needs no separate sizes array, and the registered block is 16 KiB, four pages, not five.
/// Bytes of the sender's registered block: the CTS FIFO (grouped-send sizes inside, above).
pub const SEND_BLOCK_BYTES: usize = fifo::FIFO_BYTES;

/// The oldest FIFO slot once all its entries have landed.
struct CurSlot {
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
    /// One registered block: the CTS FIFO the receiver writes into (grouped sends stage their
    /// sizes in their consumed slot, [`fifo::SIZES_IN_SLOT`]).
    pub bufs: RegBuf,
    /// FIFO slots consumed so far.
    counter: u64,
    cur: CurSlot,
    ar: bool,
    ar_threshold: usize,
    truncate_warned: bool,
    /// When the current slot's stamp was first seen without a consistent entry.
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
        let mut dp = Box::new(SendDp {
            core,
            bufs,
            counter: 0,
            cur: CurSlot {
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

    /// Read the oldest slot; true when all its entries are there and sealed.
    fn load_slot(&mut self) -> Result<bool> {
        let slot = fifo::slot_of(self.counter);
        let base = (self.bufs.addr() as *const CtsEntry).wrapping_add(slot * MAX_RECVS);
        // SAFETY: `base` is inside the FIFO (slot < SLOTS), which lives as long as self. The
        // NIC writes it concurrently: the stamp is loaded alone (one aligned 8-byte volatile
        // load), and the rest only after it matched.
        let stamp = unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*base).stamp)) };
        if !fifo::stamp_matches(stamp, self.counter) {
            self.landing_since = None;
            return Ok(false);
        }
        fence(Ordering::Acquire);
        let n = ((u64::from_le(stamp) >> 56) as usize).clamp(1, MAX_RECVS);
        let mut es = [CtsEntry::default(); MAX_RECVS];
        for (i, e) in es.iter_mut().enumerate().take(n) {
            // SAFETY: i < n ≤ MAX_RECVS entries of this slot, inside the FIFO.
            *e = CtsEntry::from_wire(&unsafe { std::ptr::read_volatile(base.add(i)) });
        }
        match fifo::check_slot(&es[..n], self.counter) {
            SlotState::Ready(n) => {
                fence(Ordering::Acquire);
                self.landing_since = None;
                self.cur.active = true;
                self.cur.n = n;
                self.cur.entries = es;
                self.cur.matched = 0;
                Ok(true)
            }
            SlotState::NotPosted => Ok(false),
            SlotState::Landing => {
                // Still being written; a seal that never verifies means a broken peer.
                let now = Instant::now();
                let since = *self.landing_since.get_or_insert(now);
                if now.duration_since(since) > Duration::from_secs(crate::config::get().connect_timeout_sec.max(1)) {
                    return Err(self.core.fail(Error::remote(format!(
                        "the CTS entries from the receiver {} for slot {slot} never became consistent (seal/count mismatch for {:?}): a corrupt or incompatible peer",
                        self.core.conn.chan.peer,
                        now.duration_since(since)
                    ))));
                }
                Ok(false)
            }
        }
    }

    fn idle(&mut self) -> Result<Option<*mut Request>> {
        if self.core.idle_probe()? {
            // Nothing to re-poll for a send that has not started: the receiver is gone.
            return Err(self.core.fail_peer_gone("a send waiting for the receiver's buffer"));
        }
        Ok(None)
    }

    pub fn isend(&mut self, data: usize, size: usize, tag: i32, mh: &MemHandle) -> Result<Option<*mut Request>> {
        self.core.check()?;
        if !self.cur.active && !self.load_slot()? {
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
        let slot = fifo::slot_of(self.counter);
        let req = self.core.pool.get_mut(r).expect("index from alloc");
        req.set_slot_n(slot, n);
        req.size = len as u32;
        // Not posted yet: one placeholder completion, replaced when the group is posted.
        req.pending = 1;
        let ptr = self.core.pool.ptr(r);
        if self.cur.matched == fifo::full_mask(n) {
            if let Err(e) = self.post_group() {
                return Err(self.core.fail(e));
            }
        }
        Ok(Some(ptr))
    }

    fn post_group(&mut self) -> Result<()> {
        let id = self.counter;
        let slot = fifo::slot_of(id);
        let n = self.cur.n;
        let conn = &self.core.conn;
        let nq = conn.qps_per_req;
        let nqps = conn.qps.len();
        let ar_split = n == 1 && self.ar && self.cur.len[0] > self.ar_threshold;
        let sizes_addr = self.bufs.addr() + slot * fifo::SLOT_BYTES + fifo::SIZES_IN_SLOT;
        if n > 1 {
            for i in 0..n {
                // SAFETY: bytes 16 + 4i of entry 0 of our (consumed) slot, inside the FIFO; no
                // NIC writes this slot before this group's receive completed (see above).
                unsafe { std::ptr::write_volatile((sizes_addr as *mut u32).add(i), (self.cur.len[i] as u32).to_le()) };
            }
        }
        let wr_id = pack_wr_id(&self.cur.reqs[..n]);
        for j in 0..nq {
            let q = split::qp_for_chunk(id, nq, j, nqps);
            let cq = &conn.qps[q];
            let (ldev, rdev) = (cq.dev, cq.remote_dev);
            let k = split::plan_chain(&self.cur.len[..n], nq, j, ar_split, &mut self.plan);
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
                        // Grouped: the n sizes go into the receiver's completion record [slot]
                        // (inside its CTS staging slot, fifo::SIZES_IN_SLOT).
                        self.sges[x] = sys::ibv_sge {
                            addr: sizes_addr as u64,
                            length: (n * 4) as u32,
                            lkey: self.bufs.mrs[ldev].lkey(),
                        };
                        w.sg_list = &mut self.sges[x];
                        w.num_sge = 1;
                        w.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                        w.imm_data_invalidated_rkey_union.imm_data = (slot as u32).to_be();
                        w.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
                        w.wr.rdma = sys::rdma_t {
                            remote_addr: conn.peer.addr + (slot * fifo::SLOT_BYTES) as u64,
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
            // SAFETY: the chain lives in self (stable, boxed) for the call; the local buffers
            // are registered user buffers (NCCL keeps them until the request completes) or our
            // consumed FIFO slot (lives as long as the QP); remote keys come from the CTS.
            unsafe { cq.qp.post_send(&mut self.wrs[0]) }?;
        }
        for &r in &self.cur.reqs[..n] {
            if let Some(req) = self.core.pool.get_mut(r) {
                req.pending = request::pending_count(nq);
            }
        }
        self.counter += 1;
        self.cur.active = false;
        Ok(())
    }

    /// Progress the comm; report whether send request `req` is done (and reclaim it).
    ///
    /// # Safety
    /// `sizes` is NULL or points to room for one `i32`.
    pub unsafe fn test(&mut self, req: *const Request, sizes: *mut i32) -> Result<bool> {
        self.core.poll(on_completion, describe)?;
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

/// A successful send completion: the final signaled write of one QP's chain for a group.
fn on_completion(pool: &mut RequestPool, wr_id: u64, _c: Completed) {
    let n = pool.get(wr_id_lane(wr_id, 0)).map(|r| r.n()).unwrap_or(1);
    for lane in 0..n {
        if let Some(r) = pool.get_mut(wr_id_lane(wr_id, lane)) {
            if r.kind() == ReqKind::Send {
                r.complete_one();
            }
        }
    }
}

fn describe(pool: &RequestPool, wr_id: u64) -> (&'static str, usize) {
    let n = pool.get(wr_id_lane(wr_id, 0)).map(|r| r.n()).unwrap_or(1);
    let bytes = (0..n)
        .filter_map(|l| pool.get(wr_id_lane(wr_id, l)))
        .map(|r| r.size as usize)
        .sum();
    ("RDMA write (data)", bytes)
}
