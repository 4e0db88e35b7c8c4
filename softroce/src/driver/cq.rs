//! Completion queues as the NIC sees them: the ring of work completions,
//! the arming state and the completion channel it fires.
//!
//! The data path pushes completions with [`CqInner::push_many`]; a poll
//! checks an atomic count first, so polling an empty CQ takes no lock. A
//! completion channel is a pipe carrying the 8-byte handle of each CQ that
//! fired; the read end is what the application sees as `channel->fd` (real,
//! pollable, blocking unless the application changes it).

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::activity;
use super::event::AsyncQueue;

/// One work completion, as the engine produces it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Network byte order, as in `ibv_wc.imm_data` (stored as the raw u32).
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    /// The message carried the Solicited Event bit (for solicited-only arming).
    pub solicited: bool,
    /// Completion time, nanoseconds of the engine clock (`ibv_wc_read_completion_ts`).
    pub ts: u64,
}

/// Arming states of a CQ (`ibv_req_notify_cq`).
const NOT_ARMED: u8 = 0;
const ARMED_ANY: u8 = 1;
const ARMED_SOLICITED: u8 = 2;

/// Shared CQ state (the engine holds it through the QPs).
pub struct CqInner {
    queue: Mutex<VecDeque<Wc>>,
    len: AtomicUsize,
    armed: AtomicU8,
    channel: Option<Arc<CompletionChannel>>,
    /// What the channel carries when this CQ fires.
    pub handle: u64,
    cqe: AtomicI32,
    /// QPs using this CQ (destroy_cq fails with EBUSY while non-zero).
    pub users: AtomicUsize,
    /// The context's async queue and the application's `ibv_cq *`, for IBV_EVENT_CQ_ERR.
    async_q: Arc<AsyncQueue>,
    ibv_ptr: AtomicUsize,
    overflowed: AtomicBool,
}

impl CqInner {
    /// A CQ of `cqe` entries that fires `channel` (if any) when armed.
    pub fn new(cqe: c_int, handle: u64, channel: Option<Arc<CompletionChannel>>, async_q: Arc<AsyncQueue>) -> CqInner {
        CqInner {
            queue: Mutex::new(VecDeque::with_capacity(cqe.max(0) as usize)),
            len: AtomicUsize::new(0),
            armed: AtomicU8::new(NOT_ARMED),
            channel,
            handle,
            cqe: AtomicI32::new(cqe),
            users: AtomicUsize::new(0),
            async_q,
            ibv_ptr: AtomicUsize::new(0),
            overflowed: AtomicBool::new(false),
        }
    }

    /// The application acknowledged an IBV_EVENT_CQ_ERR of this CQ (`ibv_cq *` at `element`).
    pub fn event_acked(&self, element: usize) {
        self.async_q.acked(element);
    }

    /// The CQ at `element` is being destroyed: drop its queued events and wait (at most
    /// `bound`) for the ones the application holds, as rdma-core's ibv_destroy_cq does.
    pub fn forget_events(&self, element: usize, bound: std::time::Duration) {
        self.async_q.forget(element, bound);
    }

    /// Records the application's `ibv_cq *` (the element of IBV_EVENT_CQ_ERR).
    pub fn set_ibv_ptr(&self, p: usize) {
        self.ibv_ptr.store(p, Ordering::Relaxed);
    }

    /// Appends a completion and fires the completion channel if armed.
    pub fn push(&self, wc: Wc) {
        self.push_many(&[wc]);
    }

    /// Appends several completions (one lock, one event).
    pub fn push_many(&self, wcs: &[Wc]) {
        if wcs.is_empty() {
            return;
        }
        let n = {
            let mut q = self.queue.lock().unwrap();
            q.extend(wcs.iter().copied());
            self.len.store(q.len(), Ordering::Release);
            q.len()
        };
        if n > self.cqe.load(Ordering::Relaxed) as usize {
            self.overrun();
        }
        self.maybe_fire(wcs.iter().any(|w| w.solicited || w.status != 0));
        activity::ring();
    }

    /// The CQ overran (more completions than its size left unpolled, or `softroce-ctl
    /// cq-overrun`): `IBV_EVENT_CQ_ERR`, once per CQ, as the NIC reports it. No completion is
    /// dropped (the queue grows), so the application can still drain it; the event is what
    /// tells it the CQ can no longer be trusted. True when this call reported it.
    pub fn overrun(&self) -> bool {
        if self.overflowed.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.async_q.push(
            rdma_sys::ibv_event_type::IBV_EVENT_CQ_ERR,
            self.ibv_ptr.load(Ordering::Relaxed),
        );
        true
    }

    fn maybe_fire(&self, solicited: bool) {
        let a = self.armed.load(Ordering::Acquire);
        if a == NOT_ARMED || (a == ARMED_SOLICITED && !solicited) {
            return;
        }
        if self
            .armed
            .compare_exchange(a, NOT_ARMED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            if let Some(ch) = &self.channel {
                ch.notify(self.handle);
            }
        }
    }

    /// Arms the CQ for its next completion (`solicited_only`: the next
    /// solicited or error completion). Never narrows an "any completion" arm.
    pub fn arm(&self, solicited_only: bool) {
        let want = if solicited_only { ARMED_SOLICITED } else { ARMED_ANY };
        let _ = self.armed.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
            if cur == ARMED_ANY {
                None
            } else {
                Some(want)
            }
        });
    }

    /// Moves up to `out.len()` completions into `out`; returns how many.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        if self.len.load(Ordering::Acquire) == 0 || out.is_empty() {
            return 0;
        }
        let mut q = self.queue.lock().unwrap();
        let mut n = 0;
        while n < out.len() {
            match q.pop_front() {
                Some(w) => {
                    out[n] = w;
                    n += 1;
                }
                None => break,
            }
        }
        self.len.store(q.len(), Ordering::Release);
        n
    }

    /// Removes every completion of QP `qpn` not yet polled (the QP moved to RESET). As
    /// rdma-core's mlx4 and mlx5 providers do (`mlx5_cq_clean` from `mlx5_modify_qp`), so a QP
    /// brought back from ERR through RESET does not hand its old flushed work requests to the
    /// next poll (docs/softroce-pyverbs.md). Returns how many were removed.
    pub fn clean_qp(&self, qpn: u32) -> usize {
        let mut q = self.queue.lock().unwrap();
        let before = q.len();
        q.retain(|w| w.qp_num != qpn);
        self.len.store(q.len(), Ordering::Release);
        before - q.len()
    }

    /// `ibv_resize_cq`: EINVAL when more completions are queued than `cqe`.
    pub fn resize(&self, cqe: c_int) -> Result<(), i32> {
        if (cqe.max(0) as usize) < self.len() {
            return Err(libc::EINVAL);
        }
        self.cqe.store(cqe, Ordering::Relaxed);
        Ok(())
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The pipe of a completion channel.
pub struct CompletionChannel {
    rd: c_int,
    wr: c_int,
}

impl CompletionChannel {
    /// A new pipe (close-on-exec; the write end non-blocking, so a full pipe
    /// never stalls the engine).
    pub fn new() -> std::io::Result<CompletionChannel> {
        let mut fds = [0 as c_int; 2];
        // SAFETY: fds has room for two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: sets O_NONBLOCK on the write end we own.
        unsafe {
            let fl = libc::fcntl(fds[1], libc::F_GETFL);
            libc::fcntl(fds[1], libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        Ok(CompletionChannel { rd: fds[0], wr: fds[1] })
    }

    /// The read end (`ibv_comp_channel.fd`).
    pub fn fd(&self) -> c_int {
        self.rd
    }

    fn notify(&self, handle: u64) {
        // SAFETY: writes 8 bytes from a live u64 to our pipe (non-blocking write end).
        unsafe { libc::write(self.wr, &handle as *const u64 as *const c_void, 8) };
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: we own both ends.
        unsafe {
            libc::close(self.rd);
            libc::close(self.wr);
        }
    }
}
