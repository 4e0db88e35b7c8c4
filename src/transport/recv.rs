//! The receiver's data path (spec §8.8, §8.9): post one zero-SGE receive per QP the message
//! will use, RDMA-write the CTS entries of the grouped receive into the sender's FIFO, and
//! complete when every used QP delivered its WRITE WITH IMMEDIATE. `iflush` reads one byte of
//! the last non-empty buffer back through a loopback QP per device, into the device's shared
//! scratch ([`mr_cache::FlushScratch`]).

use super::conn::RegBuf;
use super::core::Core;
use super::fifo::{self, CtsEntry, MAX_DEVS, MAX_RECVS};
use super::mr_cache::{DeviceCache, FlushScratch};
use super::request::{self, ReqKind, Request, RequestPool};
use super::split;
use super::MemHandle;
use crate::error::{Error, Result};
use crate::ibv::cq::Completed;
use crate::ibv::{sys, QueuePair};
use std::sync::Arc;

/// `wr_id` kinds (top byte); the low 16 bits are a request index or a slot.
const KIND_SHIFT: u32 = 56;
const KIND_RECV: u64 = 1;
const KIND_CTS: u64 = 2;
const KIND_FLUSH: u64 = 3;

/// Bytes of the receiver's one registered block: the CTS staging `[slot][entry]`, which also
/// holds each slot's completion record ([`fifo::SIZES_IN_SLOT`]) and the posted sizes (the
/// staged entries' `size`). 16 KiB, four pages.
pub const RECV_BLOCK_BYTES: usize = fifo::FIFO_BYTES;
/// The completion-record address told to the sender (record `[slot]` is `SLOT_BYTES` further
/// per slot).
pub const CMPL_OFF: usize = fifo::SIZES_IN_SLOT;

fn wr_id(kind: u64, idx: u16) -> u64 {
    (kind << KIND_SHIFT) | u64::from(idx)
}

pub struct RecvDp {
    /// First: QPs are destroyed before the memory they touch is freed.
    pub core: Core,
    /// One loopback QP per local device (empty when flush is disabled).
    pub flush_qps: Vec<QueuePair>,
    /// Per local device with flush: the device's shared scratch, with its cache (so that every
    /// comm of the device gets the same one). After the flush QPs: they write into it.
    flush_scratch: Vec<(Arc<DeviceCache>, Arc<FlushScratch>)>,
    /// One registered block: the CTS staging `[slot][entry]` (the source of CTS writes), where
    /// the sender also writes a grouped receive's sizes (see [`RECV_BLOCK_BYTES`]).
    pub bufs: RegBuf,
    /// The sender's FIFO address.
    peer_fifo: u64,
    counter: u64,
    /// Receives posted and not yet reclaimed by test().
    recvs_in_flight: usize,
    use_inline: bool,
    cts_sge: sys::ibv_sge,
    cts_wr: sys::ibv_send_wr,
    recv_wr: sys::ibv_recv_wr,
    flush_sge: sys::ibv_sge,
    flush_wr: sys::ibv_send_wr,
}

// SAFETY: as SendDp: every raw pointer points into this boxed object; one thread at a time.
unsafe impl Send for RecvDp {}

impl RecvDp {
    pub fn new(
        core: Core,
        flush_qps: Vec<QueuePair>,
        flush_scratch: Vec<(Arc<DeviceCache>, Arc<FlushScratch>)>,
        bufs: RegBuf,
        use_inline: bool,
    ) -> Box<RecvDp> {
        let peer_fifo = core.conn.peer.addr;
        let mut dp = Box::new(RecvDp {
            core,
            flush_qps,
            flush_scratch,
            bufs,
            peer_fifo,
            counter: 0,
            recvs_in_flight: 0,
            use_inline,
            // SAFETY: plain data; zero is an empty value for all of these.
            cts_sge: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            cts_wr: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            recv_wr: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            flush_sge: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            flush_wr: unsafe { std::mem::zeroed() },
        });
        let owner = &mut *dp as *mut RecvDp as *mut ();
        dp.core.pool.set_owner(owner);
        dp
    }

    pub fn flush_enabled(&self) -> bool {
        !self.flush_qps.is_empty()
    }

    pub fn irecv(
        &mut self,
        data: &[usize],
        sizes: &[usize],
        tags: &[i32],
        mhs: &[&MemHandle],
    ) -> Result<Option<*mut Request>> {
        self.core.check()?;
        let n = data.len();
        if n == 0 || n > MAX_RECVS || sizes.len() != n || tags.len() != n || mhs.len() != n {
            return Err(Error::internal(format!(
                "irecv: inconsistent group (n={n}, sizes {}, tags {}, mhandles {})",
                sizes.len(),
                tags.len(),
                mhs.len()
            )));
        }
        let ndevs = self.core.conn.devs.len();
        for i in 0..n {
            mhs[i].check(data[i], sizes[i], ndevs)?;
            if sizes[i] > u32::MAX as usize {
                return Err(Error::internal(format!(
                    "irecv: buffer of {} bytes (at most 4 GiB per buffer)",
                    sizes[i]
                )));
            }
        }
        // A FIFO slot is free again once the receive posted SLOTS earlier completed (the sender
        // consumed its CTS before sending). NCCL never has more than 32 in flight.
        if self.recvs_in_flight >= fifo::SLOTS {
            return Ok(None);
        }
        let Some(r) = self.core.pool.alloc(ReqKind::Recv) else {
            return Ok(None);
        };
        self.recvs_in_flight += 1;
        let id = self.counter;
        let slot = fifo::slot_of(id);
        let nq = self.core.conn.qps_per_req;
        let nqps = self.core.conn.qps.len();
        {
            let req = self.core.pool.get_mut(r).expect("index from alloc");
            req.set_slot_n(slot, n);
            req.pending = request::pending_count(nq);
        }
        if let Err(e) = self.post(r, id, slot, nq, nqps, data, sizes, tags, mhs) {
            return Err(self.core.fail(e));
        }
        self.counter += 1;
        Ok(Some(self.core.pool.ptr(r)))
    }

    #[allow(clippy::too_many_arguments)]
    fn post(
        &mut self,
        r: u16,
        id: u64,
        slot: usize,
        nq: usize,
        nqps: usize,
        data: &[usize],
        sizes: &[usize],
        tags: &[i32],
        mhs: &[&MemHandle],
    ) -> Result<()> {
        let n = data.len();
        let conn = &self.core.conn;
        // One receive per QP the sender will complete on.
        for j in 0..nq {
            let q = split::qp_for_chunk(id, nq, j, nqps);
            self.recv_wr = sys::ibv_recv_wr {
                wr_id: wr_id(KIND_RECV, r),
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: 0,
            };
            // SAFETY: a zero-SGE receive names no memory; the WR is copied by the provider.
            unsafe { conn.qps[q].qp.post_recv(&mut self.recv_wr) }?;
        }
        // Stage the CTS entries (wire order) and write them into the sender's FIFO slot.
        let mut rkeys = [[0u32; MAX_DEVS]; MAX_RECVS];
        for i in 0..n {
            rkeys[i] = mhs[i].rkeys;
        }
        let mut entries = [CtsEntry::default(); MAX_RECVS];
        fifo::fill_slot(&mut entries, id, data, sizes, tags, &rkeys[..n]);
        let stage = (self.bufs.addr() as *mut CtsEntry).wrapping_add(slot * MAX_RECVS);
        for (i, e) in entries.iter().enumerate().take(n) {
            // SAFETY: slot * 8 + i < SLOTS * 8 entries of the staging buffer we own. The entry
            // from SLOTS posts ago has been read by the NIC and its completion record by us
            // (its request completed and was tested).
            unsafe { std::ptr::write_volatile(stage.add(i), e.to_wire()) };
        }
        let ndevs = conn.devs.len();
        let d = (id % ndevs as u64) as usize;
        let cq = &conn.qps[d];
        let len = n * fifo::ENTRY_BYTES;
        self.cts_sge = sys::ibv_sge {
            addr: stage as u64,
            length: len as u32,
            lkey: self.bufs.mrs[d].lkey(),
        };
        let mut flags = 0;
        if slot == d {
            // Regularly reap the send queue (unsignaled WRs stay outstanding until then).
            flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if self.use_inline && len as u32 <= cq.qp.max_inline_data {
            flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        // SAFETY: plain data, zero is valid.
        self.cts_wr = unsafe { std::mem::zeroed() };
        self.cts_wr.wr_id = wr_id(KIND_CTS, slot as u16);
        self.cts_wr.sg_list = &mut self.cts_sge;
        self.cts_wr.num_sge = 1;
        self.cts_wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
        self.cts_wr.send_flags = flags;
        self.cts_wr.wr.rdma = sys::rdma_t {
            remote_addr: self.peer_fifo + (slot * MAX_RECVS * fifo::ENTRY_BYTES) as u64,
            rkey: conn.peer.devs[cq.remote_dev].rkey,
        };
        // SAFETY: the staging entries live in self.bufs (as long as the QP) and are not
        // rewritten before this write has been read (see above).
        unsafe { cq.qp.post_send(&mut self.cts_wr) }
    }

    pub fn iflush(&mut self, data: &[usize], sizes: &[i32], mhs: &[&MemHandle]) -> Result<Option<*mut Request>> {
        self.core.check()?;
        if !self.flush_enabled() {
            return Ok(None);
        }
        let Some(last) = (0..data.len().min(sizes.len()).min(mhs.len()))
            .rev()
            .find(|&i| sizes[i] > 0)
        else {
            return Ok(None);
        };
        // A NULL flush request means "nothing to flush" to NCCL, so running out of slots must
        // be an error here, not a retry (NCCL keeps ≤ 32 receives + their flushes in flight).
        let Some(r) = self.core.pool.alloc(ReqKind::Flush) else {
            return Err(Error::internal(format!(
                "iflush: all {} request slots of the receive comm are in flight",
                request::RECV_REQUESTS
            )));
        };
        let ndevs = self.flush_qps.len();
        self.core.pool.get_mut(r).expect("index from alloc").pending = request::pending_count(ndevs);
        for d in 0..ndevs {
            let scratch = &self.flush_scratch[d].1;
            self.flush_sge = sys::ibv_sge {
                addr: scratch.buf.addr() as u64,
                length: 1,
                lkey: scratch.mr.lkey(),
            };
            // SAFETY: plain data, zero is valid.
            self.flush_wr = unsafe { std::mem::zeroed() };
            self.flush_wr.wr_id = wr_id(KIND_FLUSH, r);
            self.flush_wr.sg_list = &mut self.flush_sge;
            self.flush_wr.num_sge = 1;
            self.flush_wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_READ;
            self.flush_wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
            self.flush_wr.wr.rdma = sys::rdma_t {
                remote_addr: data[last] as u64,
                rkey: mhs[last].rkeys[d],
            };
            // SAFETY: the scratch word lives as long as the flush QP; the read source is a
            // registered buffer NCCL keeps until the flush completes.
            if let Err(e) = unsafe { self.flush_qps[d].post_send(&mut self.flush_wr) } {
                return Err(self.core.fail(e));
            }
        }
        Ok(Some(self.core.pool.ptr(r)))
    }

    /// Progress the comm; report whether request `req` is done (and reclaim it).
    ///
    /// # Safety
    /// `sizes` is NULL or points to room for the request's `n` `i32`s.
    pub unsafe fn test(&mut self, req: *const Request, sizes: *mut i32) -> Result<bool> {
        self.core.poll(on_completion, describe)?;
        let Some((idx, r)) = self
            .core
            .pool
            .index_of(req)
            .and_then(|i| Some((i, self.core.pool.get(i)?)))
        else {
            return Err(Error::internal("test: unknown receive request"));
        };
        let kind = r.kind();
        if kind != ReqKind::Recv && kind != ReqKind::Flush {
            return Err(Error::internal(
                "test: the request is not in flight (already completed?)",
            ));
        }
        if r.pending != 0 {
            if self.core.idle_probe()? && kind == ReqKind::Recv {
                // Completions that raced with the peer's exit still count.
                self.core.poll(on_completion, describe)?;
                if self.core.pool.get(idx).map(|r| r.pending) != Some(0) {
                    return Err(self.core.fail_peer_gone("a receive"));
                }
            } else {
                return Ok(false);
            }
        }
        let r = self.core.pool.get(idx).expect("checked above");
        if kind == ReqKind::Recv && !sizes.is_null() {
            let n = r.n();
            let slot = self.bufs.addr() + r.slot() * fifo::SLOT_BYTES;
            for i in 0..n {
                let got = if n == 1 {
                    r.size as usize
                } else {
                    let rec = (slot + CMPL_OFF + 4 * i) as *const u32;
                    // SAFETY: inside our staging slot (i < 8); written by the NIC before the
                    // receive completions we have seen, rewritten only after this request.
                    u32::from_le(unsafe { std::ptr::read_volatile(rec) }) as usize
                };
                // Never report more than was posted, whatever the peer claims: the posted
                // size is the staged entry's (untouched by the record, bytes 8..16).
                let entry = (slot as *const CtsEntry).wrapping_add(i);
                // SAFETY: entry i of our staging slot; we wrote it at irecv, nobody else does.
                let posted = u64::from_le(unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*entry).size)) });
                let v = got.min(posted.min(u32::MAX as u64) as usize);
                // SAFETY: NCCL passes room for the request's n ints (or NULL, checked).
                unsafe { *sizes.add(i) = v.min(i32::MAX as usize) as i32 };
            }
        }
        if kind == ReqKind::Recv {
            self.recvs_in_flight -= 1;
        }
        self.core.pool.free(idx);
        Ok(true)
    }
}

fn on_completion(pool: &mut RequestPool, id: u64, c: Completed) {
    let idx = (id & 0xffff) as u16;
    match id >> KIND_SHIFT {
        KIND_RECV => {
            if let Some(r) = pool.get_mut(idx) {
                if r.kind() == ReqKind::Recv {
                    if let Some(imm) = c.imm {
                        r.size = imm;
                    }
                    r.complete_one();
                }
            }
        }
        KIND_FLUSH => {
            if let Some(r) = pool.get_mut(idx) {
                if r.kind() == ReqKind::Flush {
                    r.complete_one();
                }
            }
        }
        // CTS writes: only reap the send queue.
        _ => {}
    }
}

fn describe(pool: &RequestPool, id: u64) -> (&'static str, usize) {
    // (The byte count of a failed receive is the announced size, when one arrived.)
    let r = pool.get((id & 0xffff) as u16);
    match id >> KIND_SHIFT {
        KIND_RECV => (
            "receive (RDMA write with immediate from the sender)",
            r.map(|r| r.size as usize).unwrap_or(0),
        ),
        KIND_CTS => ("RDMA write (CTS to the sender)", fifo::ENTRY_BYTES),
        KIND_FLUSH => ("RDMA read (GPU flush)", 1),
        _ => ("unknown operation", 0),
    }
}
