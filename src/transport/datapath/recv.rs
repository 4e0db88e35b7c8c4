//! The receiver's I/O layer: one [`RecvCore`] (the protocol, `proto::recv`) over a [`Driver`]
//! and the registered CTS staging ring, plus the GPU-flush path.
//!
//! The flush path ([`Flush`]: per device a loopback QP on its own CQ of [`FLUSH_CQE`] entries,
//! reading one byte into the device's shared scratch, [`mr_cache::FlushScratch`]) is made by
//! the first `iflush` that has something to read, not at accept: NCCL flushes only GPU
//! buffers, and on compute capability ≥ 9.0 almost never (docs/nccl-net-abi.md#flush), so most
//! comms never need
//! it. If making it fails, that `iflush` returns the error and the comm stays as it was
//! (usable; a later `iflush` tries again).

mod close;

use super::completion_errors::{wc_error, WcErrorReport};
use super::driver::{self, Driver};
use super::requests::{not_in_flight, Request, Requests, Side};
use super::ring_memory::RingMemory;
use super::watch::{Guarded, Watched};
use crate::config;
use crate::error::{Error, Result};
use crate::ibv::qp::{QpCaps, RtrAttrs};
use crate::ibv::{sys, CompletionQueue, QueuePair, WorkCompletion};
use crate::profiler::{self, OpenEvents, QpEvent};
use crate::transport::conn::{self, Conn, LocalDev, RegBuf};
use crate::transport::proto::eager;
use crate::transport::proto::handshake::EAGER_VERSION;
use crate::transport::proto::limits::{MAX_DEVS, MAX_RECVS};
use crate::transport::proto::plan::{LocalBlock, Post, RemoteBlock, Sge, WorkRequest};
use crate::transport::proto::recv::{EagerRecvConfig, Irecv, RecvBuf, RecvConfig, RecvCore};
use crate::transport::proto::request::{ReqKind, RECV_REQUESTS};
use crate::transport::proto::time::Time;
use crate::transport::proto::{fifo, split};
use crate::transport::registration::mr_cache::{self, DeviceCache, FlushScratch};
use crate::transport::stats;
use crate::transport::{clock, MemHandle};
use crate::transport::{FLUSH_CQE, FLUSH_SEND_WR};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Bytes of the receiver's one registered block: the CTS staging ring (the same shape as the
/// sender's FIFO), which also holds each group's completion record ([`fifo::SIZES_IN_ENTRY`])
/// and the posted sizes (the staged entries' `size`). 4 KiB, one page.
pub const RECV_BLOCK_BYTES: usize = fifo::RING_BYTES;
/// The completion-record address told to the sender (the record of the group at ring position
/// `p` is `p × ENTRY_BYTES` further).
pub const CMPL_OFF: usize = fifo::SIZES_IN_ENTRY;

/// The receiving end's data path.
pub struct RecvDp {
    /// First: QPs are destroyed before the memory they touch is freed.
    pub io: Driver,
    /// The GPU-flush path, made by the first iflush that reads (None before, and always when
    /// flushing is off). Its QPs read only the caller's buffers and write only the shared
    /// scratch, which it holds itself.
    flush: Option<Box<Flush>>,
    /// iflush issues RDMA reads (peer memory or DMA-BUF, and NCCL_GDR_FLUSH_DISABLE unset).
    flush_wanted: bool,
    /// One registered block: the CTS staging ring (the source of CTS writes), where the sender
    /// also writes a grouped receive's sizes (see [`RECV_BLOCK_BYTES`]).
    pub bufs: RegBuf,
    ring: RingMemory,
    pub core: RecvCore,
    /// The requests NCCL holds, one per slot of the core's pool.
    requests: Requests,
    /// With statistics on: when each request started.
    started: Option<Box<[Time; RECV_REQUESTS]>>,
    /// While NCCL's profiler is on: made by the first receive with a profiler handle.
    prof: Option<Box<RecvProfiling>>,
}

/// NCCL profiler events of a receive comm: the open events and the receives the last irecv
/// posted (QP index, wr_id).
struct RecvProfiling {
    events: OpenEvents,
    posted: Vec<(usize, u64)>,
}

/// Test hook: when set, the next making of a flush path fails after its first QP exists
/// (the error path of iflush). Not for production use.
#[doc(hidden)]
pub static FAIL_NEXT_FLUSH_SETUP: AtomicBool = AtomicBool::new(false);

/// The flush path of a receive comm: one loopback QP per local device, on a CQ of its own.
struct Flush {
    /// Per local device, in the comm's device order.
    devs: Vec<FlushDev>,
    /// The scratch word of each device, as the core plans reads into it.
    scratch: Vec<Sge>,
    wrs: [sys::ibv_send_wr; 1],
    sges: [[sys::ibv_sge; 2]; 1],
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
    /// Make and connect the loopback QP of every local device (docs/nccl-net-abi.md#flush), RTS
    /// with the CTS
    /// writes' traffic class (NCCL_IB_FIFO_TC, else the sender's) and the sender's SL. On error
    /// everything made so far is destroyed again (QPs before CQs).
    fn new(devs: &[LocalDev], tc: u8, sl: u8) -> Result<Box<Flush>> {
        let mut out = Vec::with_capacity(devs.len());
        for d in devs {
            out.push(FlushDev::new(d, tc, sl)?);
        }
        let scratch = out
            .iter()
            .map(|d| Sge {
                addr: d.scratch.buf.addr() as u64,
                len: 1,
                lkey: d.scratch.mr.lkey(),
            })
            .collect();
        Ok(Box::new(Flush {
            devs: out,
            scratch,
            // SAFETY: plain data; zero is an empty value for both.
            wrs: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            sges: unsafe { std::mem::zeroed() },
        }))
    }

    /// Post one planned read on device `dev`'s loopback QP.
    ///
    /// # Safety
    /// The read's source is a registered buffer NCCL keeps until the flush completes; its
    /// target is the device's scratch word, which lives as long as the flush QP.
    unsafe fn post(&mut self, dev: usize, wr: &WorkRequest) -> Result<()> {
        let Some(d) = self.devs.get(dev) else {
            return Err(Error::internal(format!(
                "a flush read for device {dev} of {}",
                self.devs.len()
            )));
        };
        // SAFETY: as the caller guarantees.
        unsafe { driver::post_chain(&d.qp, std::slice::from_ref(wr), &mut self.wrs, &mut self.sges) }
    }

    /// Poll every flush CQ until empty; a failed read fails the comm (one WARN).
    fn poll(&self, io: &Driver, core: &mut RecvCore) -> Result<bool> {
        let mut wcs: [WorkCompletion; 4] = std::array::from_fn(|_| WorkCompletion::default());
        let mut progressed = false;
        for (i, d) in self.devs.iter().enumerate() {
            loop {
                let got = d.cq.poll(&mut wcs).map_err(|e| core.state.fail(e))?;
                progressed |= !got.is_empty();
                for wc in got {
                    match wc.result() {
                        Ok(_) => core.handle_flush_completion(wc.wr_id()),
                        // The loopback QP fails only by itself (data QPs have their own
                        // CQs), so its first failed completion is the cause.
                        Err(f) => {
                            let e = flush_error(&io.conn.devs[i].dev, &f);
                            return Err(core.state.fail(e));
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

impl FlushDev {
    fn new(d: &LocalDev, tc: u8, sl: u8) -> Result<FlushDev> {
        let cfg = config::get();
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
                max_send_sge: 1,
            },
            conn::modify_retry(cfg),
        )?;
        if FAIL_NEXT_FLUSH_SETUP.swap(false, Ordering::Relaxed) {
            return Err(Error::system("ibv_modify_qp(INIT) failed: injected by the test hook"));
        }
        qp.to_init(
            dev.port,
            dev.pkey_index,
            sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 | sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0,
        )?;
        let (gid_index, gid) = dev.gid_now()?;
        qp.to_rtr(&RtrAttrs {
            path_mtu: dev.active_mtu.clamp(1, 5),
            dest_qpn: qp.qpn(),
            global: dev.link_layer == crate::device::LinkLayer::Ethernet,
            dgid: gid,
            sgid_index: gid_index.clamp(0, 255) as u8,
            traffic_class: tc,
            dlid: dev.lid,
            sl,
            port_num: dev.port,
        })?;
        qp.to_rts(cfg.timeout, cfg.retry_cnt)?;
        Ok(FlushDev {
            qp,
            cq,
            scratch,
            _cache: cache,
        })
    }
}

// SAFETY: as SendDp: every raw pointer points into this boxed object or memory it owns (the
// flush WRs into its boxed `Flush`); one thread at a time.
unsafe impl Send for RecvDp {}

impl Watched for RecvDp {
    fn set_owner(&mut self, owner: *const ()) {
        self.requests.set_owner(owner);
    }

    fn idle_step(&mut self) {
        if self.io.wants_idle_step() {
            // An error is the comm's state now: NCCL's next call returns it.
            let _ = self.poll();
        }
        if self.core.cts_staged() {
            // Receives posted back to back and never tested since: their CTS go now.
            let _ = self.flush_cts();
        }
    }
}

impl RecvDp {
    /// `flush_wanted`: iflush issues RDMA reads (its QPs are made by the first one).
    /// `eager_max`: the largest payload of the eager landing ring that follows the staging ring
    /// in `bufs` (0: none).
    pub fn new(
        conn: Conn,
        flush_wanted: bool,
        bufs: RegBuf,
        use_inline: bool,
        eager_max: usize,
    ) -> Box<Guarded<RecvDp>> {
        let mut lkeys = [0; MAX_DEVS];
        for (k, m) in lkeys.iter_mut().zip(&bufs.mrs) {
            *k = m.lkey();
        }
        let mut peer_rkeys = [0; MAX_DEVS];
        for (k, d) in peer_rkeys.iter_mut().zip(&conn.peer.devs) {
            *k = d.rkey;
        }
        // The CTS QP of device d is QP d; its inline limit is what the provider granted.
        let mut cts_inline_max = [0; MAX_DEVS];
        if use_inline {
            for (m, q) in cts_inline_max.iter_mut().zip(&conn.qps) {
                *m = q.qp.max_inline_data;
            }
        }
        let cfg = RecvConfig {
            routes: conn.routes(),
            cts_qps: conn.devs.len().min(conn.qps.len()),
            qps_per_req: conn.qps_per_req,
            staging: LocalBlock {
                addr: bufs.addr() as u64,
                lkeys,
            },
            peer_fifo: RemoteBlock {
                addr: conn.peer.addr,
                rkeys: peer_rkeys,
            },
            cts_inline_max,
            max_buffer_bytes: split::max_buffer_bytes(conn.wr_bytes()),
            wr_bytes: conn.wr_bytes(),
            peer: conn.chan.peer().to_string(),
            named_imm: conn.chan.version() >= EAGER_VERSION,
            eager: (eager_max > 0).then(|| EagerRecvConfig {
                landing: (bufs.addr() + RECV_BLOCK_BYTES) as u64,
                slot_bytes: eager::slot_bytes(eager_max),
                max: eager_max,
            }),
        };
        // SAFETY: the block is RING_BYTES and, with an eager path, the landing ring after it,
        // page-aligned, and lives in the same RecvDp.
        let ring = unsafe { RingMemory::with_landing(&bufs, cfg.eager.map_or(0, |e| e.slot_bytes)) };
        let io = Driver::new(conn, "recv", "");
        let started = io.stats.is_some().then(|| Box::new([Time::ZERO; RECV_REQUESTS]));
        Guarded::new(RecvDp {
            io,
            flush: None,
            flush_wanted,
            bufs,
            ring,
            core: RecvCore::new(cfg, driver::warn_failure),
            requests: Requests::new(Side::Recv, RECV_REQUESTS),
            started,
            prof: None,
        })
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
        self.core.flushes_in_flight()
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.core.state.pool.in_flight()
    }

    /// Poll the CQs. The flush CQs are polled while a flush is in flight (with none, they are
    /// empty: every read posted completed, and its completion was polled before its request
    /// was reclaimed).
    fn poll(&mut self) -> Result<bool> {
        let mut progressed = self.io.poll(&mut self.core)?;
        let RecvDp { io, ring, core, .. } = self;
        // SAFETY: deliveries copy from our landing ring into host buffers NCCL posted (the
        // core takes them from the receives' memory handles, checked at irecv).
        core.decide_eager(ring, &mut |p| unsafe { io.post(p) })?;
        if self.core.flushes_in_flight() > 0 {
            if let Some(f) = &self.flush {
                progressed |= f.poll(&self.io, &mut self.core)?;
            }
        }
        Ok(progressed)
    }

    /// Post a grouped receive. `None` = out of request slots, ring space or CTS credits: retry
    /// later (no side effects).
    pub fn irecv(
        &mut self,
        data: &[usize],
        sizes: &[usize],
        tags: &[i32],
        mhs: &[&MemHandle],
        phandles: &[*mut c_void],
    ) -> Result<Option<*mut Request>> {
        self.core.state.check()?;
        // A recovery moves on in every call NCCL makes: with no receive in flight, irecv is
        // the only one.
        if self.io.recovery.pending() {
            self.poll()?;
        }
        if self.prof.is_none() && phandles.iter().any(|p| !p.is_null()) && profiler::enabled() {
            self.prof = Some(Box::new(RecvProfiling {
                events: OpenEvents::new(),
                posted: Vec::with_capacity(64),
            }));
        }
        let n = data.len();
        if n == 0 || n > MAX_RECVS || sizes.len() != n || tags.len() != n || mhs.len() != n {
            return Err(Error::internal(format!(
                "irecv: inconsistent group (n={n}, sizes {}, tags {}, mhandles {})",
                sizes.len(),
                tags.len(),
                mhs.len()
            )));
        }
        let ndevs = self.io.conn.devs.len();
        let mut bufs = [RecvBuf {
            data: 0,
            size: 0,
            tag: 0,
            rkeys: [0; MAX_DEVS],
            host: false,
        }; MAX_RECVS];
        for i in 0..n {
            mhs[i].check(data[i], sizes[i], ndevs)?;
            bufs[i] = RecvBuf {
                data: data[i],
                size: sizes[i],
                tag: tags[i],
                rkeys: mhs[i].rkeys,
                host: mhs[i].host,
            };
        }
        let mut answer = self.post_irecv(&bufs[..n])?;
        if answer == Irecv::NoCtsCredit {
            self.poll()?;
            answer = self.post_irecv(&bufs[..n])?;
        }
        match answer {
            Irecv::Started(idx) => {
                if let Some(started) = &mut self.started {
                    started[usize::from(idx) % RECV_REQUESTS] = clock::now();
                }
                if let Some(pr) = self.prof.as_mut() {
                    for (i, &phandle) in phandles.iter().enumerate().take(n) {
                        for &(qp, wr_id) in &pr.posted {
                            let Some(q) = self.io.conn.qps.get(qp) else { continue };
                            let event = QpEvent {
                                device: q.dev as i32,
                                wr_id,
                                opcode: sys::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM as i32,
                                qp_num: q.qp.qpn() as i32,
                                length: sizes[i],
                            };
                            pr.events.start(idx, phandle, event);
                        }
                    }
                }
                Ok(Some(self.requests.ptr(idx)))
            }
            Irecv::Busy | Irecv::NoCtsCredit => self.refused(),
        }
    }

    /// `irecv` was refused (every request slot in flight, ring space or CTS credits short, a
    /// recovery): reap completions (they return credits; a CTS write that failed starts a
    /// recovery) and look at the side channel now and then. With no receive in flight NCCL
    /// calls nothing else on this comm, and the peer's recovery (its Hello) must not wait for
    /// a call that only comes once its own sends complete.
    fn refused(&mut self) -> Result<Option<*mut Request>> {
        self.poll()?;
        self.flush_cts()?;
        let in_flight = self.in_flight();
        let waiting = |_: &_| {
            format!("room for the next receive ({in_flight} in flight): CTS writes to the sender that do not complete, or a recovery of the connection")
        };
        if self.io.idle_probe(&mut self.core.state, waiting)? {
            return Err(self
                .io
                .fail_peer_gone(&mut self.core.state, "a receive waiting for CTS credits"));
        }
        Ok(None)
    }

    /// Write the CTS entries the receives posted since the last flush staged (one write for
    /// receives posted back to back).
    fn flush_cts(&mut self) -> Result<()> {
        let RecvDp { io, core, .. } = self;
        core.flush_cts(&mut |p| {
            if let (Post::Send { .. }, Some(s)) = (&p, &io.stats) {
                s.cts_written();
            }
            // SAFETY: CTS writes read our staging entries, which live in self.bufs (as long as
            // the QP) and are not rewritten before the write was read.
            unsafe { io.post(p) }
        })
    }

    fn post_irecv(&mut self, bufs: &[RecvBuf]) -> Result<Irecv> {
        let RecvDp {
            io, ring, core, prof, ..
        } = self;
        if let Some(pr) = prof.as_mut() {
            pr.posted.clear();
        }
        let answer = core.irecv(ring, bufs, &mut |p| {
            if let (Post::Send { .. }, Some(s)) = (&p, &io.stats) {
                s.cts_written();
            }
            // SAFETY: receives name no memory; CTS writes read our staging entries, which live
            // in self.bufs (as long as the QP) and are not rewritten before the write was read.
            unsafe { io.post(p) }
        })?;
        if let (Irecv::Started(_), Some(pr)) = (answer, prof.as_mut()) {
            pr.posted.extend(core.last_receive_qps());
        }
        Ok(answer)
    }

    /// `None` = nothing to flush (flush disabled or every size is 0).
    pub fn iflush(&mut self, data: &[usize], sizes: &[i32], mhs: &[&MemHandle]) -> Result<Option<*mut Request>> {
        self.core.state.check()?;
        if !self.flush_wanted {
            return Ok(None);
        }
        let n = data.len().min(sizes.len()).min(mhs.len());
        let Some(last) = RecvCore::flush_target(&sizes[..n]) else {
            return Ok(None);
        };
        if self.flush.is_none() {
            // Before anything else changes: a failure leaves the comm as it was.
            self.flush = Some(self.make_flush()?);
        }
        let Some(flush) = self.flush.as_mut() else {
            return Err(Error::internal("iflush: the flush path is missing"));
        };
        let Flush { scratch, .. } = &**flush;
        let scratch: [Sge; MAX_DEVS] = std::array::from_fn(|d| scratch.get(d).copied().unwrap_or_default());
        let ndevs = flush.devs.len();
        let r = self
            .core
            .iflush(data[last], &mhs[last].rkeys, &scratch[..ndevs], &mut |p| match p {
                // SAFETY: reads a registered buffer NCCL keeps until the flush completes, into the
                // scratch word that lives as long as the flush QP.
                Post::Flush { dev, wr } => unsafe { flush.post(dev, &wr) },
                _ => Err(Error::internal("iflush planned a data-QP operation")),
            })?;
        Ok(Some(self.requests.ptr(r)))
    }

    fn make_flush(&self) -> Result<Box<Flush>> {
        let peer = &self.io.conn.peer;
        let cfg = config::get();
        // Our QPs carry the CTS writes with NCCL_IB_FIFO_TC if set, else the sender's tc.
        let tc = if cfg.fifo_tc >= 0 {
            (cfg.fifo_tc & 0xff) as u8
        } else {
            peer.tc
        };
        Flush::new(&self.io.conn.devs, tc, peer.sl).map_err(|e| {
            e.context(format!(
                "iflush: cannot make the GPU-flush loopback QP (one per device, made at the first flush) on {}; check the device's QP/CQ limits (ibv_devinfo -v: max_qp, max_cq), the locked-memory limit (ulimit -l) and the port state, or set NCCL_GDR_FLUSH_DISABLE=1 if no flush is needed",
                self.io.conn.devs.iter().map(|d| d.dev.label()).collect::<Vec<_>>().join(", ")
            ))
        })
    }

    /// Progress the comm; report whether request `req` is done (and reclaim it).
    ///
    /// # Safety
    /// `sizes` is NULL or points to room for the request's `n` `i32`s.
    pub unsafe fn test(&mut self, req: *const Request, sizes: *mut i32) -> Result<bool> {
        let Some(idx) = self.requests.slot_of(req) else {
            return Err(Error::internal("test: unknown receive request"));
        };
        if self.core.kind_of(idx).is_none_or(|k| k == ReqKind::Free) {
            return Err(not_in_flight());
        }
        // A receive an earlier call's poll completed is reported without polling again, as
        // NCCL's IB transport looks at the request before its CQ (docs/design/data-path.md,
        // test()); staged CTS entries are written all the same.
        let mut done = None;
        if !self.io.recovery.pending() {
            self.flush_cts()?;
            done = self.core.test(&self.ring, idx)?;
        }
        if done.is_none() {
            self.poll()?;
            self.flush_cts()?;
            done = self.core.test(&self.ring, idx)?;
        }
        if done.is_none() {
            let kind = self.core.kind_of(idx);
            let in_flight = self.in_flight();
            let waiting = |_: &_| {
                if kind == Some(ReqKind::Flush) {
                    "a GPU-flush read on the loopback QP (the local NIC does not answer)".to_string()
                } else {
                    format!("the sender's data for {in_flight} posted receive(s): the peer has not sent (is it stuck, or sending to another peer?) or its writes do not arrive")
                }
            };
            if !self.io.idle_probe(&mut self.core.state, waiting)? || kind != Some(ReqKind::Recv) {
                return Ok(false);
            }
            // The peer is gone. Completions that raced with its exit still count.
            self.poll()?;
            done = self.core.test(&self.ring, idx)?;
            if done.is_none() {
                return Err(self.io.fail_peer_gone(&mut self.core.state, "a receive"));
            }
        }
        if let Some(pr) = self.prof.as_mut() {
            pr.events.stop_request(idx);
        }
        if let Some(o) = done.and_then(|d| d.oversized) {
            crate::log_warn!(
                "the sender {} claimed {} bytes for buffer {} of a receive of {} buffer(s), posted with {} bytes: no honest sender claims more than the posted size (it truncates to it); reported the posted size (once per comm) — check the peer's version and health",
                self.io.conn.chan.peer(),
                o.claimed,
                o.buffer,
                o.n,
                o.posted
            );
        }
        if let (Some(d), Some(s), Some(started)) = (done, &self.io.stats, &self.started) {
            if d.n > 0 {
                let t0 = started[usize::from(idx) % RECV_REQUESTS];
                let bytes = d.sizes[..d.n].iter().map(|&b| u64::from(b)).sum();
                s.message_done(bytes, stats::since(t0, clock::now()));
            }
        }
        if let (Some(d), false) = (done, sizes.is_null()) {
            for (i, &s) in d.sizes[..d.n].iter().enumerate() {
                // SAFETY: NCCL passes room for the request's n ints (or NULL, checked).
                unsafe { *sizes.add(i) = s.min(i32::MAX as u32) as i32 };
            }
        }
        Ok(true)
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
    if f.status == sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
        // A loopback QP's responder side failing moves the QP to ERR with an async event and
        // no completion of its own.
        e.message.push_str(
            "; the loopback QP failed by itself: see the asynchronous-event WARN for it (often the flushed buffer is not covered by the memory handle NCCL passed, or was deregistered)",
        );
    }
    e
}
