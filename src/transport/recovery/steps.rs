//! The I/O layer of a connection's recovery (`proto::recovery`): the driver feeds the machine
//! failed completions, port events, side-channel messages and the time, and carries out what
//! it asks — stop posting, replace the QPs, exchange them with the peer, connect them, resume
//! the core — with a WARN when the connection loses its QPs and one when it recovered (or gave
//! up).

use super::PeerHello;
use crate::error::{Error, Result};
use crate::transport::clock;
use crate::transport::datapath::driver::Driver;
use crate::transport::datapath::sink::RecoverySink;
use crate::transport::proto::handshake::{Message, WireError};
use crate::transport::proto::recovery::Action;
use crate::transport::sidechannel::ChannelError;
use std::time::{Duration, Instant};

/// How long the receiver waits for its old QPs to flush every receive before it destroys
/// them (each flushed receive proves every completion before it on that QP was taken).
const DRAIN_WAIT: Duration = Duration::from_secs(1);

impl Driver {
    /// The connection lost its QPs (`cause` in words): recover, or fail the comm when
    /// recovery is off or over its bound.
    pub fn local_failure(&mut self, core: &mut impl RecoverySink, cause: &str) -> Result<()> {
        self.note_loss(&format!(
            "{cause}; recovering over new QPs (both ends replace them and send again what did not arrive; FERROCE_RECOVERY_TIMEOUT_SEC={} bounds it)",
            crate::config::get().recovery_timeout().as_secs()
        ));
        let actions = self.recovery.machine.local_failure(clock::now(), cause);
        self.act(core, actions)
    }

    /// The WARN that a recovery begins (`what` happened), once per recovery, and its start.
    fn note_loss(&mut self, what: &str) {
        if self.recovery.machine.active() || self.recovery.machine.unproven() {
            return;
        }
        crate::log_warn!("{} comm with {}: {what}", self.kind, self.conn.chan.peer());
        self.recovery.started = Some(Instant::now());
    }

    /// The comm's error when its peer closed the side channel (`e`): the peer is gone.
    fn peer_closed(&self, core: &mut impl RecoverySink, e: &ChannelError) -> Error {
        let during = if self.recovery.machine.active() {
            " during a recovery of the connection"
        } else {
            ""
        };
        core.state().fail(Error::remote(format!(
            "the peer {} closed the connection{during} ({e}): the peer process exited, crashed or closed its comm — check the peer's log",
            self.conn.chan.peer()
        )))
    }

    /// Read side-channel messages, move the recovery on with the time, and notice the
    /// receiver's rewrites landing. A closed side channel fails the comm: the peer is gone.
    pub fn recovery_step(&mut self, core: &mut impl RecoverySink) -> Result<()> {
        self.recovery.readable = false;
        // A channel the peer closed: what it said before (its close report) is read first.
        let flushed = match self.conn.chan.flush() {
            Err(ChannelError::Wire(e)) => return Err(self.malformed(core, &e)),
            other => other,
        };
        loop {
            let actions = match self.conn.chan.poll_recv() {
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
                    self.note_loss("the peer lost its QPs of this connection; recovering over new QPs");
                    self.recovery.machine.peer_hello(clock::now(), epoch)
                }
                Ok(Some(Message::RecoverReady { epoch })) => self.recovery.machine.peer_ready(epoch),
                // The receiver closed and said what it took: its sends are settled, and the
                // recovery (if one runs) has nothing left to carry over.
                Ok(Some(Message::RecvClosed {
                    receives,
                    in_flight,
                    taken,
                })) => {
                    crate::log_info!(
                        crate::log::subsys::NET,
                        "{} comm with {}: the receiver closed, having taken {receives} receive(s) ({in_flight} posted and never taken), completions per QP {taken:?}",
                        self.kind,
                        self.conn.chan.peer()
                    );
                    return core.peer_close(receives, in_flight, &taken);
                }
                Ok(Some(other)) => {
                    return Err(core.state().fail(Error::remote(format!(
                        "the peer {} sent a {} message after the connection was set up: a corrupt or incompatible peer",
                        self.conn.chan.peer(),
                        crate::transport::proto::setup::kind_name(&other)
                    ))))
                }
                Err(ChannelError::Wire(e)) => return Err(self.malformed(core, &e)),
                Err(e) => return Err(self.peer_closed(core, &e)),
            };
            self.act(core, actions)?;
        }
        if let Err(e) = flushed {
            return Err(self.peer_closed(core, &e));
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
        let left = self.conn.failed_over_members();
        let members = if left.is_empty() {
            String::new()
        } else {
            format!(
                " on the fused device's members that answer (failover: {} left out until its port is up again or its wait is over)",
                left.join(", ")
            )
        };
        crate::log_warn!(
            "{} comm with {}: recovered over new QPs (local QPNs {}){members} in {} ms, {} attempt(s) so far in this comm; {}",
            self.kind,
            self.conn.chan.peer(),
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
                    let qps = Box::new(self.conn.qps_record()?);
                    self.conn.chan.queue(&Message::RecoverHello {
                        epoch,
                        head,
                        taken,
                        qps,
                    });
                    self.flush_channel(core)?;
                }
                Action::Connect { epoch } => {
                    let Some(h) = self.recovery.hello_of(epoch) else {
                        return Err(core
                            .state()
                            .fail(Error::internal("recovery: connect without the peer's Hello")));
                    };
                    let peer = h.qps.clone();
                    match self.conn.connect_new_qps(&peer) {
                        Ok(()) => {
                            if let Err(e) = core.reroute(&self.conn.routes()) {
                                return Err(core.state().fail(e));
                            }
                            todo.extend(self.recovery.machine.connected(epoch))
                        }
                        Err(e) => todo.extend(self.recovery.machine.attempt_failed(clock::now(), &e.message)),
                    }
                }
                Action::SendReady { epoch } => {
                    self.conn.chan.queue(&Message::RecoverReady { epoch });
                    self.flush_channel(core)?;
                }
                Action::Resume { epoch } => {
                    let Some(h) = self.recovery.hello_of(epoch) else {
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
                        self.conn.chan.peer(),
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
            // A shared link that read a malformed frame cannot send either.
            Err(ChannelError::Wire(e)) => Err(self.malformed(core, &e)),
            Err(e) => Err(self.peer_closed(core, &e)),
        }
    }

    /// The comm's error when its peer sent bytes that are no side-channel message (`e`).
    fn malformed(&self, core: &mut impl RecoverySink, e: &WireError) -> Error {
        core.state().fail(Error::remote(format!(
            "the peer {} sent a malformed side-channel message ({e}): a corrupt or incompatible peer",
            self.conn.chan.peer()
        )))
    }

    /// Replace the connection's QPs. The receiver first moves its old ones to ERR and takes
    /// every completion they hold (until each posted receive completed or flushed, bounded): a
    /// message the sender saw acknowledged must be one it reports taken.
    fn rebuild(&mut self, core: &mut impl RecoverySink) -> Result<()> {
        // The GIDs the new QPs use: a port whose GID table changed picks again, and one left with
        // no usable GID fails this attempt (the next one tries again).
        for d in &self.conn.devs {
            d.dev.gid_now()?;
        }
        let receives: Vec<usize> = (0..self.conn.qps.len()).map(|q| core.posted_receives(q)).collect();
        // Receives the data path already saw end (flushed) count as ended.
        let mut ended = std::mem::take(&mut self.recovery.receives_ended);
        ended.resize(receives.len(), 0);
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
            for (di, d) in conn.devs.iter().enumerate() {
                let Ok(got) = d.cq.poll(wcs) else { continue };
                any |= !got.is_empty();
                for wc in got.iter() {
                    let Some(q) = conn.qp_index(di, wc.qp_num()) else {
                        continue;
                    };
                    // A receive ends once, completed or flushed: a data write that landed
                    // during the drain took a receive the count above still holds.
                    if core.is_receive(wc.wr_id()) {
                        ended[q] += 1;
                    }
                    if let Ok(c) = wc.result() {
                        core.handle_ok(wc.wr_id(), c.imm);
                    }
                }
            }
            let drained = ended.iter().zip(&receives).all(|(e, r)| e >= r);
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
        if let Some(s) = &self.stats {
            s.renumber(&self.conn.qp_numbers());
        }
        if let Some(m) = &mut self.wr_mon {
            m.reset();
        }
        self.conn.accept_port_errors();
        // SAFETY: zero-SGE receives name no memory.
        core.after_rebuild(&mut |p| unsafe { self.post(p) })
    }
}
