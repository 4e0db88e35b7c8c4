//! Closing a recv comm, before its QPs go: the sender gets the CTS writes posted so far
//! ([`RecvDp::drain_cts`]) and what this comm took ([`RecvDp::report_close`]).

use super::RecvDp;
use crate::transport::clock;
use crate::transport::proto::handshake::{Message, CLOSE_VERSION};
use crate::transport::sidechannel::Peek;
use std::time::Instant;

impl RecvDp {
    /// At close, before the QPs go: wait until the sender has the CTS writes posted so far,
    /// verdicts on its eager messages among them ([`RecvCore::post_close_markers`]), for at most
    /// [`clock::CLOSE_DRAIN`], and not at all for a failed comm, a close with receives in
    /// flight, or a peer that is gone.
    fn drain_cts(&mut self) {
        // A close with receives in flight is an abort: the sender's sends for them fail anyway,
        // and polling now would report what the abort itself causes (deregistered buffers).
        if self.in_flight() > 0 || self.io.conn.chan.peek() == Peek::Gone {
            return;
        }
        let RecvDp { io, core, .. } = self;
        // SAFETY: a zero-length write reads no local memory.
        let marked = match core.post_close_markers(&mut |p| unsafe { io.post(p) }) {
            Ok(m) if m != 0 => m,
            _ => return,
        };
        let until = Instant::now() + clock::CLOSE_DRAIN;
        while !self.core.cts_landed(marked) {
            if self.io.conn.chan.peek() == Peek::Gone || self.poll().is_err() {
                return;
            }
            if Instant::now() >= until {
                crate::log_info!(
                    crate::log::subsys::NET,
                    "recv comm with {}: closed before its last CTS writes were acknowledged within {} ms; eager sends they answer fail at the sender",
                    self.io.conn.chan.peer(),
                    clock::CLOSE_DRAIN.as_millis()
                );
                return;
            }
            std::thread::yield_now();
        }
    }

    /// At close, after [`RecvDp::drain_cts`] and before the QPs go (wire version 7,
    /// docs/design/data-path.md#closing): tell the sender what this comm took
    /// ([`RecvCore::close_report`]), so it completes those sends even when the acknowledgement
    /// of their last write was lost, and fails the rest at once. Sent whether or not receives
    /// are in flight; not by a failed or recovering comm (its counts are not final) nor to a
    /// peer that is gone. The flush waits at most [`clock::CLOSE_DRAIN`].
    fn report_close(&mut self) {
        let chan = &mut self.io.conn.chan;
        if chan.version() < CLOSE_VERSION
            || self.core.state.failed()
            || self.core.recovering()
            || chan.peek() == Peek::Gone
        {
            return;
        }
        let (receives, in_flight, taken) = self.core.close_report();
        crate::log_info!(
            crate::log::subsys::NET,
            "recv comm with {}: closing, took {receives} receive(s) ({in_flight} posted and never taken), completions per QP {taken:?}",
            chan.peer()
        );
        chan.queue(&Message::RecvClosed {
            receives,
            in_flight,
            taken,
        });
        let until = Instant::now() + clock::CLOSE_DRAIN;
        while let Ok(false) = chan.flush() {
            if Instant::now() >= until {
                return;
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for RecvDp {
    /// The sender gets what was told it ([`RecvDp::drain_cts`]) and what was taken
    /// ([`RecvDp::report_close`]) before the QPs go; every Start gets its Stop, also for
    /// receives still in flight at close.
    fn drop(&mut self) {
        self.drain_cts();
        self.report_close();
        if let Some(pr) = self.prof.as_mut() {
            pr.events.stop_all();
        }
    }
}
