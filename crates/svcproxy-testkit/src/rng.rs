//! A seeded xorshift64 generator: randomized tests and test data that are the same at
//! every run, without a dependency.

/// Marsaglia's xorshift64 (shifts 13, 7, 17). The seed must not be zero.
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        assert_ne!(seed, 0, "xorshift's state must not be zero");
        XorShift(seed)
    }

    /// The next state.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n` (not exactly uniform; enough for tests).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}
