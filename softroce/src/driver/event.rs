//! Asynchronous events of a context (`ibv_get_async_event`): the queue the
//! NIC fills (QP events from the core, CQ overrun, SRQ limit) and the
//! eventfd behind `async_fd`.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use rdma_sys::ibv_event_type;

use crate::proto::AsyncEvent;

/// Asynchronous event queue of a context; `fd` is an eventfd in semaphore
/// mode counting queued events (pollable, blocking by default).
pub struct AsyncQueue {
    pub fd: c_int,
    q: Mutex<VecDeque<(ibv_event_type, usize)>>,
    /// Events of elements (QPs) handed out by `pop_counted` and not yet acknowledged, per
    /// element: their destroy waits for them, as rdma-core's does.
    outstanding: Mutex<Vec<(usize, u32)>>,
}

impl AsyncQueue {
    pub fn new() -> std::io::Result<AsyncQueue> {
        // SAFETY: plain eventfd(2) call.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(AsyncQueue {
            fd,
            q: Mutex::new(VecDeque::new()),
            outstanding: Mutex::new(Vec::new()),
        })
    }

    /// Queues an event; `element` is the cq/qp/srq pointer or the port number.
    pub fn push(&self, ev: ibv_event_type, element: usize) {
        self.q.lock().unwrap().push_back((ev, element));
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.fd, &one as *const u64 as *const c_void, 8) };
    }

    /// The oldest event (after a successful read of `fd` counted it down). With `counted`
    /// (a QP event, whose element the application reads until it acknowledges it), the
    /// element's destroy waits for [`Self::acked`].
    pub fn pop_counted(&self, counted: impl Fn(ibv_event_type) -> bool) -> Option<(ibv_event_type, usize)> {
        let mut q = self.q.lock().unwrap();
        let ev = q.pop_front()?;
        if counted(ev.0) {
            let mut o = self.outstanding.lock().unwrap();
            match o.iter_mut().find(|(e, _)| *e == ev.1) {
                Some((_, n)) => *n += 1,
                None => o.push((ev.1, 1)),
            }
        }
        Some(ev)
    }

    /// The application acknowledged an event of `element` it got from `pop_counted`.
    pub fn acked(&self, element: usize) {
        let mut o = self.outstanding.lock().unwrap();
        if let Some(i) = o.iter().position(|(e, _)| *e == element) {
            o[i].1 -= 1;
            if o[i].1 == 0 {
                o.swap_remove(i);
            }
        }
    }

    /// `element` is being destroyed: drop its queued events (nobody may see a freed element)
    /// and wait, at most `bound`, until the events of it the application holds are
    /// acknowledged (rdma-core's ibv_destroy_qp waits for them the same way).
    pub fn forget(&self, element: usize, bound: std::time::Duration) {
        // (The eventfd keeps counting them: a reader then finds no event and gets EAGAIN.)
        self.q.lock().unwrap().retain(|&(_, e)| e != element);
        let end = std::time::Instant::now() + bound;
        while self.outstanding.lock().unwrap().iter().any(|(e, _)| *e == element) && std::time::Instant::now() < end {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }
}

impl Drop for AsyncQueue {
    fn drop(&mut self) {
        // SAFETY: we own fd.
        unsafe { libc::close(self.fd) };
    }
}

/// The `ibv_event_type` of an event of the core.
pub fn ibv_event_of(ev: AsyncEvent) -> ibv_event_type {
    match ev {
        AsyncEvent::QpFatal => ibv_event_type::IBV_EVENT_QP_FATAL,
        AsyncEvent::QpRequestError => ibv_event_type::IBV_EVENT_QP_REQ_ERR,
        AsyncEvent::QpAccessError => ibv_event_type::IBV_EVENT_QP_ACCESS_ERR,
        AsyncEvent::CommEstablished => ibv_event_type::IBV_EVENT_COMM_EST,
        AsyncEvent::SqDrained => ibv_event_type::IBV_EVENT_SQ_DRAINED,
        AsyncEvent::LastWqeReached => ibv_event_type::IBV_EVENT_QP_LAST_WQE_REACHED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names agree with the numbers the core documents for them.
    #[test]
    fn core_events_map_to_their_ibv_numbers() {
        for ev in [
            AsyncEvent::QpFatal,
            AsyncEvent::QpRequestError,
            AsyncEvent::QpAccessError,
            AsyncEvent::CommEstablished,
            AsyncEvent::SqDrained,
            AsyncEvent::LastWqeReached,
        ] {
            assert_eq!(ibv_event_of(ev) as u32, ev.ibv_event_type(), "{ev:?}");
        }
    }
}
