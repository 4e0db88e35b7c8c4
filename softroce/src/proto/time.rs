//! Virtual time for the sans-IO core.
//!
//! The core never reads a clock: every input carries `now`, and the driver
//! asks [`super::QpCore::poll_timeout`] when it must call back. Time is a
//! plain count of nanoseconds from an arbitrary epoch chosen by the driver
//! (e.g. `std::time::Instant` of context creation, or 0 in simulations).

use core::ops::{Add, AddAssign, Sub};

/// A point in (virtual) time, in nanoseconds since the driver's epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(pub u64);

/// A span of (virtual) time, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(pub u64);

impl Instant {
    pub const ZERO: Instant = Instant(0);
    pub const fn from_nanos(ns: u64) -> Self {
        Instant(ns)
    }
    pub const fn from_micros(us: u64) -> Self {
        Instant(us.saturating_mul(1_000))
    }
    pub const fn from_millis(ms: u64) -> Self {
        Instant(ms.saturating_mul(1_000_000))
    }
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// `self - earlier`, saturating at zero.
    pub const fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration(self.0.saturating_sub(earlier.0))
    }
}

impl Duration {
    pub const ZERO: Duration = Duration(0);
    pub const fn from_nanos(ns: u64) -> Self {
        Duration(ns)
    }
    pub const fn from_micros(us: u64) -> Self {
        Duration(us.saturating_mul(1_000))
    }
    pub const fn from_millis(ms: u64) -> Self {
        Duration(ms.saturating_mul(1_000_000))
    }
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(d.0))
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        self.0 = self.0.saturating_add(d.0);
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        Duration(self.0.saturating_sub(rhs.0))
    }
}

impl Add for Duration {
    type Output = Duration;
    fn add(self, d: Duration) -> Duration {
        Duration(self.0.saturating_add(d.0))
    }
}

impl From<core::time::Duration> for Duration {
    fn from(d: core::time::Duration) -> Self {
        Duration(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

impl From<Duration> for core::time::Duration {
    fn from(d: Duration) -> Self {
        core::time::Duration::from_nanos(d.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units, arithmetic and the conversions to and from `core::time::Duration`, with their
    /// saturation: a deadline far in the future stays far in the future, never wraps to the past.
    #[test]
    fn units_arithmetic_and_conversions_saturate() {
        assert_eq!(Instant::from_micros(3).as_nanos(), 3_000);
        assert_eq!(Instant::from_millis(3).as_nanos(), 3_000_000);
        assert_eq!(Instant::from_millis(u64::MAX).as_nanos(), u64::MAX);
        assert_eq!(Duration::from_micros(5).as_nanos(), 5_000);
        assert_eq!(Duration::from_millis(5).as_nanos(), 5_000_000);
        assert_eq!(Duration::from_micros(u64::MAX).as_nanos(), u64::MAX);

        let (a, b) = (Instant::from_nanos(10), Instant::from_nanos(25));
        assert_eq!(b.saturating_duration_since(a), Duration::from_nanos(15));
        assert_eq!(a.saturating_duration_since(b), Duration::ZERO);
        assert_eq!(b - a, Duration::from_nanos(15));
        assert_eq!(a - b, Duration::ZERO);
        assert_eq!(a + Duration::from_nanos(15), b);
        assert_eq!(
            Instant::from_nanos(u64::MAX - 1) + Duration::from_nanos(5),
            Instant::from_nanos(u64::MAX)
        );
        let mut c = a;
        c += Duration::from_nanos(15);
        assert_eq!(c, b);
        c += Duration::from_nanos(u64::MAX);
        assert_eq!(c, Instant::from_nanos(u64::MAX));
        assert_eq!(
            Duration::from_nanos(2) + Duration::from_nanos(3),
            Duration::from_nanos(5)
        );
        assert_eq!(
            Duration::from_nanos(u64::MAX) + Duration::from_nanos(3),
            Duration::from_nanos(u64::MAX)
        );

        assert_eq!(
            Duration::from(core::time::Duration::from_micros(7)),
            Duration::from_nanos(7_000)
        );
        assert_eq!(
            Duration::from(core::time::Duration::MAX),
            Duration::from_nanos(u64::MAX)
        );
        assert_eq!(
            core::time::Duration::from(Duration::from_nanos(7_000)),
            core::time::Duration::from_micros(7)
        );
    }
}
