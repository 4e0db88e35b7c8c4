//! The fault injector's random numbers (`SOFTROCE_LOSS`, `SOFTROCE_SEED`).

/// xorshift64*: cheap, seeded, good enough to pick packets to drop.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (forced odd: the state must not be 0).
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}
