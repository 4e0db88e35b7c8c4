//! A queue pair as the NIC holds it: the core behind its lock and the
//! queues its completions and events go to.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::counters::Counters;
use super::cq::CqInner;
use super::event::AsyncQueue;
use super::srq::SrqInner;
use crate::proto::QpCore;

/// Per-QP state shared by the verbs layer and the engine.
pub struct QpShared {
    pub qpn: u32,
    pub pd: u32,
    pub core: Mutex<QpCore>,
    /// The shared receive queue the QP takes receive WQEs from, if any.
    pub srq: Option<Arc<SrqInner>>,
    pub send_cq: Arc<CqInner>,
    pub recv_cq: Arc<CqInner>,
    pub async_q: Arc<AsyncQueue>,
    /// The application's `ibv_qp *` (element of async events).
    pub ibv_ptr: AtomicUsize,
    /// Queued on the engine's dirty list (deferred packets to send).
    pub dirty: AtomicBool,
    /// The verbs work asked of this QP and the packets it sent.
    pub counters: Counters,
}

impl QpShared {
    /// The shared state of a new QP; counts it as a user of its CQs and SRQ
    /// (undone by [`Self::detach`]).
    pub fn new(
        core: QpCore,
        pd: u32,
        srq: Option<Arc<SrqInner>>,
        send_cq: Arc<CqInner>,
        recv_cq: Arc<CqInner>,
        async_q: Arc<AsyncQueue>,
    ) -> QpShared {
        send_cq.users.fetch_add(1, Ordering::AcqRel);
        recv_cq.users.fetch_add(1, Ordering::AcqRel);
        if let Some(s) = &srq {
            s.users.fetch_add(1, Ordering::AcqRel);
        }
        QpShared {
            qpn: core.qpn(),
            pd,
            core: Mutex::new(core),
            srq,
            send_cq,
            recv_cq,
            async_q,
            ibv_ptr: AtomicUsize::new(0),
            dirty: AtomicBool::new(false),
            counters: Counters::default(),
        }
    }

    /// The QP no longer uses its CQs and SRQ (at destruction).
    pub fn detach(&self) {
        self.send_cq.users.fetch_sub(1, Ordering::AcqRel);
        self.recv_cq.users.fetch_sub(1, Ordering::AcqRel);
        if let Some(s) = &self.srq {
            s.users.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Locks the core even if a panicking thread poisoned the mutex.
    #[inline]
    pub fn lock_core(&self) -> MutexGuard<'_, QpCore> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }
}
