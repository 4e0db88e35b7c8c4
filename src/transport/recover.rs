//! The I/O layer of a connection's recovery (`proto::recovery`): the driver feeds the machine
//! failed completions, port events, side-channel messages and the time, and carries out what
//! it asks — stop posting, replace the QPs, exchange them with the peer, connect them, resume
//! the core — with a WARN when the connection loses its QPs and one when it recovered (or gave
//! up).

use super::clock;
use super::driver::{CompletionSink, Driver};
use super::proto::handshake::{EndpointRepr, Message};
use super::proto::plan::Post;
use super::proto::recovery::{Action, Recovery, Role};
use super::proto::recv::RecvCore;
use super::proto::send::{FifoRing, SendCore};
use super::proto::state::CommState;
use super::sidechannel::ChannelError;
use crate::error::{Error, Result};
use crate::ibv::sys;
use std::time::{Duration, Instant};

/// What a recovery needs of a core besides its completions.
pub trait RecoverySink: CompletionSink {
    fn role(&self) -> Role;
    /// Stop posting until [`RecoverySink::resume`].
    fn begin_recovery(&mut self);
    /// Whether `wr_id` is one of the receives the core posted (a QP moved to ERR flushes
    /// each); a sender posts none.
    fn is_receive(&self, _wr_id: u64) -> bool {
        false
    }
    /// Receives posted on QP `qp`.
    fn posted_receives(&self, _qp: usize) -> usize {
        0
    }
    /// What must be posted on new QPs before the Hello (the receiver's receives).
    fn after_rebuild(&mut self, _post: &mut dyn FnMut(Post<'_>) -> Result<()>) -> Result<()> {
        Ok(())
    }
    /// This side's report: the sender's next FIFO entry, the receiver's completions per QP.
    fn report(&self) -> (u64, Vec<u64>);
    /// Carry on over the new QPs with the peer's report; what it did, in words.
    fn resume(&mut self, head: u64, taken: &[u64], post: &mut dyn FnMut(Post<'_>) -> Result<()>) -> Result<String>;
    /// Whether what [`RecoverySink::resume`] posted that the peer must see first has landed.
    fn landed(&self) -> bool {
        true
    }
}

/// How long the receiver waits for its old QPs to flush every receive before it destroys
/// them (each flushed receive proves every completion before it on that QP was taken).
const DRAIN_WAIT: Duration = Duration::from_secs(1);

/// What the peer's Hello said: its epoch, its next FIFO entry (a sender), its completions
/// taken per QP (a receiver), its new QPs.
struct PeerHello {
    epoch: u32,
    head: u64,
    taken: Vec<u64>,
    qps: Box<EndpointRepr>,
}

/// A connection's recovery state, kept by its driver.
pub struct RecoveryIo {
    machine: Recovery,
    /// The peer's last Hello.
    hello: Option<PeerHello>,
    /// A liveness probe saw side-channel bytes: read them at the next poll.
    pub readable: bool,
    /// When the recovery in progress began.
    started: Option<Instant>,
    /// What the last resume did (for the WARN once the connection made progress).
    resumed: Option<String>,
}

impl RecoveryIo {
    pub fn new(role: Role, peer: String) -> RecoveryIo {
        RecoveryIo {
            machine: Recovery::new(role, crate::config::get().recovery_timeout(), peer),
            hello: None,
            readable: false,
            started: None,
            resumed: None,
        }
    }

    /// Whether a recovery ever replaced the QPs (completions of destroyed QPs may arrive).
    pub fn replaced(&self) -> bool {
        self.machine.epoch() > 0
    }

    pub fn enabled(&self) -> bool {
        self.machine.enabled()
    }

    /// Whether the next poll has recovery work: messages to read, a recovery in progress, or
    /// one that has not yet seen a completion.
    pub fn pending(&self) -> bool {
        self.readable || self.machine.active() || self.machine.unproven()
    }

    /// Whether a recovery is in progress (nothing completes until it is over).
    pub fn active(&self) -> bool {
        self.machine.active()
    }
}

/// A completion status a new QP may not meet: the path or the peer's NIC stopped answering
/// (link or port down, a broken path), or the QP was flushed by such a failure. Anything else
/// (a protection or access error, a bad request) would fail again the same way.
pub fn recoverable(status: u32) -> bool {
    use sys::ibv_wc_status as S;
    status == S::IBV_WC_RETRY_EXC_ERR || status == S::IBV_WC_RNR_RETRY_EXC_ERR || status == S::IBV_WC_WR_FLUSH_ERR
}

impl Driver {
    /// The connection lost its QPs (`cause` in words): recover, or fail the comm when
    /// recovery is off or over its bound.
    pub fn local_failure(&mut self, core: &mut impl RecoverySink, cause: &str) -> Result<()> {
        if !self.recovery.machine.active() && !self.recovery.machine.unproven() {
            crate::log_warn!(
                "{} comm with {}: {cause}; recovering over new QPs (both ends replace them and send again what did not arrive; FERROCE_RECOVERY_TIMEOUT_SEC={} bounds it)",
                self.kind,
                self.conn.chan.peer,
                crate::config::get().recovery_timeout().as_secs()
            );
            self.recovery.started = Some(Instant::now());
        }
        let actions = self.recovery.machine.local_failure(clock::now(), cause);
        self.act(core, actions)
    }

    /// Read side-channel messages, move the recovery on with the time, and notice the
    /// receiver's rewrites landing. A closed side channel fails the comm: the peer is gone.
    pub fn recovery_step(&mut self, core: &mut impl RecoverySink) -> Result<()> {
        self.recovery.readable = false;
        loop {
            let got = self.conn.chan.flush().and_then(|_| self.conn.chan.poll_recv());
            let actions = match got {
                Ok(None) => break,
                Ok(Some(Message::RecoverHello {
                    epoch,
                    head,
                    taken,
                    qps,
                })) => {
                    let newer = self.recovery.hello.as_ref().is_none_or(|h| epoch > h.epoch);
                    if newer {
                        self.recovery.hello = Some(PeerHello {
                            epoch,
                            head,
                            taken,
                            qps,
                        });
                    }
                    if !self.recovery.machine.active() && !self.recovery.machine.unproven() {
                        crate::log_warn!(
                            "{} comm with {}: the peer lost its QPs of this connection; recovering over new QPs",
                            self.kind,
                            self.conn.chan.peer
                        );
                        self.recovery.started = Some(Instant::now());
                    }
                    self.recovery.machine.peer_hello(clock::now(), epoch)
                }
                Ok(Some(Message::RecoverReady { epoch })) => self.recovery.machine.peer_ready(epoch),
                Ok(Some(other)) => {
                    return Err(core.state().fail(Error::remote(format!(
                        "the peer {} sent a {} message after the connection was set up: a corrupt or incompatible peer",
                        self.conn.chan.peer,
                        super::proto::setup::kind_name(&other)
                    ))))
                }
                Err(ChannelError::Wire(e)) => {
                    return Err(core.state().fail(Error::remote(format!(
                        "the peer {} sent a malformed side-channel message ({e}): a corrupt or incompatible peer",
                        self.conn.chan.peer
                    ))))
                }
                Err(e) => {
                    let during = if self.recovery.machine.active() {
                        " during a recovery of the connection"
                    } else {
                        ""
                    };
                    return Err(core.state().fail(Error::remote(format!(
                        "the peer {} closed the connection{during} ({e}): the peer process exited, crashed or closed its comm — check the peer's log",
                        self.conn.chan.peer
                    ))));
                }
            };
            self.act(core, actions)?;
        }
        let actions = self.recovery.machine.tick(clock::now());
        self.act(core, actions)?;
        if self.recovery.machine.landing() && core.landed() {
            let epoch = self.recovery.machine.epoch();
            let actions = self.recovery.machine.landed(epoch);
            self.act(core, actions)?;
        }
        Ok(())
    }

    /// A completion of a new QP arrived: the recovery worked.
    pub fn recovery_progressed(&mut self) {
        if !self.recovery.machine.unproven() {
            return;
        }
        self.recovery.machine.progressed();
        let took = self.recovery.started.take().map_or(Duration::ZERO, |t| t.elapsed());
        crate::log_warn!(
            "{} comm with {}: recovered over new QPs (local QPNs {}) in {} ms, {} attempt(s) so far in this comm; {}",
            self.kind,
            self.conn.chan.peer,
            self.conn
                .qps
                .iter()
                .map(|q| format!("{:#x}", q.qp.qpn()))
                .collect::<Vec<_>>()
                .join(","),
            took.as_millis(),
            self.recovery.machine.attempts,
            self.recovery.resumed.take().unwrap_or_default()
        );
    }

    fn act(&mut self, core: &mut impl RecoverySink, actions: Vec<Action>) -> Result<()> {
        let mut todo: std::collections::VecDeque<Action> = actions.into();
        while let Some(a) = todo.pop_front() {
            match a {
                Action::Pause => core.begin_recovery(),
                Action::Rebuild { epoch } => {
                    core.begin_recovery();
                    match self.rebuild(core) {
                        Ok(()) => todo.extend(self.recovery.machine.rebuilt(epoch)),
                        Err(e) => todo.extend(self.recovery.machine.attempt_failed(clock::now(), &e.message)),
                    }
                }
                Action::SendHello { epoch } => {
                    let (head, taken) = core.report();
                    let qps = Box::new(self.conn.qps_record());
                    self.conn.chan.queue(&Message::RecoverHello {
                        epoch,
                        head,
                        taken,
                        qps,
                    });
                    self.flush_channel(core)?;
                }
                Action::Connect { epoch } => {
                    let Some(h) = self.recovery.hello.as_ref().filter(|h| h.epoch == epoch) else {
                        return Err(core
                            .state()
                            .fail(Error::internal("recovery: connect without the peer's Hello")));
                    };
                    let peer = h.qps.clone();
                    match self.conn.connect_new_qps(&peer) {
                        Ok(()) => todo.extend(self.recovery.machine.connected(epoch)),
                        Err(e) => todo.extend(self.recovery.machine.attempt_failed(clock::now(), &e.message)),
                    }
                }
                Action::SendReady { epoch } => {
                    self.conn.chan.queue(&Message::RecoverReady { epoch });
                    self.flush_channel(core)?;
                }
                Action::Resume { epoch } => {
                    let Some(h) = self.recovery.hello.as_ref().filter(|h| h.epoch == epoch) else {
                        return Err(core
                            .state()
                            .fail(Error::internal("recovery: resume without the peer's Hello")));
                    };
                    let (head, taken) = (h.head, h.taken.clone());
                    // SAFETY: the chains name the registered buffers of sends still in flight
                    // (NCCL keeps them until the request completes) or our own blocks.
                    let said = core.resume(head, &taken, &mut |p| unsafe { self.post(p) })?;
                    self.recovery.resumed = Some(said);
                    if self.recovery.machine.landing() && core.landed() {
                        todo.extend(self.recovery.machine.landed(epoch));
                    }
                }
                Action::Fail(e) => {
                    let took = self.recovery.started.map_or(Duration::ZERO, |t| t.elapsed());
                    return Err(core.state().fail(e.context(format!(
                        "{} comm with {} (tried {} ms)",
                        self.kind,
                        self.conn.chan.peer,
                        took.as_millis()
                    ))));
                }
            }
        }
        Ok(())
    }

    fn flush_channel(&mut self, core: &mut impl RecoverySink) -> Result<()> {
        match self.conn.chan.flush() {
            Ok(_) => Ok(()),
            Err(e) => Err(core.state().fail(Error::remote(format!(
                "the peer {} closed the connection during a recovery ({e}): the peer process exited, crashed or closed its comm",
                self.conn.chan.peer
            )))),
        }
    }

    /// Replace the connection's QPs. The receiver first moves its old ones to ERR and takes
    /// every completion they hold (until each posted receive flushed, bounded): a message the
    /// sender saw acknowledged must be one it reports taken.
    fn rebuild(&mut self, core: &mut impl RecoverySink) -> Result<()> {
        let receives: Vec<usize> = (0..self.conn.qps.len()).map(|q| core.posted_receives(q)).collect();
        let mut flushed = vec![0usize; receives.len()];
        if receives.iter().any(|&r| r > 0) {
            for q in &self.conn.qps {
                // A QP already in ERR stays there; refusing is no reason to stop.
                let _ = q.qp.to_error();
            }
        }
        let end = Instant::now() + DRAIN_WAIT;
        loop {
            let mut any = false;
            let Driver { conn, wcs, .. } = &mut *self;
            for d in conn.devs.iter() {
                let Ok(got) = d.cq.poll(wcs) else { continue };
                any |= !got.is_empty();
                for wc in got.iter() {
                    let Some(q) = conn.qps.iter().position(|q| q.qp.qpn() == wc.qp_num()) else {
                        continue;
                    };
                    match wc.result() {
                        Ok(c) => core.handle_ok(wc.wr_id(), c.imm),
                        Err(_) if core.is_receive(wc.wr_id()) => flushed[q] += 1,
                        Err(_) => {}
                    }
                }
            }
            let drained = flushed.iter().zip(&receives).all(|(f, r)| f >= r);
            if drained || (!any && Instant::now() >= end) {
                break;
            }
            if !any {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        // Destroyed, then every completion they left in the CQs dropped, then the new ones
        // made: no completion of an old QP can be taken for a new one (a provider may give a
        // new QP a destroyed one's number).
        let remote = self.conn.destroy_qps();
        let Driver { conn, wcs, .. } = &mut *self;
        for d in conn.devs.iter() {
            while d.cq.poll(wcs).is_ok_and(|got| !got.is_empty()) {}
        }
        self.conn.create_qps_again(remote)?;
        self.conn.accept_port_errors();
        // SAFETY: zero-SGE receives name no memory.
        core.after_rebuild(&mut |p| unsafe { self.post(p) })
    }
}

impl RecoverySink for RecvCore {
    fn role(&self) -> Role {
        Role::Receiver
    }
    fn begin_recovery(&mut self) {
        RecvCore::begin_recovery(self)
    }
    fn is_receive(&self, wr_id: u64) -> bool {
        RecvCore::is_receive(wr_id)
    }
    fn posted_receives(&self, qp: usize) -> usize {
        RecvCore::posted_receives(self, qp)
    }
    fn after_rebuild(&mut self, post: &mut dyn FnMut(Post<'_>) -> Result<()>) -> Result<()> {
        self.repost_receives(&mut |p| post(p))
    }
    fn report(&self) -> (u64, Vec<u64>) {
        (0, self.taken())
    }
    fn resume(&mut self, head: u64, _taken: &[u64], post: &mut dyn FnMut(Post<'_>) -> Result<()>) -> Result<String> {
        let n = RecvCore::resume(self, head, &mut |p| post(p))?;
        Ok(format!("CTS entries written again: {n}"))
    }
    fn landed(&self) -> bool {
        self.rewrites_landed()
    }
}

/// The sender's core with its FIFO ring (a replay reads the CTS entries of the sends in
/// flight there).
pub struct SendSide<'a, R: FifoRing> {
    pub core: &'a mut SendCore,
    pub ring: &'a R,
}

impl<R: FifoRing> CompletionSink for SendSide<'_, R> {
    fn state(&mut self) -> &mut CommState {
        &mut self.core.state
    }
    fn handle_ok(&mut self, wr_id: u64, _imm: Option<u32>) {
        self.core.handle_completion(wr_id);
    }
    fn describe(&self, wr_id: u64) -> (&'static str, usize) {
        self.core.describe(wr_id)
    }
}

impl<R: FifoRing> RecoverySink for SendSide<'_, R> {
    fn role(&self) -> Role {
        Role::Sender
    }
    fn begin_recovery(&mut self) {
        self.core.begin_recovery()
    }
    fn report(&self) -> (u64, Vec<u64>) {
        (self.core.fifo_head(), Vec::new())
    }
    fn resume(&mut self, _head: u64, taken: &[u64], post: &mut dyn FnMut(Post<'_>) -> Result<()>) -> Result<String> {
        let r = self.core.resume(self.ring, taken, &mut |p| post(p))?;
        Ok(format!(
            "chains posted again: {} ({} bytes); taken by the receiver but not acknowledged: {}",
            r.chains, r.bytes, r.landed
        ))
    }
}
