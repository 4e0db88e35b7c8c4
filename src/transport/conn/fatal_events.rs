//! The fatal async events that end a connection's QPs: the NIC failing, the port going down,
//! one of the connection's own QPs or its CQ failing (counted per device by the verbs layer's
//! event thread), and the cheap check the data path makes for them on every call.

use super::devices::{port_errors, LocalDev};
use super::Conn;
use std::sync::atomic::Ordering;

/// What a fatal async event hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FatalKind {
    /// The whole NIC (device fatal).
    Device,
    /// The port went down: the connection's QPs fail, new ones work once it is back.
    Port,
    /// One of the connection's QPs (QP fatal, access error).
    Qp,
    /// The connection's CQ (overrun).
    Cq,
}

impl Conn {
    /// A fatal async event hit one of our devices or its port, one of our own QPs or our
    /// CQ since the comm was made (or, for a port, since [`Self::accept_port_errors`]).
    /// Another comm's QP or CQ failing on the same device does not fail this one.
    pub fn fatal_event(&self) -> Option<(&LocalDev, FatalKind)> {
        self.devs.iter().enumerate().find_map(|(i, d)| {
            let ctx = &d.dev.context;
            if ctx.fatal_events.load(Ordering::Acquire) != d.fatal_base {
                return Some((d, FatalKind::Device));
            }
            // A member that holds none of our data QPs (the QPs left it, or it stands by) loses
            // nothing when its port goes down (a standby's probe notices).
            let port_down = port_errors(&d.dev) != d.port_error_base && self.qps.iter().any(|q| q.dev == i);
            let own_qp_failed = || {
                ctx.qp_failures.any_of_since(
                    d.qp_failure_base,
                    self.qps.iter().filter(|q| q.dev == i).map(|q| u64::from(q.qp.qpn())),
                )
            };
            let own_cq_failed = || {
                ctx.cq_failures
                    .any_of_since(d.cq_failure_base, [d.cq.as_ptr() as usize as u64])
            };
            if own_cq_failed() {
                Some((d, FatalKind::Cq))
            } else if own_qp_failed() {
                Some((d, FatalKind::Qp))
            } else {
                port_down.then_some((d, FatalKind::Port))
            }
        })
    }

    /// A recovery took the port errors seen so far (and our old QPs' failures) into account:
    /// only later ones count.
    pub fn accept_port_errors(&mut self) {
        for d in &mut self.devs {
            d.port_error_base = port_errors(&d.dev);
            d.qp_failure_base = d.dev.context.qp_failures.count.load(Ordering::Acquire);
        }
    }

    /// Whether a fatal event may be new: some member's generation moved since
    /// [`Self::new_fatal_event`] last looked. One load per member device; the data path asks
    /// this on every poll, inlined, before anything else about events.
    #[inline]
    pub fn fatal_generation_moved(&self) -> bool {
        self.devs
            .iter()
            .any(|d| d.dev.context.fatal_generation.load(Ordering::Acquire) != d.seen_generation)
    }

    /// The cheap check the data path makes on every call: whether any device of the comm had
    /// a fatal event since the last look (one load per member device); if so, the full
    /// [`Self::fatal_event`].
    pub fn new_fatal_event(&mut self) -> Option<(&LocalDev, FatalKind)> {
        let mut moved = false;
        for d in &mut self.devs {
            let g = d.dev.context.fatal_generation.load(Ordering::Acquire);
            if g != d.seen_generation {
                d.seen_generation = g;
                moved = true;
            }
        }
        if moved {
            self.fatal_event()
        } else {
            None
        }
    }
}
