//! The one place the transport reads the clock: [`now`] maps `std::time::Instant` onto the
//! core's [`Time`] (nanoseconds since the process's first call).

use super::proto::time::Time;
use once_cell::sync::Lazy;
use std::time::{Duration, Instant};

static EPOCH: Lazy<Instant> = Lazy::new(Instant::now);

/// The current time for the sans-IO core.
pub(crate) fn now() -> Time {
    let ns = EPOCH.elapsed().as_nanos();
    Time::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

/// The shortest time between two rounds that a listen comm's accept drives for the whole
/// process (reading every link, the process's listener): a burst of thousands of connects is
/// read once per round, not once per accept call.
pub(crate) const ACCEPT_ROUND: Duration = Duration::from_millis(1);

/// The longest a recv comm's close waits for the sender to acknowledge its last CTS writes
/// (`recv::RecvDp::drain_cts`): on a working fabric they land within microseconds; this covers a
/// lost packet's retransmission at NCCL_IB_TIMEOUT 14 or so, and bounds a close whose peer
/// stopped answering.
pub(crate) const CLOSE_DRAIN: Duration = Duration::from_secs(1);

/// Whether `every` has passed since `last` (never set: yes); when it has, `last` becomes now.
/// What rate-limited work of the process (the idle rounds, reading every link) asks first.
pub(crate) fn due(last: &mut Option<Instant>, every: Duration) -> bool {
    let now = Instant::now();
    if last.is_some_and(|t| now.duration_since(t) < every) {
        return false;
    }
    *last = Some(now);
    true
}
