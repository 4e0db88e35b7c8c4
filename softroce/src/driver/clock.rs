//! The driver's clock: the one place softroce reads the time for the core.

use std::sync::OnceLock;

use crate::proto::Instant;

/// Nanoseconds since the first call (the driver's epoch for the core's virtual time).
pub fn now() -> Instant {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    let e = *EPOCH.get_or_init(std::time::Instant::now);
    Instant::from_nanos(e.elapsed().as_nanos() as u64)
}

/// The earlier of two optional deadlines.
pub fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}
