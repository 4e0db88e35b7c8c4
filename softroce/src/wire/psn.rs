//! 24-bit packet sequence numbers with modular comparison.

use core::{cmp, fmt, ops};

/// A 24-bit PSN. Arithmetic wraps modulo 2^24; ordering is the modular
/// "serial number" order of IBTA: `a < b` iff `b - a` (mod 2^24) is in
/// `1..2^23`. Like smoltcp's `SeqNumber`, `PartialOrd` is therefore not
/// transitive across more than half the space.
//= IBTA Vol 1 §9.7.1
//# The PSN is a 24 bit value... comparisons are modulo 2^24.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    pub const MASK: u32 = super::MASK_24;

    /// Build from any u32, keeping the low 24 bits.
    pub const fn new(v: u32) -> Psn {
        Psn(v & Self::MASK)
    }

    pub const fn value(self) -> u32 {
        self.0
    }

    /// Signed distance `self - other` in `-2^23 .. 2^23`.
    //= docs/softroce-internals.md#packetisation-psn-and-acknowledgements
    //# compare with wrap-around as ((a - b) << 8) as i32 (sign gives order)
    pub const fn diff(self, other: Psn) -> i32 {
        (self.0.wrapping_sub(other.0) << 8) as i32 >> 8
    }

    /// `self + n` (mod 2^24).
    pub const fn add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl ops::Add<u32> for Psn {
    type Output = Psn;
    fn add(self, n: u32) -> Psn {
        Psn::add(self, n)
    }
}

impl ops::AddAssign<u32> for Psn {
    fn add_assign(&mut self, n: u32) {
        *self = Psn::add(*self, n);
    }
}

impl ops::Sub<u32> for Psn {
    type Output = Psn;
    fn sub(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(n))
    }
}

impl ops::Sub for Psn {
    type Output = i32;
    fn sub(self, rhs: Psn) -> i32 {
        self.diff(rhs)
    }
}

impl cmp::PartialOrd for Psn {
    fn partial_cmp(&self, other: &Psn) -> Option<cmp::Ordering> {
        Some(self.diff(*other).cmp(&0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive oracle: walk forward from `b` up to 2^23 - 1 steps looking for `a`.
    fn oracle_cmp(a: u32, b: u32) -> cmp::Ordering {
        let fwd = (a.wrapping_sub(b)) & Psn::MASK; // steps from b to a
        if fwd == 0 {
            cmp::Ordering::Equal
        } else if fwd < (1 << 23) {
            cmp::Ordering::Greater
        } else {
            cmp::Ordering::Less
        }
    }

    fn xorshift(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    #[test]
    fn wraparound_compare_matches_oracle() {
        let mut s = 0x1234_5678_9abc_def0u64;
        let edges = [0u32, 1, 2, 0x7F_FFFF, 0x80_0000, 0x80_0001, 0xFF_FFFE, 0xFF_FFFF];
        let mut cases: Vec<(u32, u32)> = Vec::new();
        for &a in &edges {
            for &b in &edges {
                cases.push((a, b));
            }
        }
        for _ in 0..200_000 {
            let a = (xorshift(&mut s) as u32) & Psn::MASK;
            let d = match xorshift(&mut s) % 3 {
                0 => (xorshift(&mut s) as u32) & Psn::MASK,
                1 => (xorshift(&mut s) % 300) as u32,
                _ => (1 << 23) + (xorshift(&mut s) % 5) as u32 - 2,
            };
            cases.push((a, a.wrapping_add(d) & Psn::MASK));
        }
        for (a, b) in cases {
            let (pa, pb) = (Psn::new(a), Psn::new(b));
            assert_eq!(pa.partial_cmp(&pb), Some(oracle_cmp(a, b)), "{a:#x} vs {b:#x}");
            // add/sub consistency
            let d = pa - pb;
            assert_eq!(pb + (d as u32), pa);
        }
    }

    #[test]
    fn wraps_at_24_bits() {
        assert_eq!(Psn::new(0xFF_FFFF) + 1, Psn::new(0));
        assert_eq!(Psn::new(0) - 1u32, Psn::new(0xFF_FFFF));
        assert!(Psn::new(0xFF_FFFF) < Psn::new(0));
        assert!(Psn::new(5) > Psn::new(0xFF_FFF0));
        assert_eq!(Psn::new(3) - Psn::new(0xFF_FFFE), 5);
        assert_eq!(Psn::new(0x1_000_005), Psn::new(5));
    }
}
