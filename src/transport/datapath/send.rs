//! The sender's I/O layer: one [`SendCore`] (the protocol, `proto::send`) over a [`Driver`]
//! (posts and polls) and the registered FIFO ring the receiver writes CTS entries into.
//!
//! Nothing on this path allocates, locks or makes a syscall except `ibv_post_send`, the CQ
//! polls and the rate-limited liveness probe when idle.

use super::driver::{self, Driver};
use super::requests::{not_in_flight, Request, Requests, Side};
use super::ring_memory::RingMemory;
use super::sink::SendSide;
use super::watch::{Guarded, Watched};
use crate::error::{Error, Result};
use crate::ibv::sys;
use crate::profiler::{self, OpenEvents, QpEvent};
use crate::transport::conn::{Conn, RegBuf};
use crate::transport::proto::eager::{self, EagerSendConfig, EAGER_QP};
use crate::transport::proto::fifo;
use crate::transport::proto::handshake::EAGER_VERSION;
use crate::transport::proto::hang;
use crate::transport::proto::limits::MAX_DEVS;
use crate::transport::proto::plan::{LocalBlock, RemoteBlock};
use crate::transport::proto::plan::{Op, Post};
use crate::transport::proto::request::{ReqKind, SendWrId, SEND_REQUESTS};
use crate::transport::proto::send::{Isend, SendBuf, SendConfig, SendCore};
use crate::transport::proto::time::Time;
use crate::transport::stats;
use crate::transport::{clock, MemHandle};
use std::ffi::c_void;
use std::time::Duration;

/// Bytes of the sender's registered block: the CTS FIFO ring, 4 KiB (one page).
pub(crate) const SEND_BLOCK_BYTES: usize = fifo::RING_BYTES;

/// The sending end's data path.
pub(crate) struct SendDp {
    /// First: QPs are destroyed before the FIFO memory they write into is freed.
    pub io: Driver,
    /// One registered block: the CTS FIFO ring the receiver writes into (grouped sends stage
    /// their sizes in their group's consumed first entry). Read only at setup; held so the
    /// registration lives as long as the QPs that write into it.
    #[allow(dead_code)]
    bufs: RegBuf,
    ring: RingMemory,
    pub core: SendCore,
    /// The requests NCCL holds, one per slot of the core's pool.
    requests: Requests,
    /// With statistics on: when each request started, and since when isend found no CTS.
    started: Option<Box<[Time; SEND_REQUESTS]>>,
    cts_wait_since: Option<Time>,
    /// While NCCL's profiler is on: made by the first send with a profiler handle.
    prof: Option<Box<SendProfiling>>,
}

/// NCCL profiler events of a send comm: each request's phandle, the open events, and the
/// chains posted by the last call (what their events describe).
struct SendProfiling {
    phandles: [*mut c_void; SEND_REQUESTS],
    events: OpenEvents,
    /// (QP index, wr_id of the chain's signaled WR, ibv opcode, bytes of the chain).
    posted: Vec<(usize, u64, u32, usize)>,
}

impl SendProfiling {
    fn new() -> Box<SendProfiling> {
        Box::new(SendProfiling {
            phandles: [std::ptr::null_mut(); SEND_REQUESTS],
            events: OpenEvents::new(),
            posted: Vec::with_capacity(64),
        })
    }

    /// Note a chain just handed to the driver.
    fn note(&mut self, p: &Post<'_>) {
        if let Post::Send { qp, chain } = p {
            if let Some(last) = chain.last() {
                let op = match last.op {
                    Op::WriteImm(_) => sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
                    Op::Write => sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                    Op::Read => sys::ibv_wr_opcode::IBV_WR_RDMA_READ,
                };
                self.posted
                    .push((*qp, last.wr_id, op, chain.iter().map(|w| w.len()).sum()));
            }
        }
    }

    /// A Start event per request of every chain noted (those with a phandle).
    fn start_posted(&mut self, io: &Driver, core: &SendCore) {
        for (qp, wr_id, opcode, length) in std::mem::take(&mut self.posted).drain(..) {
            let w = SendWrId(wr_id);
            let n = core.state.pool.get(w.lane(0)).map_or(1, |r| r.n());
            let Some(q) = io.conn.qps.get(qp) else { continue };
            let event = QpEvent {
                device: q.dev as i32,
                wr_id,
                opcode: opcode as i32,
                qp_num: q.qp.qpn() as i32,
                length,
            };
            for lane in 0..n {
                let r = w.lane(lane);
                let phandle = self.phandles[usize::from(r) % SEND_REQUESTS];
                self.events.start(r, phandle, event);
            }
        }
    }
}

// SAFETY: the raw pointers (requests' owner, the ring view, WR scratch) all point into this
// boxed object or memory it owns; it is used by one thread at a time (its `Guarded` lock).
unsafe impl Send for SendDp {}

impl Watched for SendDp {
    fn set_owner(&mut self, owner: *const ()) {
        self.requests.set_owner(owner);
    }

    fn idle_step(&mut self) {
        if self.io.wants_idle_step() {
            // An error is the comm's state now: NCCL's next call returns it.
            let _ = self.poll();
        }
    }
}

/// The receiver block fields of a connection's peer record, by member device.
fn remote_block(conn: &Conn) -> RemoteBlock {
    let mut rkeys = [0; MAX_DEVS];
    for (k, d) in rkeys.iter_mut().zip(&conn.peer.devs) {
        *k = d.rkey;
    }
    RemoteBlock {
        addr: conn.peer.addr,
        rkeys,
    }
}

/// Our registered block as the core names it.
fn local_block(bufs: &RegBuf) -> LocalBlock {
    let mut lkeys = [0; MAX_DEVS];
    for (k, m) in lkeys.iter_mut().zip(&bufs.mrs) {
        *k = m.lkey();
    }
    LocalBlock {
        addr: bufs.addr() as u64,
        lkeys,
    }
}

/// The eager path of a connection, if both ends have it: a version-5 connection whose receiver
/// offers a landing ring, `FERROCE_EAGER_MAX` > 0 here, and an eager QP that takes the header
/// inline.
fn eager_config(conn: &Conn) -> Option<EagerSendConfig> {
    let offer = conn.peer.eager;
    let max = crate::config::get().eager_max.min(offer.max as usize);
    let inline_max = conn.qps.get(EAGER_QP).map_or(0, |q| q.qp.max_inline_data as usize);
    let usable = conn.chan.version() >= EAGER_VERSION && offer.offered() && inline_max >= eager::EAGER_HEADER_BYTES;
    (usable && max > 0).then(|| EagerSendConfig {
        max,
        inline_max,
        landing: offer.landing,
        // The ring is in the receiver's block: its rkeys are the completion records'.
        landing_rkeys: remote_block(conn).rkeys,
        slot_bytes: offer.slot_bytes as usize,
    })
}

impl SendDp {
    /// `ar`: adaptive routing (messages above `ar_threshold` complete with a separate write).
    pub(crate) fn new(conn: Conn, bufs: RegBuf, ar: bool, ar_threshold: usize) -> Box<Guarded<SendDp>> {
        let cfg = SendConfig {
            routes: conn.routes(),
            local_devs: conn.devs.len(),
            peer_devs: conn.peer.devs.len(),
            qps_per_req: conn.qps_per_req,
            ar_threshold: ar.then_some(ar_threshold),
            landing_timeout: Duration::from_secs(crate::config::get().connect_timeout_sec.max(1)),
            wr_bytes: conn.wr_bytes(),
            fifo: local_block(&bufs),
            peer_records: remote_block(&conn),
            peer: conn.chan.peer().to_string(),
            eager: eager_config(&conn),
            named_imm: conn.chan.version() >= EAGER_VERSION,
        };
        // SAFETY: the FIFO block is RING_BYTES, page-aligned, and lives in the same SendDp.
        let ring = unsafe { RingMemory::new(&bufs) };
        let io = Driver::new(
            conn,
            "send",
            &if ar {
                format!(", adaptive routing above {ar_threshold} B")
            } else {
                String::new()
            },
        );
        let started = io.stats.is_some().then(|| Box::new([Time::ZERO; SEND_REQUESTS]));
        Guarded::new(SendDp {
            io,
            bufs,
            ring,
            core: SendCore::new(cfg, driver::warn_failure),
            requests: Requests::new(Side::Send, SEND_REQUESTS),
            started,
            cts_wait_since: None,
            prof: None,
        })
    }

    /// Poll the CQs; completions give back send-queue credits and complete requests.
    fn poll(&mut self) -> Result<bool> {
        self.io.poll(&mut SendSide {
            core: &mut self.core,
            ring: &self.ring,
        })
    }

    /// Decide eager claims, send refused eager messages again, and plan and post the waiting
    /// group if its chains fit now.
    fn progress(&mut self) -> Result<()> {
        let SendDp {
            io, ring, core, prof, ..
        } = self;
        let r = core.progress(ring, clock::now, &mut |p| {
            if let Some(pr) = prof.as_mut() {
                pr.note(&p);
            }
            // SAFETY: the plan names registered user buffers (NCCL keeps them until the
            // request completes) or our FIFO block (lives as long as the QP); remote keys
            // come from the CTS.
            unsafe { io.post(p) }
        });
        if let Some(pr) = prof.as_mut() {
            pr.start_posted(io, core);
        }
        r
    }

    /// No receive buffer to send a `size`-byte message into yet. The receiver's CTS lands in
    /// the FIFO ring's memory, which the next isend reads, so this does not poll the CQ for it
    /// (NCCL's isend does not either: the sends in flight have their completions reaped by the
    /// `test` calls NCCL makes on them). It polls only when a poll may let this message go (an
    /// eager write's completion gives back the slot and credits the eager path waits for), or
    /// when a fatal event hit a device (the poll turns it into the comm's error or a recovery).
    /// A recovery, and a group waiting for credits, were polled for before.
    fn idle(&mut self, size: usize) -> Result<Option<*mut Request>> {
        if self.core.eager_waits_for_completions(size) || self.io.conn.fatal_generation_moved() {
            self.poll()?;
        }
        if self.io.stats.is_some() && self.cts_wait_since.is_none() {
            self.cts_wait_since = Some(clock::now());
        }
        let waiting = |_: &hang::Facts| {
            "the receiver's CTS for the next message: the peer has posted no matching receive (is its proxy thread stuck, or is it waiting for another peer?)".to_string()
        };
        if self.io.idle_probe(&mut self.core.state, waiting)? {
            // Completions that raced with the peer's exit count first.
            self.poll()?;
            return Err(self
                .io
                .fail_peer_gone(&mut self.core.state, "a send waiting for the receiver's buffer"));
        }
        Ok(None)
    }

    /// `None` = the receiver has not posted a matching buffer yet, or all request slots are
    /// in flight; retry later (no side effects).
    /// `phandle`: NCCL's profiler handle (NULL: no events for this send).
    pub(crate) fn isend(
        &mut self,
        data: usize,
        size: usize,
        tag: i32,
        mh: &MemHandle,
        phandle: *mut c_void,
    ) -> Result<Option<*mut Request>> {
        self.core.state.check()?;
        // A recovery moves on in every call NCCL makes, isend too.
        if self.io.recovery.pending() {
            self.poll()?;
        }
        if self.prof.is_none() && !phandle.is_null() && profiler::enabled() {
            self.prof = Some(SendProfiling::new());
        }
        mh.check(data, size, self.io.conn.devs.len())?;
        if self.core.waiting() && self.core.peer_closed().is_none() {
            // The group before this send waits for send-queue credits: reap, post, else retry.
            self.poll()?;
            self.progress()?;
            if self.core.waiting() {
                return self.busy();
            }
        }
        let send = SendBuf {
            data,
            size,
            tag,
            lkeys: mh.lkeys,
            host: mh.host,
        };
        let SendDp {
            io, ring, core, prof, ..
        } = self;
        let started = core.isend(ring, clock::now, send, &mut |p| {
            if let Some(pr) = prof.as_mut() {
                pr.note(&p);
            }
            // SAFETY: as in post_waiting; `data` is covered by `mh` (checked above).
            unsafe { io.post(p) }
        });
        if let (Ok(Isend::Started { idx, .. }), Some(pr)) = (&started, prof.as_mut()) {
            pr.phandles[usize::from(*idx) % SEND_REQUESTS] = phandle;
        }
        if let Some(pr) = prof.as_mut() {
            pr.start_posted(io, core);
        }
        match started? {
            Isend::Started {
                idx,
                truncated_to,
                eager,
            } => {
                if let (true, Some(s)) = (eager, &self.io.stats) {
                    s.eager_sent();
                }
                if let (Some(s), Some(started)) = (&self.io.stats, &mut self.started) {
                    let now = clock::now();
                    started[usize::from(idx) % SEND_REQUESTS] = now;
                    if let Some(since) = self.cts_wait_since.take() {
                        s.cts_waited(stats::since(since, now));
                    }
                }
                if let Some(posted) = truncated_to {
                    crate::log_warn!(
                        "isend of {size} bytes (tag {tag}) into a {posted}-byte receive buffer of {}: truncated to {posted} bytes (NCCL never does this; the receiver and sender disagree on sizes)",
                        self.io.conn.chan.peer()
                    );
                }
                Ok(Some(self.requests.ptr(idx)))
            }
            Isend::NoBuffer => self.idle(size),
            Isend::Busy => self.busy(),
        }
    }

    /// Every request slot in flight, the group before waiting for send-queue credits, or a
    /// recovery of the connection. The first two need nothing from this call: NCCL tests the
    /// sends in flight, whose polls move them on. A recovery waits on the peer's Hello or Ready,
    /// which may come through a comm of this process NCCL is not calling now (after a port
    /// flap on an idle pair this isend may be the only call made), so it waits as every waiting
    /// call does ([`Driver::idle_probe`]: the process's idle comms are stepped, a hang is
    /// WARNed, a closed peer noticed).
    fn busy(&mut self) -> Result<Option<*mut Request>> {
        if !self.io.recovery.active() {
            return Ok(None);
        }
        let waiting = |_: &hang::Facts| {
            "the recovery of the connection: the peer's Hello or Ready over the side channel".to_string()
        };
        if self.io.idle_probe(&mut self.core.state, waiting)? {
            // The side channel closed: the poll reads what the peer said last and fails the
            // comm (a closed peer is an error at once, never a recovery).
            self.poll()?;
        }
        Ok(None)
    }

    /// Progress the comm; report whether send request `req` is done (and reclaim it).
    ///
    /// # Safety
    /// `sizes` is NULL or points to room for one `i32`.
    pub(crate) unsafe fn test(&mut self, req: *const Request, sizes: *mut i32) -> Result<bool> {
        let Some(idx) = self.requests.slot_of(req) else {
            return Err(Error::internal("test: unknown send request"));
        };
        if self.core.state.pool.get(idx).is_none_or(|r| r.kind() == ReqKind::Free) {
            return Err(not_in_flight());
        }
        // A send an earlier call's poll completed is reported without polling again, as NCCL's
        // IB transport looks at the request before its CQ (docs/design/data-path.md, test()):
        // an empty poll is not free, least of all on softroce, whose empty polls yield the CPU.
        if !self.io.recovery.pending() {
            if let Some(size) = self.core.test(idx)? {
                // SAFETY: as this function's.
                unsafe { self.completed(idx, size, sizes) };
                return Ok(true);
            }
        }
        // A send a closed receiver took is done even if the comm failed since (for the sends
        // it never took).
        let progressed = self.poll().and_then(|_| self.progress());
        if let Some(size) = self.core.test(idx)? {
            // SAFETY: as this function's.
            unsafe { self.completed(idx, size, sizes) };
            return Ok(true);
        }
        progressed?;
        if self.core.peer_closed().is_some() {
            // The receiver closed: what it did not take it never will.
            self.core.fail_untaken()?;
        }
        // A posted send to a dead peer fails by itself (transport retries exhausted within
        // NCCL_IB_TIMEOUT × NCCL_IB_RETRY_CNT); a closed side channel alone is not an error while
        // the NIC still carries a chain, because the receiver may close as soon as the data has
        // landed, before our ACK. Without one, what the request waits for only the receiver
        // could send (an eager message's verdict in its CTS): it never comes.
        let (waiting, open, in_flight) = (self.core.waiting(), self.core.group_open(), self.in_flight());
        // What the writes wait for is told apart by the facts the probe gathered (proto::hang).
        let gone = self.io.idle_probe(&mut self.core.state, |facts| {
            let cause = hang::describe(hang::cause(facts));
            if waiting {
                format!("send-queue credits: completions of earlier writes. {cause}")
            } else if open {
                "the other sends of a grouped receive (NCCL has not issued them yet)".to_string()
            } else {
                format!("completions of {in_flight} posted send(s). {cause}")
            }
        })?;
        if gone && !self.io.recovery.pending() && !self.core.chains_in_flight() {
            // Completions and CTS entries that raced with the peer's exit still count.
            self.poll()?;
            self.progress()?;
            if let Some(size) = self.core.test(idx)? {
                // SAFETY: as this function's.
                unsafe { self.completed(idx, size, sizes) };
                return Ok(true);
            }
            if !self.core.chains_in_flight() {
                return Err(self
                    .io
                    .fail_peer_gone(&mut self.core.state, "a send waiting for the receiver's answer"));
            }
        }
        Ok(false)
    }

    /// Send request `idx` completed with `size` bytes: its profiler event ends, its statistics
    /// count, NCCL gets its size.
    ///
    /// # Safety
    /// `sizes` is NULL or points to room for one `i32`.
    unsafe fn completed(&mut self, idx: u16, size: u32, sizes: *mut i32) {
        if let Some(pr) = self.prof.as_mut() {
            pr.events.stop_request(idx);
        }
        if let (Some(s), Some(started)) = (&self.io.stats, &self.started) {
            let t0 = started[usize::from(idx) % SEND_REQUESTS];
            s.message_done(u64::from(size), stats::since(t0, clock::now()));
        }
        if !sizes.is_null() {
            // SAFETY: NCCL passes NULL or room for one int for a send (the caller's contract).
            unsafe { *sizes = size.min(i32::MAX as u32) as i32 };
        }
    }

    /// Requests in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.core.state.pool.in_flight()
    }
}

impl Drop for SendDp {
    /// Every Start gets its Stop, also for requests still in flight at close.
    fn drop(&mut self) {
        if let Some(pr) = self.prof.as_mut() {
            pr.events.stop_all();
        }
    }
}
