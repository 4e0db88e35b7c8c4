//! What an application thread's empty CQ poll does. Applications spin on
//! `ibv_poll_cq` while the NIC's work runs on the engine threads; on a host
//! with fewer free cores than spinning threads that spin would starve the
//! engines, so the poller yields, does the receive work itself, or waits for
//! the NIC's next event (see [`idle_poll`]).

use super::activity;
use crate::config;

/// An empty CQ poll by this thread: every `SOFTROCE_POLL_YIELD` consecutive
/// empty polls of a thread it first does the NIC's work itself (`receive`:
/// the CQ's device receives one batch inline) if there is some and no other
/// thread is doing it (`SOFTROCE_INLINE_RX`), and keeps doing so on its next
/// empty polls while datagrams keep coming; else it gives the CPU away
/// (`sched_yield`, which returns at once on an idle CPU), or, once every poll
/// of the thread has been empty for `SOFTROCE_POLL_SLEEP_AFTER_US`, waits for
/// the NIC's next event (see [`activity`]). Not at every empty poll: a thread
/// that only waits a few microseconds (a latency test's ACK) is better off
/// leaving the receiving to the engine. `seen` is the activity count read
/// before the CQ was found empty. Returns whether it did NIC work (the CQ may
/// have completions now).
pub fn idle_poll(seen: u32, mut receive: impl FnMut() -> bool) -> bool {
    // Small messages this thread left to the engine (`SOFTROCE_DEFER`) go
    // out now, batched with what it posted since: waiting for the next
    // answer costs a round trip when few packets are outstanding (a
    // receiver's second CTS write waits for its first one's ACK), and a
    // thread that polls an empty CQ has nothing better to do. The inline
    // receive sends the device's deferred packets after its batch.
    if DEFERRED.with(|d| d.replace(false)) && receive_inline(&mut receive) {
        return true;
    }
    let mut streak = POLL_STREAK.with(|e| e.get());
    let action = streak.next_action(&mut receive);
    POLL_STREAK.with(|e| e.set(streak));
    match action {
        IdleAction::Received => return true,
        IdleAction::Spin => {}
        IdleAction::Yield => {
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
        IdleAction::Wait => activity::wait(seen, activity::MAX_WAIT),
    }
    false
}

/// What an empty poll does (see [`idle_poll`]).
enum IdleAction {
    /// Received datagrams inline: the CQ may have completions now.
    Received,
    /// Nothing: poll again.
    Spin,
    Yield,
    /// Wait for the NIC's next event.
    Wait,
}

impl Streak {
    /// Counts one empty poll and decides what it does.
    fn next_action(&mut self, receive: &mut impl FnMut() -> bool) -> IdleAction {
        if self.inline {
            if receive_inline(receive) {
                return IdleAction::Received;
            }
            self.inline = false;
        }
        let yield_every = config::poll_yield();
        self.empty += 1;
        if self.empty < yield_every {
            return IdleAction::Spin;
        }
        self.empty = 0;
        let now = std::time::Instant::now();
        let idle_for = now.duration_since(*self.since.get_or_insert(now));
        if (yield_every == 0 || idle_for >= config::inline_rx_after()) && receive_inline(receive) {
            self.inline = true;
            self.since = None;
            return IdleAction::Received;
        }
        let sleep_after = config::poll_sleep_after();
        if yield_every == 0 {
            IdleAction::Spin
        } else if !sleep_after.is_zero() && idle_for >= sleep_after {
            IdleAction::Wait
        } else {
            IdleAction::Yield
        }
    }
}

/// A thread's run of empty polls (on any CQ).
#[derive(Clone, Copy)]
struct Streak {
    /// Empty polls since the last yield point.
    empty: u32,
    /// Since when every poll has been empty (set at the first yield point).
    since: Option<std::time::Instant>,
    /// The last inline receive found datagrams: try again at the next empty poll.
    inline: bool,
}

thread_local! {
    static POLL_STREAK: std::cell::Cell<Streak> =
        const { std::cell::Cell::new(Streak { empty: 0, since: None, inline: false }) };
}

/// An empty poll: let this thread do the NIC's receive work (`receive`), if
/// no other thread is doing it (`SOFTROCE_INLINE_RX`, default on). Returns
/// whether it handled anything (the CQ may now hold completions).
fn receive_inline(receive: &mut impl FnMut() -> bool) -> bool {
    config::inline_rx() && receive()
}

thread_local! {
    /// This thread deferred small messages since its last empty CQ poll.
    static DEFERRED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A posting thread left small messages to the engine (`post_send`): its
/// next empty CQ poll sends them (see [`idle_poll`]).
pub fn note_deferred() {
    DEFERRED.with(|d| d.set(true));
}

/// A poll that found a completion ends the thread's empty streak.
pub fn poll_found_work() {
    POLL_STREAK.with(|e| {
        let inline = e.get().inline;
        e.set(Streak {
            empty: 0,
            since: None,
            inline,
        })
    });
}
