//! The receiver's data path (spec §8.8, §8.9): post one zero-SGE receive per QP the message
//! will use, RDMA-write the CTS entries of the grouped receive into the next entries of the
//! sender's FIFO ring (two writes when they straddle its end), and complete when every used QP
//! delivered its WRITE WITH IMMEDIATE. `iflush` reads one byte of the last non-empty buffer back
//! through a loopback QP per device, into the device's shared scratch
//! ([`mr_cache::FlushScratch`]).
//!
//! The flush path ([`Flush`]: per device a loopback QP on its own CQ of [`FLUSH_CQE`] entries)
//! is made by the first `iflush` that has something to read, not at accept: NCCL flushes only
//! GPU buffers, and on compute capability ≥ 9.0 almost never (spec §7.7), so most comms never
//! need it. If making it fails, that `iflush` returns the error and the comm stays as it was
//! (usable; a later `iflush` tries again). At most [`request::FLUSHES_IN_FLIGHT`] flushes are
//! in flight; one more is an error (a NULL flush request would mean "nothing to flush").
//!
//! `irecv` says "retry later" (no side effects) when [`request::RECVS_IN_FLIGHT`] receives are
//! in flight, when the ring has no room for the group, or when the CTS QP has no send-queue
//! credit left ([`CTS_DEPTH`]).

use super::conn::{self, LocalDev, RegBuf};
use super::core::Core;
use super::errors::{wc_error, WcErrorReport};
use super::fifo::{self, CtsEntry, MAX_DEVS, MAX_RECVS};
use super::mr_cache::{self, DeviceCache, FlushScratch};
use super::request::{self, ReqKind, Request, RequestPool};
use super::MemHandle;
use super::{split, FLUSH_CQE, FLUSH_SEND_WR};
use crate::config;
use crate::error::{Error, Result};
use crate::ibv::cq::Completed;
use crate::ibv::qp::{QpCaps, RtrAttrs};
use crate::ibv::{sys, CompletionQueue, QueuePair, WorkCompletion};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// `wr_id` kinds (top byte); the low 16 bits are a request index, or for CTS writes the device
/// (bits 48..56) and the write's sequence number on that device's CTS QP (bits 0..48).
const KIND_SHIFT: u32 = 56;
const KIND_RECV: u64 = 1;
const KIND_CTS: u64 = 2;
const KIND_FLUSH: u64 = 3;

/// Bytes of the receiver's one registered block: the CTS staging ring (the same shape as the
/// sender's FIFO), which also holds each group's completion record ([`fifo::SIZES_IN_ENTRY`])
/// and the posted sizes (the staged entries' `size`). 4 KiB, one page.
pub const RECV_BLOCK_BYTES: usize = fifo::RING_BYTES;
/// The completion-record address told to the sender (the record of the group at ring position
/// `p` is `p × ENTRY_BYTES` further).
pub const CMPL_OFF: usize = fifo::SIZES_IN_ENTRY;

/// Send-queue depth of a receiver QP, and the CQ entries its CTS writes may take. Bound: CTS
/// WRs posted on a device's CTS QP and not yet retired ≤ CTS_DEPTH, enforced by `irecv` (which
/// says "retry later" beyond); a WR is retired when the polled completion of a signaled one at
/// or after it shows the queue got that far. Every [`CTS_SIGNAL_EVERY`]-th is signaled, so
/// whenever `irecv` is refused for credits (≥ CTS_DEPTH − 1 unretired, one irecv posts ≤ 2)
/// a signaled one is among them and its completion will come.
pub const CTS_DEPTH: usize = 32;
/// One CTS write in this many is signaled.
pub const CTS_SIGNAL_EVERY: u64 = 8;
const _: () = assert!(CTS_DEPTH as u64 > CTS_SIGNAL_EVERY && CTS_DEPTH >= 2);

fn wr_id(kind: u64, idx: u16) -> u64 {
    (kind << KIND_SHIFT) | u64::from(idx)
}

pub struct RecvDp {
    /// First: QPs are destroyed before the memory they touch is freed.
    pub core: Core,
    /// The GPU-flush path, made by the first iflush that reads (None before, and always when
    /// flushing is off). Its QPs read only the caller's buffers and write only the shared
    /// scratch, which it holds itself.
    flush: Option<Box<Flush>>,
    /// iflush issues RDMA reads (peer memory or DMA-BUF, and NCCL_GDR_FLUSH_DISABLE unset).
    flush_wanted: bool,
    /// Flush requests taken by iflush and not yet reclaimed by test() (≤ FLUSHES_IN_FLIGHT).
    flushes_in_flight: usize,
    /// One registered block: the CTS staging ring (the source of CTS writes), where the sender
    /// also writes a grouped receive's sizes (see [`RECV_BLOCK_BYTES`]).
    pub bufs: RegBuf,
    /// The sender's FIFO address.
    peer_fifo: u64,
    /// Posting counter: receives posted so far.
    counter: u64,
    /// Entries of the ring held by posted groups.
    ring: fifo::RingAlloc,
    /// Receives posted and not yet reclaimed by test().
    recvs_in_flight: usize,
    /// Per device: CTS writes posted on its CTS QP, and how many of them are retired.
    cts_posted: [u64; MAX_DEVS],
    cts_retired: [u64; MAX_DEVS],
    use_inline: bool,
    cts_sge: sys::ibv_sge,
    cts_wr: sys::ibv_send_wr,
    recv_wr: sys::ibv_recv_wr,
}

/// Test hook: when set, the next making of a flush path fails after its first QP exists
/// (the error path of iflush). Not for production use.
#[doc(hidden)]
pub static FAIL_NEXT_FLUSH_SETUP: AtomicBool = AtomicBool::new(false);

/// The flush path of a receive comm: one loopback QP per local device, on a CQ of its own.
struct Flush {
    /// Per local device, in the comm's device order.
    devs: Vec<FlushDev>,
    sge: sys::ibv_sge,
    wr: sys::ibv_send_wr,
}

/// One device's part of the flush path. Field order is drop order: the QP is destroyed before
/// its CQ (which it also holds) and before the scratch it writes into.
struct FlushDev {
    qp: QueuePair,
    cq: Arc<CompletionQueue>,
    /// The device's shared scratch, with its cache (so that every comm of the device gets the
    /// same one).
    scratch: Arc<FlushScratch>,
    _cache: Arc<DeviceCache>,
}

impl Flush {
    /// Make and connect the loopback QP of every local device (spec §8.9), RTS with the CTS
    /// writes' traffic class (NCCL_IB_FIFO_TC, else the sender's) and the sender's SL. On error
    /// everything made so far is destroyed again (QPs before CQs).
    fn new(devs: &[LocalDev], tc: u8, sl: u8) -> Result<Box<Flush>> {
        let cfg = config::get();
        let mut out = Vec::with_capacity(devs.len());
        for d in devs {
            let dev = &d.dev;
            let cache = mr_cache::cache_for(&dev.pd);
            let scratch = cache.flush_scratch()?;
            let cq = CompletionQueue::new(dev.context.clone(), FLUSH_CQE as i32)?;
            let qp = QueuePair::new_rc(
                dev.pd.clone(),
                cq.clone(),
                cq.clone(),
                QpCaps {
                    max_send_wr: FLUSH_SEND_WR,
                    max_recv_wr: 0,
                    max_inline_data: 0,
                },
                conn::modify_retry(cfg),
            )?;
            if FAIL_NEXT_FLUSH_SETUP.swap(false, Ordering::Relaxed) {
                return Err(Error::system("ibv_modify_qp(INIT) failed: injected by the test hook"));
            }
            qp.to_init(
                dev.port,
                cfg.pkey_index,
                sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 | sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0,
            )?;
            qp.to_rtr(&RtrAttrs {
                path_mtu: dev.active_mtu.clamp(1, 5),
                dest_qpn: qp.qpn(),
                global: dev.link_layer == crate::device::LinkLayer::Ethernet,
                dgid: dev.gid,
                sgid_index: dev.gid_index.clamp(0, 255) as u8,
                traffic_class: tc,
                dlid: dev.lid,
                sl,
                port_num: dev.port,
            })?;
            qp.to_rts(cfg.timeout, cfg.retry_cnt)?;
            out.push(FlushDev {
                qp,
                cq,
                scratch,
                _cache: cache,
            });
        }
        Ok(Box::new(Flush {
            devs: out,
            // SAFETY: plain data; zero is an empty value for both.
            sge: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            wr: unsafe { std::mem::zeroed() },
        }))
    }

    /// Poll every flush CQ until empty; a failed read fails the comm (one WARN).
    fn poll(&self, core: &mut Core) -> Result<bool> {
        let mut wcs: [WorkCompletion; 4] = std::array::from_fn(|_| WorkCompletion::default());
        let mut progressed = false;
        for (i, d) in self.devs.iter().enumerate() {
            loop {
                let got = d.cq.poll(&mut wcs).map_err(|e| core.fail(e))?;
                progressed |= !got.is_empty();
                for wc in got {
                    match wc.result() {
                        Ok(_) => complete_flush(&mut core.pool, wc.wr_id()),
                        // The loopback QP fails only by itself (data QPs have their own
                        // CQs), so its first failed completion is the cause.
                        Err(f) => {
                            let e = flush_error(&core.conn.devs[i].dev, &f);
                            return Err(core.fail(e));
                        }
                    }
                }
                if got.len() < wcs.len() {
                    break;
                }
            }
        }
        Ok(progressed)
    }
}

// SAFETY: as SendDp: every raw pointer points into this boxed object (the flush WR's into its
// boxed `Flush`); one thread at a time.
unsafe impl Send for RecvDp {}

impl RecvDp {
    /// `flush_wanted`: iflush issues RDMA reads (its QPs are made by the first one).
    pub fn new(core: Core, flush_wanted: bool, bufs: RegBuf, use_inline: bool) -> Box<RecvDp> {
        let peer_fifo = core.conn.peer.addr;
        let mut dp = Box::new(RecvDp {
            core,
            flush: None,
            flush_wanted,
            flushes_in_flight: 0,
            bufs,
            peer_fifo,
            counter: 0,
            ring: fifo::RingAlloc::default(),
            recvs_in_flight: 0,
            cts_posted: [0; MAX_DEVS],
            cts_retired: [0; MAX_DEVS],
            use_inline,
            // SAFETY: plain data; zero is an empty value for all of these.
            cts_sge: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            cts_wr: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            recv_wr: unsafe { std::mem::zeroed() },
        });
        let owner = &mut *dp as *mut RecvDp as *mut ();
        dp.core.pool.set_owner(owner);
        dp
    }

    /// Whether iflush issues RDMA reads.
    pub fn flush_enabled(&self) -> bool {
        self.flush_wanted
    }

    /// Loopback flush QPs this comm holds: 0 until the first iflush that reads, then one per
    /// local device.
    pub fn flush_qps(&self) -> usize {
        self.flush.as_ref().map_or(0, |f| f.devs.len())
    }

    /// Flush requests in flight.
    pub fn flushes_in_flight(&self) -> usize {
        self.flushes_in_flight
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
        // Everything that can say "retry later" is checked before anything changes. NCCL
        // never has more than 32 receives in flight; ring entries come back in posting order
        // as receives complete; CTS credits as signaled CTS writes complete.
        if self.recvs_in_flight >= request::RECVS_IN_FLIGHT || !self.ring.fits(n) {
            return Ok(None);
        }
        let id = self.counter;
        let d = (id % ndevs as u64) as usize;
        let start = self.ring.next_start();
        let writes = fifo::pieces(start, n).iter().filter(|p| p.1 > 0).count() as u64;
        if !self.cts_room(d, writes) {
            self.poll()?;
            if !self.cts_room(d, writes) {
                return Ok(None);
            }
        }
        let Some(r) = self.core.pool.alloc(ReqKind::Recv) else {
            return Ok(None);
        };
        let start = self.ring.alloc(n).expect("checked by fits");
        self.recvs_in_flight += 1;
        let nq = self.core.conn.qps_per_req;
        let nqps = self.core.conn.qps.len();
        {
            let req = self.core.pool.get_mut(r).expect("index from alloc");
            req.set_pos_n(fifo::ring_pos(start), n);
            req.pending = request::pending_count(nq);
        }
        if let Err(e) = self.post(r, id, start, d, nq, nqps, data, sizes, tags, mhs) {
            return Err(self.core.fail(e));
        }
        self.counter += 1;
        Ok(Some(self.core.pool.ptr(r)))
    }

    /// Whether device `d`'s CTS QP takes `writes` more WRs within [`CTS_DEPTH`].
    fn cts_room(&self, d: usize, writes: u64) -> bool {
        self.cts_posted[d] + writes - self.cts_retired[d] <= CTS_DEPTH as u64
    }

    /// Poll the CQs; signaled CTS completions retire CTS writes. The flush CQs are polled
    /// while a flush is in flight (with none, they are empty: every read posted completed, and
    /// its completion was polled before its request was reclaimed).
    fn poll(&mut self) -> Result<bool> {
        let RecvDp {
            core,
            cts_retired,
            flush,
            flushes_in_flight,
            ..
        } = self;
        let mut progressed = core.poll(|pool, id, c| on_completion(pool, cts_retired, id, c), describe)?;
        if *flushes_in_flight > 0 {
            if let Some(f) = flush {
                progressed |= f.poll(core)?;
            }
        }
        Ok(progressed)
    }

    #[allow(clippy::too_many_arguments)]
    fn post(
        &mut self,
        r: u16,
        id: u64,
        start: u64,
        d: usize,
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
        // Stage the CTS entries (wire order) and write them into the sender's FIFO ring.
        let mut rkeys = [[0u32; MAX_DEVS]; MAX_RECVS];
        for i in 0..n {
            rkeys[i] = mhs[i].rkeys;
        }
        let mut entries = [CtsEntry::default(); MAX_RECVS];
        fifo::fill_group(&mut entries, id, data, sizes, tags, &rkeys[..n]);
        let stage = self.bufs.addr() as *mut CtsEntry;
        for (i, e) in entries.iter().enumerate().take(n) {
            let pos = fifo::ring_pos(start + i as u64);
            // SAFETY: pos < RING entries of the staging ring we own. The ring gave these
            // entries to this group: the group that had them before completed and was reported
            // (its CTS write was read by the NIC, its completion record by us).
            unsafe { std::ptr::write_volatile(stage.add(pos), e.to_wire()) };
        }
        let cq = &conn.qps[d];
        let rkey = conn.peer.devs[cq.remote_dev].rkey;
        for (pos, len) in fifo::pieces(start, n) {
            if len == 0 {
                continue;
            }
            let bytes = len * fifo::ENTRY_BYTES;
            let seq = self.cts_posted[d];
            self.cts_sge = sys::ibv_sge {
                addr: stage.wrapping_add(pos) as u64,
                length: bytes as u32,
                lkey: self.bufs.mrs[d].lkey(),
            };
            let mut flags = 0;
            if seq % CTS_SIGNAL_EVERY == CTS_SIGNAL_EVERY - 1 {
                // Regularly reap the send queue (unsignaled WRs stay outstanding until then).
                flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
            }
            if self.use_inline && bytes as u32 <= cq.qp.max_inline_data {
                flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
            }
            // SAFETY: plain data, zero is valid.
            self.cts_wr = unsafe { std::mem::zeroed() };
            self.cts_wr.wr_id = cts_wr_id(d, seq);
            self.cts_wr.sg_list = &mut self.cts_sge;
            self.cts_wr.num_sge = 1;
            self.cts_wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            self.cts_wr.send_flags = flags;
            self.cts_wr.wr.rdma = sys::rdma_t {
                remote_addr: self.peer_fifo + (pos * fifo::ENTRY_BYTES) as u64,
                rkey,
            };
            // Counted before posting: a WR the provider may hold counts against the queue.
            self.cts_posted[d] += 1;
            // SAFETY: the staging entries live in self.bufs (as long as the QP) and are not
            // rewritten before this write has been read (see above).
            unsafe { cq.qp.post_send(&mut self.cts_wr) }?;
        }
        Ok(())
    }

    pub fn iflush(&mut self, data: &[usize], sizes: &[i32], mhs: &[&MemHandle]) -> Result<Option<*mut Request>> {
        self.core.check()?;
        if !self.flush_wanted {
            return Ok(None);
        }
        let Some(last) = (0..data.len().min(sizes.len()).min(mhs.len()))
            .rev()
            .find(|&i| sizes[i] > 0)
        else {
            return Ok(None);
        };
        // A NULL flush request means "nothing to flush" to NCCL, so a flush beyond the bound
        // must be an error here, not a retry (NCCL keeps ≤ 32 requests per comm, flushes
        // included: spec §7.6). The bound sizes the flush QPs and CQs.
        if self.flushes_in_flight >= request::FLUSHES_IN_FLIGHT {
            return Err(Error::internal(format!(
                "iflush: {} flushes of this receive comm are already in flight (NCCL keeps at most {} requests per comm)",
                self.flushes_in_flight,
                request::RECVS_IN_FLIGHT
            )));
        }
        if self.flush.is_none() {
            // Before anything else changes: a failure leaves the comm as it was.
            let peer = &self.core.conn.peer;
            let cfg = config::get();
            // Our QPs carry the CTS writes with NCCL_IB_FIFO_TC if set, else the sender's tc.
            let tc = if cfg.fifo_tc >= 0 {
                (cfg.fifo_tc & 0xff) as u8
            } else {
                peer.tc
            };
            let flush = Flush::new(&self.core.conn.devs, tc, peer.sl).map_err(|e| {
                e.context(format!(
                    "iflush: cannot make the GPU-flush loopback QP (one per device, made at the first flush) on {}; check the device's QP/CQ limits (ibv_devinfo -v: max_qp, max_cq), the locked-memory limit (ulimit -l) and the port state, or set NCCL_GDR_FLUSH_DISABLE=1 if no flush is needed",
                    self.core.conn.devs.iter().map(|d| d.dev.label()).collect::<Vec<_>>().join(", ")
                ))
            })?;
            self.flush = Some(flush);
        }
        let Some(r) = self.core.pool.alloc(ReqKind::Flush) else {
            return Err(Error::internal(format!(
                "iflush: all {} request slots of the receive comm are in flight",
                request::RECV_REQUESTS
            )));
        };
        let flush = self.flush.as_mut().expect("made above");
        let ndevs = flush.devs.len();
        self.core.pool.get_mut(r).expect("index from alloc").pending = request::pending_count(ndevs);
        self.flushes_in_flight += 1;
        for d in 0..ndevs {
            let fd = &flush.devs[d];
            flush.sge = sys::ibv_sge {
                addr: fd.scratch.buf.addr() as u64,
                length: 1,
                lkey: fd.scratch.mr.lkey(),
            };
            // SAFETY: plain data, zero is valid.
            flush.wr = unsafe { std::mem::zeroed() };
            flush.wr.wr_id = wr_id(KIND_FLUSH, r);
            flush.wr.sg_list = &mut flush.sge;
            flush.wr.num_sge = 1;
            flush.wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_READ;
            flush.wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
            flush.wr.wr.rdma = sys::rdma_t {
                remote_addr: data[last] as u64,
                rkey: mhs[last].rkeys[d],
            };
            // SAFETY: the scratch word lives as long as the flush QP (FlushDev holds it); the
            // read source is a registered buffer NCCL keeps until the flush completes.
            if let Err(e) = unsafe { flush.devs[d].qp.post_send(&mut flush.wr) } {
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
        self.poll()?;
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
                self.poll()?;
                if self.core.pool.get(idx).map(|r| r.pending) != Some(0) {
                    return Err(self.core.fail_peer_gone("a receive"));
                }
            } else {
                return Ok(false);
            }
        }
        let r = self.core.pool.get(idx).expect("checked above");
        let (n, pos) = (r.n(), r.pos());
        if kind == ReqKind::Recv && !sizes.is_null() {
            let stage = self.bufs.addr() as *const CtsEntry;
            let record = self.bufs.addr() + pos * fifo::ENTRY_BYTES + CMPL_OFF;
            for i in 0..n {
                let got = if n == 1 {
                    r.size as usize
                } else {
                    let rec = (record + 4 * i) as *const u32;
                    // SAFETY: inside the group's first staging entry (i < 8); written by the
                    // NIC before the receive completions we have seen; the entry is reused only
                    // after this request is reclaimed below.
                    u32::from_le(unsafe { std::ptr::read_volatile(rec) }) as usize
                };
                // Never report more than was posted, whatever the peer claims: the posted
                // size is the staged entry's (untouched by the record, bytes 8..16).
                let entry = stage.wrapping_add(fifo::ring_pos((pos + i) as u64));
                // SAFETY: entry i of the group in our staging ring (position < RING); we wrote
                // it at irecv, nobody else writes its bytes 8..16.
                let posted = u64::from_le(unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*entry).size)) });
                let v = got.min(posted.min(u32::MAX as u64) as usize);
                // SAFETY: NCCL passes room for the request's n ints (or NULL, checked).
                unsafe { *sizes.add(i) = v.min(i32::MAX as usize) as i32 };
            }
        }
        if kind == ReqKind::Recv {
            self.recvs_in_flight -= 1;
            // The sender consumed this group (it sent), and we have read its record: its ring
            // entries are free once every group posted before it is too. The ring position is
            // mod RING; the absolute start is the one at or below the ring's next start.
            self.ring.release(self.ring.abs_start(pos), n);
        } else {
            self.flushes_in_flight -= 1;
        }
        self.core.pool.free(idx);
        Ok(true)
    }
}

fn cts_wr_id(d: usize, seq: u64) -> u64 {
    (KIND_CTS << KIND_SHIFT) | ((d as u64 & 0xff) << 48) | (seq & ((1 << 48) - 1))
}

fn on_completion(pool: &mut RequestPool, cts_retired: &mut [u64; MAX_DEVS], id: u64, c: Completed) {
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
        // (Flush reads complete on the flush CQs: `complete_flush`.)
        // A signaled CTS write: it and every CTS write before it on that QP are retired.
        KIND_CTS => {
            let d = ((id >> 48) & 0xff) as usize;
            let seq = id & ((1 << 48) - 1);
            if let Some(r) = cts_retired.get_mut(d) {
                *r = (*r).max(seq + 1);
            }
        }
        _ => {}
    }
}

/// A successful read on a flush CQ: one device of flush request `id` is done.
fn complete_flush(pool: &mut RequestPool, id: u64) {
    if id >> KIND_SHIFT != KIND_FLUSH {
        return;
    }
    if let Some(r) = pool.get_mut((id & 0xffff) as u16) {
        if r.kind() == ReqKind::Flush {
            r.complete_one();
        }
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
        _ => ("unknown operation", 0),
    }
}

/// The error of a failed GPU-flush read on device `dev` (the "peer" is this process: the QP is
/// its own loopback).
fn flush_error(dev: &crate::device::NetDevice, f: &crate::ibv::cq::Failed) -> Error {
    let status_str = dev.verbs().wc_status_str(f.status);
    let mut e = wc_error(&WcErrorReport {
        device: &dev.name,
        port: dev.port,
        local_gid: &dev.gid,
        peer_gid: &dev.gid,
        peer_addr: "this process (loopback GPU-flush QP)",
        qp_num: f.qp_num,
        operation: "RDMA read (GPU flush)",
        bytes: 1,
        status: f.status,
        status_str: &status_str,
        vendor_err: f.vendor_err,
    });
    if f.status == super::errors::status::WR_FLUSH_ERR {
        // A loopback QP's responder side failing moves the QP to ERR with an async event and
        // no completion of its own.
        e.message.push_str(
            "; the loopback QP failed by itself: see the asynchronous-event WARN for it (often the flushed buffer is not covered by the memory handle NCCL passed, or was deregistered)",
        );
    }
    e
}
