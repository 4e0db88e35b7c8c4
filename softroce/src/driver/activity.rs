//! The NIC's "interrupt": a process-wide counter of events an application
//! may be polling for (a completion queued, an inbound RDMA WRITE message
//! landed in its memory), and a bounded wait on it for pollers that have found
//! nothing for a while.
//!
//! Why: an application spinning on `ibv_poll_cq` (NCCL's proxy thread, or a
//! receiver watching memory that the peer RDMA-writes) stays runnable even
//! when it yields, so on a host with few cores the kernel counts it against a
//! CPU and may leave both engine threads of a transfer sharing the other one.
//! A poller that has seen nothing for `SOFTROCE_POLL_SLEEP_AFTER_US` instead
//! waits here — not runnable — until the engine rings or a short timeout
//! passes, so the engines get the CPUs and the poller still wakes within
//! microseconds of the next event (a real NIC's adaptive interrupt
//! moderation does the same).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Bumped on every event; the futex word.
static SEQ: AtomicU32 = AtomicU32::new(0);
/// Threads inside [`wait`]; the engine skips the wake syscall while 0.
static WAITERS: AtomicU32 = AtomicU32::new(0);

/// The longest a poller waits: it may be watching something we do not ring
/// for (NCCL's proxy also polls the GPU's work queue), so it must come back.
pub const MAX_WAIT: Duration = Duration::from_micros(100);

/// The current count; read it *before* looking for work, and pass it to
/// [`wait`], so an event between the look and the wait is not missed.
pub fn snapshot() -> u32 {
    SEQ.load(Ordering::SeqCst)
}

/// Records an event and wakes the waiting pollers, if any.
pub fn ring() {
    SEQ.fetch_add(1, Ordering::SeqCst);
    // SeqCst pairs with `wait`: either we see its WAITERS increment, or it
    // sees our SEQ increment and does not sleep.
    if WAITERS.load(Ordering::SeqCst) != 0 {
        // SAFETY: FUTEX_WAKE on a live static word; no memory is written.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                SEQ.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                i32::MAX,
            )
        };
    }
}

/// Sleeps until an event after `seen` (a [`snapshot`]) or `timeout`.
pub fn wait(seen: u32, timeout: Duration) {
    WAITERS.fetch_add(1, Ordering::SeqCst);
    if SEQ.load(Ordering::SeqCst) == seen {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: FUTEX_WAIT reads the live static word and sleeps while it
        // equals `seen`; `ts` outlives the call. EINTR/EAGAIN/ETIMEDOUT all
        // just return, which is what a poller wants.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                SEQ.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                seen,
                &ts as *const libc::timespec,
            )
        };
    }
    WAITERS.fetch_sub(1, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn wait_returns_at_once_when_an_event_came_after_the_snapshot() {
        let seen = snapshot();
        ring();
        let t = Instant::now();
        wait(seen, Duration::from_secs(5));
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn ring_wakes_a_waiter() {
        let seen = snapshot();
        let waiter = std::thread::spawn(move || wait(seen, Duration::from_secs(30)));
        // Ring until the waiter is gone: the first ring may come before it waits.
        while !waiter.is_finished() {
            ring();
            std::thread::sleep(Duration::from_millis(1));
        }
        waiter.join().unwrap();
    }
}
