//! The state a device's progress engine shares with the application
//! threads: the QP table, the wake-up eventfd and deadlines, the deferred
//! QPs and the receive side of the socket. The loop that works on it is in
//! `engine.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::inject::Injector;
use super::qp::QpShared;
use super::tx::Tx;
use super::udp::{RecvMeta, MAX_DGRAM};
use crate::proto::Instant;

/// Datagrams per `recvmmsg`.
pub const RX_BATCH: usize = 32;

/// A device's engine state (one per device instance, held by its `Device`).
pub struct Engine {
    qps: RwLock<HashMap<u32, Arc<QpShared>>>,
    /// Eventfd that wakes the engine thread ([`Self::kick`]); -1 if eventfd failed.
    pub wake_fd: i32,
    /// Deadline (ns) the engine sleeps until; u64::MAX when it waits for input only.
    pub sleep_until: AtomicU64,
    /// Earliest timer armed by another thread since the engine last looked (ns).
    pub noted: AtomicU64,
    /// A full timer scan is due (the QP set changed).
    pub rescan: AtomicBool,
    /// QPs with work left for the engine (deferred small messages).
    pub dirty: Mutex<Vec<Arc<QpShared>>>,
    /// `dirty` is not empty (checked without the lock by a spinning engine).
    pub has_dirty: AtomicBool,
    /// The receive side of the socket: whoever holds it (the engine, or an
    /// application thread whose CQ poll found nothing, see the engine's
    /// `receive_inline`) receives and handles the next datagrams.
    pub rx: Mutex<Rx>,
    /// When a datagram last arrived (ns of the driver's clock), for the engine's spin.
    pub last_rx: AtomicU64,
}

/// Receive-side state: datagram buffers and what a batch needs.
pub struct Rx {
    pub bufs: Vec<Vec<u8>>,
    pub meta: [RecvMeta; RX_BATCH],
    pub tx: Tx,
    pub inject: Injector,
    pub touched: Vec<Arc<QpShared>>,
    pub bad_icrc: u64,
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

impl Engine {
    pub fn new() -> Engine {
        // SAFETY: plain eventfd(2) call; a failure leaves -1 and the engine polls periodically.
        let wake_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        Engine {
            qps: RwLock::new(HashMap::new()),
            wake_fd,
            sleep_until: AtomicU64::new(u64::MAX),
            noted: AtomicU64::new(u64::MAX),
            rescan: AtomicBool::new(true),
            dirty: Mutex::new(Vec::new()),
            has_dirty: AtomicBool::new(false),
            rx: Mutex::new(Rx {
                bufs: (0..RX_BATCH).map(|_| vec![0u8; MAX_DGRAM]).collect(),
                meta: [RecvMeta::default(); RX_BATCH],
                tx: Tx::new(),
                inject: Injector::new(),
                touched: Vec::new(),
                bad_icrc: 0,
            }),
            last_rx: AtomicU64::new(0),
        }
    }

    pub fn has_qp(&self, qpn: u32) -> bool {
        self.qps.read().unwrap().contains_key(&qpn)
    }

    pub fn pd_in_use(&self, pd: u32) -> bool {
        self.qps.read().unwrap().values().any(|q| q.pd == pd)
    }

    pub fn add_qp(&self, qp: Arc<QpShared>) {
        self.qps.write().unwrap().insert(qp.qpn, qp);
        self.rescan.store(true, Ordering::Release);
    }

    pub fn remove_qp(&self, qpn: u32) -> Option<Arc<QpShared>> {
        let r = self.qps.write().unwrap().remove(&qpn);
        self.rescan.store(true, Ordering::Release);
        r
    }

    /// Every QP (for the engine's timer scan).
    pub fn all_qps(&self) -> Vec<Arc<QpShared>> {
        self.qps.read().unwrap().values().cloned().collect()
    }

    /// Leaves `qp`'s due packets to the engine's next loop (no wake-up: the
    /// caller knows an answer or a timer will come).
    pub fn defer(&self, qp: &Arc<QpShared>) {
        if !qp.dirty.swap(true, Ordering::AcqRel) {
            self.dirty.lock().unwrap_or_else(|e| e.into_inner()).push(qp.clone());
            self.has_dirty.store(true, Ordering::Release);
        }
    }

    #[inline]
    pub fn qp(&self, qpn: u32) -> Option<Arc<QpShared>> {
        self.qps.read().unwrap().get(&qpn).cloned()
    }

    /// Wakes the engine thread.
    pub fn kick(&self) {
        if self.wake_fd >= 0 {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd.
            unsafe { libc::write(self.wake_fd, &one as *const u64 as *const libc::c_void, 8) };
        }
    }

    /// Wakes the engine if `deadline` is earlier than what it sleeps on.
    pub fn note_deadline(&self, deadline: Option<Instant>) {
        if let Some(d) = deadline {
            self.noted.fetch_min(d.as_nanos(), Ordering::SeqCst);
            if d.as_nanos() < self.sleep_until.load(Ordering::SeqCst) {
                self.kick();
            }
        }
    }
}
