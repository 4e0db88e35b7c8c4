//! Time as the core sees it: a count of nanoseconds from an epoch the driver picks (the process's
//! first use of the transport in production, 0 in simulations). The core never reads a clock.

use std::ops::{Add, Sub};
use std::time::Duration;

/// A point in time, nanoseconds since the driver's epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(u64);

impl Time {
    pub const ZERO: Time = Time(0);

    pub const fn from_nanos(ns: u64) -> Time {
        Time(ns)
    }

    #[cfg(any(test, feature = "testing"))]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self - earlier`, zero when `earlier` is later.
    pub fn saturating_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)))
    }
}

impl Sub<Time> for Time {
    type Output = Duration;
    fn sub(self, earlier: Time) -> Duration {
        self.saturating_since(earlier)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Time::from_nanos(5);
        assert_eq!(t + Duration::from_nanos(7), Time::from_nanos(12));
        assert_eq!(Time::from_nanos(3) - t, Duration::ZERO);
        assert_eq!(t - Time::ZERO, Duration::from_nanos(5));
        assert_eq!(
            Time::from_nanos(u64::MAX - 1) + Duration::MAX,
            Time::from_nanos(u64::MAX)
        );
    }
}
