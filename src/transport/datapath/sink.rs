//! How the driver hands completions to a core, and what a recovery needs of it besides: the
//! cores' side of the driver ([`driver`](super::driver)) and of a recovery ([`recovery::steps`](crate::transport::recovery::steps)).

use crate::error::Result;
use crate::transport::proto::plan::{Post, QpRoute};
use crate::transport::proto::recv::RecvCore;
use crate::transport::proto::send::{FifoRing, PeerClose, SendCore};
use crate::transport::proto::state::CommState;

/// How the driver hands completions to a core.
pub trait CompletionSink {
    fn state(&mut self) -> &mut CommState;
    /// A successful completion of `wr_id` (with its immediate, host order).
    fn handle_ok(&mut self, wr_id: u64, imm: Option<u32>);
    /// The operation and byte count of `wr_id`, for the WARN of a failed completion.
    fn describe(&self, wr_id: u64) -> (&'static str, usize);
    /// Whether the peer closed and said what it took ([`RecoverySink::peer_close`]): the
    /// connection's completions mean nothing from then on.
    fn peer_closed(&self) -> bool {
        false
    }
}

impl CompletionSink for RecvCore {
    fn state(&mut self) -> &mut CommState {
        &mut self.state
    }
    fn handle_ok(&mut self, wr_id: u64, imm: Option<u32>) {
        self.handle_completion(wr_id, imm);
    }
    fn describe(&self, wr_id: u64) -> (&'static str, usize) {
        RecvCore::describe(self, wr_id)
    }
}

/// What a recovery needs of a core besides its completions.
pub trait RecoverySink: CompletionSink {
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
    /// The new QPs sit on these members (a fused device's failover or failback).
    fn reroute(&mut self, routes: &[QpRoute]) -> Result<()>;
    /// This side's report: the sender's next FIFO entry, the receiver's completions per QP.
    fn report(&self) -> (u64, Vec<u64>);
    /// Carry on over the new QPs with the peer's report; what it did, in words.
    fn resume(&mut self, head: u64, taken: &[u64], post: &mut dyn FnMut(Post<'_>) -> Result<()>) -> Result<String>;
    /// Whether what [`RecoverySink::resume`] posted that the peer must see first has landed.
    fn landed(&self) -> bool {
        true
    }
    /// The receiver closed, having taken `receives` receives (and `in_flight` posted never
    /// taken) and `taken` completions per QP (a `RecvClosed` message, wire version 7). Only a
    /// sender is told this: a receiver fails its comm.
    fn peer_close(&mut self, _receives: u64, _in_flight: u32, _taken: &[u64]) -> Result<()> {
        Err(self.state().fail(crate::error::Error::remote(
            "the peer sent a RecvClosed message to a recv comm: a corrupt or incompatible peer",
        )))
    }
}

impl RecoverySink for RecvCore {
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
    fn reroute(&mut self, routes: &[QpRoute]) -> Result<()> {
        RecvCore::reroute(self, routes)
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
pub(crate) struct SendSide<'a, R: FifoRing> {
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
    fn peer_closed(&self) -> bool {
        self.core.peer_closed().is_some()
    }
}

impl<R: FifoRing> RecoverySink for SendSide<'_, R> {
    fn begin_recovery(&mut self) {
        self.core.begin_recovery()
    }
    fn reroute(&mut self, routes: &[QpRoute]) -> Result<()> {
        self.core.reroute(routes)
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
    fn peer_close(&mut self, receives: u64, in_flight: u32, taken: &[u64]) -> Result<()> {
        let close = PeerClose { receives, in_flight };
        self.core.handle_peer_close(self.ring, close, taken).map(|_| ())
    }
}
