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
        })
    }

    /// Queues an event; `element` is the cq/qp/srq pointer or the port number.
    pub fn push(&self, ev: ibv_event_type, element: usize) {
        self.q.lock().unwrap().push_back((ev, element));
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.fd, &one as *const u64 as *const c_void, 8) };
    }

    /// The oldest event (after a successful read of `fd` counted it down).
    pub fn pop(&self) -> Option<(ibv_event_type, usize)> {
        self.q.lock().unwrap().pop_front()
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
