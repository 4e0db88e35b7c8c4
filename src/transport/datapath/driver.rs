//! The I/O layer under one comm's core: posts the work requests the core plans, polls every CQ
//! of the comm and feeds successful completions back, turns the first failed one into the
//! comm's error (one WARN that names device, QP, peer and what to check), and notices a dead
//! peer or a failed NIC when nothing completes.

use super::completion_errors::{wc_error, WcErrorReport};
use super::describe::describe_connection;
use super::sink::{CompletionSink, RecoverySink};
use super::wr_monitor::WrMonitor;
use crate::error::{Error, Result};
use crate::ibv::cq::Failed;
use crate::ibv::{sys, QueuePair, WorkCompletion};
use crate::transport::conn::{Conn, FatalKind};
use crate::transport::proto::handshake::CLOSE_VERSION;
use crate::transport::proto::hang::{self, QpEvents};
use crate::transport::proto::plan::{Op, Post, WorkRequest};
use crate::transport::proto::recovery::Role;
use crate::transport::proto::recv::RQ_BATCH;
use crate::transport::proto::state::CommState;
use crate::transport::recovery::{self, RecoveryIo};
use crate::transport::sidechannel::Peek;
use crate::transport::stats::{self, CommStats};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod hang_report;

/// Completions taken per `ibv_poll_cq` call (NCCL takes 4; the loop goes on while a batch
/// comes back full). Each comm keeps this many `ibv_wc` (48 bytes each).
const POLL_BATCH: usize = 8;
/// WRs one `ibv_post_send` of a sender carries: a full group of single-piece buffers and its
/// completion write (so every message NCCL posts, ≤ 1 GiB, is one post per QP).
const POST_BATCH: usize = crate::transport::proto::limits::MAX_RECVS + 1;
/// Idle calls between two liveness probes (each probe reads the clock first).
const PROBE_EVERY: u32 = 64;
/// Minimum time between two probe syscalls.
const PROBE_INTERVAL: Duration = Duration::from_millis(50);

/// The cores' [`crate::transport::proto::state::FailureReport`]: the comm's first fatal error, WARNed.
pub fn warn_failure(e: &Error) {
    crate::log_warn!("{e}");
}

/// Fill `wr` (and its `sges`) from the core's plan. `next` is left NULL. A prefix is the
/// first SGE and points into `plan` itself, so `plan` must outlive the post (the WR is inline:
/// the NIC copies its bytes during `ibv_post_send`).
pub fn to_ibv(plan: &WorkRequest, wr: &mut sys::ibv_send_wr, sges: &mut [sys::ibv_sge; 2]) {
    // SAFETY: ibv_send_wr is plain data (integers, pointers, unions of them); zero is valid.
    *wr = unsafe { std::mem::zeroed() };
    wr.wr_id = plan.wr_id;
    let mut n = 0;
    if let Some(p) = &plan.prefix {
        sges[n] = sys::ibv_sge {
            addr: p.as_ptr() as u64,
            length: p.len() as u32,
            lkey: 0,
        };
        n += 1;
    }
    if let Some(s) = plan.local {
        sges[n] = sys::ibv_sge {
            addr: s.addr,
            length: s.len,
            lkey: s.lkey,
        };
        n += 1;
    }
    if n > 0 {
        wr.sg_list = sges.as_mut_ptr();
        wr.num_sge = n as i32;
    }
    wr.opcode = match plan.op {
        Op::Write => sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        Op::WriteImm(imm) => {
            wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
        }
        Op::Read => sys::ibv_wr_opcode::IBV_WR_RDMA_READ,
    };
    let mut flags = 0;
    if plan.signaled {
        flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    if plan.inline {
        flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
    }
    wr.send_flags = flags;
    wr.wr.rdma = sys::rdma_t {
        remote_addr: plan.remote.addr,
        rkey: plan.remote.rkey,
    };
}

/// Post one planned chain on `qp` with the driver's scratch WRs.
///
/// # Safety
/// Every local buffer the plan names is registered and stays valid until the chain's
/// completion is polled (NCCL keeps its buffers until the request completes; our own blocks
/// live as long as the QP); the remote keys are the peer's.
pub unsafe fn post_chain(
    qp: &QueuePair,
    chain: &[WorkRequest],
    wrs: &mut [sys::ibv_send_wr],
    sges: &mut [[sys::ibv_sge; 2]],
) -> Result<()> {
    let batch = wrs.len().min(sges.len());
    if batch == 0 && !chain.is_empty() {
        return Err(Error::internal("a chain of work requests for no WR slots"));
    }
    // A chain longer than the scratch (a message cut into many pieces) goes in several posts:
    // the QP executes them in order all the same, and only the chain's last WR is signaled.
    for part in chain.chunks(batch.max(1)) {
        let k = part.len();
        for x in 0..k {
            to_ibv(&part[x], &mut wrs[x], &mut sges[x]);
        }
        for x in 0..k - 1 {
            let next: *mut sys::ibv_send_wr = &mut wrs[x + 1];
            wrs[x].next = next;
        }
        wrs[k - 1].next = std::ptr::null_mut();
        // SAFETY: the part lives in `wrs`/`sges` for the call; buffers as the caller guarantees.
        unsafe { qp.post_send(&mut wrs[0])? };
    }
    Ok(())
}

/// What one sweep of a comm's CQs found.
#[derive(Default)]
struct Polled {
    progressed: bool,
    /// The comm's failure (a completion error a recovery cannot cure, a failed poll).
    error: Option<Error>,
    /// That error is a flushed WR with no cause found among the completions.
    only_flushed: bool,
    /// The first link-caused failure, and whether it was only flushed WRs.
    lost: Option<(String, bool)>,
    /// The member devices whose QPs ran out of retries (their paths stopped answering).
    path_failed: Vec<usize>,
}

/// One comm's verbs side: its connection and the scratch its posts and polls use.
pub struct Driver {
    /// First field: dropped (QPs destroyed) before anything the QPs point into.
    pub conn: Conn,
    /// "send" or "recv", for logs.
    pub(crate) kind: &'static str,
    /// Recovery of the connection when its QPs fail ([`steps`](crate::transport::recovery::steps)).
    pub(crate) recovery: RecoveryIo,
    /// Counters and histograms when statistics are on (FERROCE_STATS, NCCL_DEBUG=INFO).
    pub stats: Option<Arc<CommStats>>,
    /// The work-request latency monitor, when NCCL_IB_WQE_LATENCY_* ask for one.
    pub(crate) wr_mon: Option<Box<WrMonitor>>,
    /// Work requests posted and completions polled (for hang reports; always counted).
    wrs_posted: u64,
    completions: u64,
    /// `ibv_poll_cq` calls of the data path's sweeps of the comm's CQs (always counted: tests
    /// count them).
    pub(crate) cq_polls: u64,
    idle: u32,
    last_probe: Instant,
    /// Since when nothing completed while the comm was asked for progress (read at probes).
    idle_since: Option<Instant>,
    /// The last hang WARN of this comm.
    hang_warned: Option<Instant>,
    /// The QPs' transport events when the wait began (where the NIC counts them).
    wait_events: Option<QpEvents>,
    pub(crate) wcs: [WorkCompletion; POLL_BATCH],
}

impl Driver {
    /// The driver of a connection just set up (`kind`: "send" or "recv"): logs the
    /// connection's INFO line, as NCCL's IB transport does.
    /// `note` ends that line (the sender's adaptive routing), when not empty.
    pub fn new(conn: Conn, kind: &'static str, note: &str) -> Driver {
        crate::log_info!(crate::log::subsys::NET, "{}{note}", describe_connection(&conn, kind));
        let devices = conn.devs.iter().map(|d| d.dev.label()).collect::<Vec<_>>().join("+");
        let qpns: Vec<u32> = conn.qps.iter().map(|q| q.qp.qpn()).collect();
        let stats = stats::for_comm(kind, conn.chan.peer().to_string(), devices, &qpns);
        let role = if kind == "send" { Role::Sender } else { Role::Receiver };
        let recovery = RecoveryIo::new(role, conn.chan.peer().to_string());
        Driver {
            conn,
            kind,
            recovery,
            stats,
            wr_mon: super::wr_monitor::for_comm(qpns.len()),
            wrs_posted: 0,
            completions: 0,
            cq_polls: 0,
            idle: 0,
            last_probe: Instant::now(),
            idle_since: None,
            hang_warned: None,
            wait_events: None,
            wcs: std::array::from_fn(|_| WorkCompletion::default()),
        }
    }

    /// Post what the core planned on the connection's QPs (`Post::Flush` is not theirs), or
    /// deliver an eager message (`Post::Deliver`, a copy by the CPU).
    ///
    /// # Safety
    /// As [`post_chain`]: every buffer the plan names stays registered and valid until its
    /// completion is polled. A delivery's source lies in this comm's landing ring and its
    /// destination in a host buffer NCCL posted and keeps until the receive completes.
    pub unsafe fn post(&mut self, p: Post<'_>) -> Result<()> {
        match p {
            Post::Send { qp, chain } => {
                let q = Self::qp(&self.conn, qp)?;
                self.wrs_posted += chain.len() as u64;
                if let Some(s) = &self.stats {
                    s.posted(qp, chain.len(), chain.iter().map(|w| w.len() as u64).sum());
                }
                // The WRs of one post on the stack, not in the comm (memory per connection):
                // a sender's group of single-piece buffers ([`POST_BATCH`] WRs; longer chains
                // go in several posts), a receiver's CTS write.
                // SAFETY: ibv_send_wr and ibv_sge are plain data; zero is an empty value.
                let mut wrs: [sys::ibv_send_wr; POST_BATCH] = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                let mut sges: [[sys::ibv_sge; 2]; POST_BATCH] = unsafe { std::mem::zeroed() };
                if let Some(m) = &mut self.wr_mon {
                    m.posted(qp, chain);
                }
                // SAFETY: as the caller guarantees.
                let posted = unsafe { post_chain(q, chain, &mut wrs, &mut sges) };
                posted.map_err(|e| self.post_failure(e))
            }
            Post::Recv { qp, wr_id, count } => {
                let k = count;
                if k == 0 || k > RQ_BATCH {
                    return Err(Error::internal(format!(
                        "{count} receives planned in one post (at most {RQ_BATCH})"
                    )));
                }
                if let Some(s) = &self.stats {
                    s.posted(qp, k, 0);
                }
                // On the stack, not in the comm: a receive post is rare (one per RQ_BATCH
                // messages) and memory per connection is what scales.
                let mut wrs = [sys::ibv_recv_wr {
                    wr_id,
                    next: std::ptr::null_mut(),
                    sg_list: std::ptr::null_mut(),
                    num_sge: 0,
                }; RQ_BATCH];
                for x in 0..k - 1 {
                    let next: *mut sys::ibv_recv_wr = &mut wrs[x + 1];
                    wrs[x].next = next;
                }
                // SAFETY: zero-SGE receives name no memory; the chain lives in `wrs` for the
                // call and the provider copies it.
                let posted = unsafe { Self::qp(&self.conn, qp)?.post_recv(&mut wrs[0]) };
                posted.map_err(|e| self.post_failure(e))
            }
            Post::Flush { .. } => Err(Error::internal("a flush read planned for a data QP")),
            Post::Deliver { src, dst, len } => {
                if let Some(s) = &self.stats {
                    s.eager_delivered(len as u64);
                }
                // SAFETY: as the caller guarantees: `src..src+len` is in our landing ring (its
                // write with immediate completed, so the bytes are there), `dst..dst+len` in a
                // host buffer covered by the receive's memory handle; they do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(src as usize as *const u8, dst as usize as *mut u8, len) };
                Ok(())
            }
        }
    }

    /// A post the provider refused: a dead NIC refuses every post (EIO), and its async event
    /// says why better than the errno does.
    fn post_failure(&mut self, e: Error) -> Error {
        flush_cause_event(&mut self.conn).map_or(e, |(e, _)| e)
    }

    fn qp(conn: &Conn, i: usize) -> Result<&QueuePair> {
        conn.qps
            .get(i)
            .map(|q| &q.qp)
            .ok_or_else(|| Error::internal(format!("QP index {i} outside the connection")))
    }

    /// Poll every CQ until empty, handing each successful completion to `core`. Returns
    /// whether anything completed. A failed completion the link may have caused (retries
    /// exceeded, a flush) starts a recovery when it is on; any other fails the comm.
    pub fn poll(&mut self, core: &mut impl RecoverySink) -> Result<bool> {
        core.state().check()?;
        // The receiver closed and settled every chain (docs/design/data-path.md#closing): what
        // its destroyed QPs make of our retransmissions is no news, and a recovery that began
        // before its report arrived has nothing left to carry over.
        if core.peer_closed() {
            return Ok(false);
        }
        if self.recovery.pending() {
            self.recovery_step(core)?;
        }
        if core.peer_closed() {
            return Ok(false);
        }
        // Busy or idle, a comm notices a fatal event at its next call (one load per device
        // while nothing happened), even while its completions keep coming (a CQ overrun).
        if let Some((e, kind)) = fatal_event_error(&mut self.conn) {
            if kind == FatalKind::Port && self.recovery.enabled() {
                self.conn.accept_port_errors();
                self.local_failure(core, "a port of the connection went down (IBV_EVENT_PORT_ERR)")?;
            } else {
                return Err(core.state().fail(e));
            }
        }
        if !self.recovery.pending() && self.recovery.enabled() {
            if let Some(cause) = self.conn.member_back() {
                self.local_failure(core, &cause)?;
            }
        }
        let Polled {
            progressed,
            error,
            only_flushed,
            lost,
            path_failed,
        } = self.take_completions(core);
        if (error.is_some() || lost.is_some()) && self.closed_by_peer(core)? {
            return Ok(true);
        }
        // Retries that ran out while the peer was already replacing its QPs (its Hello is
        // here, or this end is recovering) say nothing about the path.
        let peer_first =
            || self.recovery.active() || self.conn.chan.peek() == crate::transport::sidechannel::Peek::Data;
        if !path_failed.is_empty() && !peer_first() {
            for dev in path_failed {
                self.conn.note_path_failure(dev);
            }
        }
        if let Some(mut e) = error {
            if only_flushed {
                // No error completion: the NIC moved the QP to ERR by itself (QP fatal, device
                // fatal); its async event says why.
                e = flush_cause_event(&mut self.conn).map_or(e, |(e, _)| e);
            }
            return Err(core.state().fail(e));
        }
        if let Some((cause, only_flushes)) = lost {
            // Only flushed WRs: the NIC moved the QP to ERR by itself; a QP-fatal or device
            // event says why, and fails the comm (a port event is recovered from).
            if only_flushes {
                if let Some((e, kind)) = flush_cause_event(&mut self.conn) {
                    if kind != FatalKind::Port {
                        return Err(core.state().fail(e));
                    }
                    self.conn.accept_port_errors();
                }
            }
            self.local_failure(core, &cause)?;
        } else if progressed && !self.recovery.active() {
            self.recovery_progressed();
        }
        if progressed {
            self.idle = 0;
            self.idle_since = None;
        }
        Ok(progressed)
    }

    /// Poll every CQ until empty (or the first failure that is not the link's).
    fn take_completions(&mut self, core: &mut impl RecoverySink) -> Polled {
        let mut polled = Polled::default();
        let replaced = self.recovery.replaced();
        let recovering = self.recovery.enabled();
        let Driver {
            conn,
            wcs,
            stats,
            completions,
            cq_polls,
            recovery: rio,
            wr_mon,
            kind,
            ..
        } = self;
        let polls_before = *cq_polls;
        let mut now = None;
        'devs: for (di, d) in conn.devs.iter().enumerate() {
            loop {
                *cq_polls += 1;
                let got = match d.cq.poll(wcs) {
                    Ok(g) => g,
                    Err(e) => {
                        polled.error = Some(e);
                        break 'devs;
                    }
                };
                if got.is_empty() {
                    break;
                }
                polled.progressed = true;
                let full = got.len() == POLL_BATCH;
                *completions += got.len() as u64;
                for wc in got {
                    // A completion of a QP a recovery destroyed.
                    if replaced && conn.qp_by_num(di, wc.qp_num()).is_none() {
                        continue;
                    }
                    if let Some(s) = stats {
                        s.completed(conn.qp_index(di, wc.qp_num()), wc.result().is_ok());
                    }
                    if let Some(m) = wr_mon {
                        let qp = conn.qp_index(di, wc.qp_num());
                        m.completed(conn, qp, wc.wr_id(), &mut now, stats.as_deref(), kind);
                    }
                    match wc.result() {
                        Ok(c) => core.handle_ok(wc.wr_id(), c.imm),
                        Err(f) if recovering && recovery::recoverable(f.status) => {
                            note_link_failure(conn, rio, core, di, wc.wr_id(), &f, &mut polled);
                        }
                        Err(f) => {
                            let (op, bytes) = core.describe(wc.wr_id());
                            let mut e = report(conn, di, &f, op, bytes);
                            if f.status == sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                                // A flushed WR is a consequence; look for the cause.
                                match root_cause(conn, wcs, core) {
                                    Some(cause) => e = cause,
                                    None => polled.only_flushed = true,
                                }
                            }
                            polled.error = Some(e);
                            break 'devs;
                        }
                    }
                }
                if !full {
                    break;
                }
            }
        }
        if let Some(s) = stats {
            s.cq_polled(*cq_polls - polls_before);
        }
        polled
    }

    /// Called when a request is not done yet: every so often, check whether the peer's side
    /// channel is still open (fatal NIC events are looked for on every [`Driver::poll`]). Returns `Ok(true)` when
    /// the peer is gone; the caller polls once more (completions that raced with the peer's
    /// exit still count) and then calls [`Driver::fail_peer_gone`]. When nothing completed
    /// for FERROCE_HANG_WARN_SEC, WARNs (once per interval) what the comm waits for, in the
    /// words `waiting_for` gives from the facts gathered ([`hang::Facts`]).
    pub fn idle_probe(
        &mut self,
        state: &mut CommState,
        waiting_for: impl FnOnce(&hang::Facts) -> String,
    ) -> Result<bool> {
        state.check()?;
        self.idle = self.idle.wrapping_add(1);
        if !self.idle.is_multiple_of(PROBE_EVERY) {
            return Ok(false);
        }
        let now = Instant::now();
        if now.duration_since(self.last_probe) < PROBE_INTERVAL {
            return Ok(false);
        }
        self.last_probe = now;
        let peek = self.conn.chan.peek();
        self.check_hang(now, peek == Peek::Gone, waiting_for);
        if let Some(m) = &mut self.wr_mon {
            m.check_stalls(&self.conn, self.stats.as_deref(), self.kind);
        }
        // While this comm waits, the process's comms NCCL is not calling move on (their
        // peers' recoveries may be what this one waits for).
        super::watch::step_idle_comms();
        match peek {
            Peek::Gone => Ok(true),
            // A recovery message: the next poll reads it.
            Peek::Data => {
                self.recovery.readable = true;
                Ok(false)
            }
            Peek::Nothing => {
                if !self.conn.probes.is_empty() && !self.recovery.pending() {
                    self.probe_standbys(now);
                }
                Ok(false)
            }
        }
    }

    /// For a round of `watch` (NCCL has not called the comm for a while): whether a poll would move
    /// anything on — a recovery in progress, or a side-channel message waiting (then marked
    /// for the poll to read). A closed channel is left to NCCL's next call to report.
    pub fn wants_idle_step(&mut self) -> bool {
        if self.recovery.pending() {
            return true;
        }
        if self.conn.chan.peek() == Peek::Data {
            self.recovery.readable = true;
            return true;
        }
        false
    }

    /// After a failed completion: whether the receiver closed and said what it took (wire
    /// version 7), its report waiting on the side channel. It is sent before the receiver's
    /// QPs go, so it is there before the retries of a write whose acknowledgement was lost run
    /// out against them; then the failure is the close's consequence, not the comm's.
    fn closed_by_peer(&mut self, core: &mut impl RecoverySink) -> Result<bool> {
        if core.peer_closed() {
            return Ok(true);
        }
        // Only a sender is told (a receiver's failures are its own).
        let version = self.conn.chan.version();
        if self.kind != "send" || version < CLOSE_VERSION || self.conn.chan.peek() != Peek::Data {
            return Ok(false);
        }
        self.recovery_step(core)?;
        Ok(core.peer_closed())
    }

    /// Fail the comm because the peer closed its side channel.
    pub fn fail_peer_gone(&self, state: &mut CommState, what: &str) -> Error {
        state.fail(Error::remote(format!(
            "the peer {} closed the connection while {what} was in flight (the peer process exited, crashed or closed its comm) — check the peer's log",
            self.conn.chan.peer()
        )))
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(s) = &self.stats {
            stats::close(s);
        }
    }
}

/// The comm's error when a fatal async event hit one of its devices, ports, QPs or CQs since
/// it last looked (NCCL_IB_RETURN_ASYNC_EVENTS=0: never), and what it hit. Asked on every poll:
/// one inlined load per member device while nothing happened.
#[inline]
fn fatal_event_error(conn: &mut Conn) -> Option<(Error, FatalKind)> {
    if !conn.fatal_generation_moved() {
        return None;
    }
    fatal_event_moved(conn)
}

/// [`fatal_event_error`] once a generation moved.
#[cold]
fn fatal_event_moved(conn: &mut Conn) -> Option<(Error, FatalKind)> {
    if !crate::config::get().return_async_events {
        return None;
    }
    // Nothing is formatted (or allocated) unless the event is this comm's.
    let (device, kind) = conn.new_fatal_event().map(|(d, kind)| (d.dev.label(), kind))?;
    let e = Error::system(format!(
        "device {device} reported a fatal asynchronous event for this connection, its port or the whole NIC (see the WARN above); the connection to {} cannot continue",
        conn.chan.peer()
    ));
    Some((e, kind))
}

/// How long a flushed WR with no error completion (or a refused post) waits for the async
/// event that explains it (the NIC raises the event and flushes the QP at about the same time).
const FLUSH_EVENT_WAIT: Duration = Duration::from_millis(200);

/// After WRs flushed with no error completion among them, or a post the provider refused: the
/// NIC may have moved the QP to ERR or died by itself; wait briefly for the async event saying
/// why, and report that.
fn flush_cause_event(conn: &mut Conn) -> Option<(Error, FatalKind)> {
    let end = Instant::now() + FLUSH_EVENT_WAIT;
    loop {
        if let Some(e) = fatal_event_error(conn) {
            return Some(e);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// After a flushed WR: drain the CQs (bounded) for the error that moved the QP to ERR.
fn root_cause(conn: &Conn, wcs: &mut [WorkCompletion; POLL_BATCH], core: &impl CompletionSink) -> Option<Error> {
    for _ in 0..64 {
        let mut any = false;
        for (di, d) in conn.devs.iter().enumerate() {
            let Ok(got) = d.cq.poll(wcs) else { continue };
            any |= !got.is_empty();
            for wc in got {
                if let Err(f) = wc.result() {
                    if f.status != sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                        let (op, bytes) = core.describe(wc.wr_id());
                        return Some(report(conn, di, &f, op, bytes));
                    }
                }
            }
        }
        if !any {
            break;
        }
    }
    None
}

/// A failed completion of work request `wr_id` on local member `di` that a recovery can cure
/// (the link's failure, not the comm's): a receive it ended need not be drained again, a
/// member whose QP ran out of retries has a broken path, and the first such failure (a real
/// error before a flushed WR) is the one the recovery's WARN names.
fn note_link_failure(
    conn: &Conn,
    rio: &mut RecoveryIo,
    core: &impl RecoverySink,
    di: usize,
    wr_id: u64,
    f: &Failed,
    polled: &mut Polled,
) {
    let flush = f.status == sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
    // A receive this poll took that the rebuild's drain then need not wait for.
    if core.is_receive(wr_id) {
        if let Some(q) = conn.qp_index(di, f.qp_num) {
            if rio.receives_ended.len() <= q {
                rio.receives_ended.resize(q + 1, 0);
            }
            rio.receives_ended[q] += 1;
        }
    }
    if f.status == sys::ibv_wc_status::IBV_WC_RETRY_EXC_ERR && !polled.path_failed.contains(&di) {
        polled.path_failed.push(di);
    }
    if polled.lost.as_ref().is_none_or(|l| l.1 && !flush) {
        let (op, bytes) = core.describe(wr_id);
        polled.lost = Some((report(conn, di, f, op, bytes).message, flush));
    }
}

/// The WARN of failed completion `f`, polled from the CQ of local member `ldev`.
fn report(conn: &Conn, ldev: usize, f: &Failed, op: &str, bytes: usize) -> Error {
    let qp = conn.qp_by_num(ldev, f.qp_num);
    let dev = &conn.devs[ldev.min(conn.devs.len() - 1)].dev;
    let peer_gid = qp
        .and_then(|q| conn.peer.devs.get(q.remote_dev))
        .or_else(|| conn.peer.devs.first())
        .map_or([0; 16], |d| d.gid);
    let status_str = dev.verbs().wc_status_str(f.status);
    wc_error(&WcErrorReport {
        device: &dev.name,
        port: dev.port,
        local_gid: &dev.gid,
        peer_gid: &peer_gid,
        peer_addr: &conn.chan.peer().to_string(),
        qp_num: f.qp_num,
        operation: op,
        bytes,
        status: f.status,
        status_str: &status_str,
        vendor_err: f.vendor_err,
    })
}
