//! A connection's recovery, the I/O around the machine of
//! [`proto::recovery`](crate::transport::proto::recovery): the state its driver keeps and which
//! failed completions a recovery can cure (here), the steps the driver carries out for the
//! machine ([`steps`]), and active-standby's probes of the members not in use ([`standby`]).

pub(crate) mod standby;
pub(crate) mod steps;

use crate::ibv::sys;
use crate::transport::proto::handshake::EndpointRepr;
use crate::transport::proto::recovery::{Recovery, Role};
use std::time::{Duration, Instant};

/// What the peer's Hello said: its epoch, its next FIFO entry (a sender), its completions
/// taken per QP (a receiver), its new QPs.
pub(crate) struct PeerHello {
    pub epoch: u32,
    pub head: u64,
    pub taken: Vec<u64>,
    pub qps: Box<EndpointRepr>,
}

/// A connection's recovery state, kept by its driver.
pub(crate) struct RecoveryIo {
    pub machine: Recovery,
    /// The peer's last Hello.
    pub hello: Option<PeerHello>,
    /// A liveness probe saw side-channel bytes: read them at the next poll.
    pub readable: bool,
    /// When the recovery in progress began.
    pub started: Option<Instant>,
    /// What the last resume did (for the WARN once the connection made progress).
    pub resumed: Option<String>,
    /// Per QP: the receiver's receives that completed with an error (flushed) in a data-path
    /// poll before the rebuild's drain, which therefore does not wait for them again.
    pub receives_ended: Vec<usize>,
}

impl RecoveryIo {
    pub(crate) fn new(role: Role, peer: String) -> RecoveryIo {
        RecoveryIo {
            machine: {
                let c = crate::config::get();
                Recovery::new(role, c.recovery_timeout(), peer).with_limits(
                    Duration::from_millis(c.recovery_start_delay_ms),
                    c.recovery_attempts_max,
                )
            },
            hello: None,
            readable: false,
            started: None,
            resumed: None,
            receives_ended: Vec::new(),
        }
    }

    /// The peer's Hello of `epoch`, if it is the last one it sent.
    pub(crate) fn hello_of(&self, epoch: u32) -> Option<&PeerHello> {
        self.hello.as_ref().filter(|h| h.epoch == epoch)
    }

    /// Whether a recovery ever replaced the QPs (completions of destroyed QPs may arrive).
    pub(crate) fn replaced(&self) -> bool {
        self.machine.epoch() > 0
    }

    pub(crate) fn enabled(&self) -> bool {
        self.machine.enabled()
    }

    /// Whether the next poll has recovery work: messages to read, a recovery in progress, or
    /// one that has not yet seen a completion.
    pub(crate) fn pending(&self) -> bool {
        self.readable || self.machine.active() || self.machine.unproven()
    }

    /// Whether a recovery is in progress (nothing completes until it is over).
    pub(crate) fn active(&self) -> bool {
        self.machine.active()
    }
}

/// A completion status a new QP may not meet: the path or the peer's NIC stopped answering
/// (link or port down, a broken path), or the QP was flushed by such a failure. Anything else
/// (a protection or access error, a bad request) would fail again the same way.
pub(crate) fn recoverable(status: u32) -> bool {
    use sys::ibv_wc_status as S;
    status == S::IBV_WC_RETRY_EXC_ERR || status == S::IBV_WC_RNR_RETRY_EXC_ERR || status == S::IBV_WC_WR_FLUSH_ERR
}
