//! A byte stream whose every byte can be checked: a random 1 MiB block repeated,
//! each repetition rotated by another amount, so a byte lost, repeated, reordered
//! or changed anywhere in a transfer shows. Senders take slices of it
//! ([`Pattern::at`]), receivers check what arrived ([`Pattern::matches`]); nothing
//! is copied on either side.
//!
//! Used by the userspace proxy's engine tests and by `svcproxy-loadgen transfer`
//! (the real-packet tests' 1 GiB transfers).

/// The stream's source block and how each repetition is rotated.
pub struct Pattern(Vec<u8>);

impl Default for Pattern {
    fn default() -> Self {
        Self::new()
    }
}

impl Pattern {
    /// Bytes in one repetition of the block.
    pub const BLOCK: usize = 1 << 20;

    pub fn new() -> Self {
        // Random enough that no two rotations look alike.
        let mut rng = crate::rng::XorShift::new(0x9e37_79b9_7f4a_7c15);
        Pattern((0..Self::BLOCK).map(|_| rng.next_u64() as u8).collect())
    }

    /// The stream's bytes from `offset`, `len` of them at most (fewer at the end of
    /// a repetition or of the source block's tail): a slice of the source block.
    pub fn at(&self, offset: u64, len: usize) -> &[u8] {
        let block = offset / Self::BLOCK as u64;
        let within = (offset % Self::BLOCK as u64) as usize;
        let shift = (block.wrapping_mul(7919) % Self::BLOCK as u64) as usize;
        let src = (shift + within) % Self::BLOCK;
        let n = len.min(Self::BLOCK - within).min(Self::BLOCK - src);
        &self.0[src..src + n]
    }

    /// Whether `got` is the stream's bytes from `offset` on.
    pub fn matches(&self, offset: u64, got: &[u8]) -> bool {
        let mut at = 0;
        while at < got.len() {
            let want = self.at(offset + at as u64, got.len() - at);
            if got[at..at + want.len()] != *want {
                return false;
            }
            at += want.len();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_checked_byte_for_byte_across_block_edges() {
        let p = Pattern::new();
        // Three repetitions, as a sender writes them in uneven pieces.
        let mut stream = Vec::new();
        let total = 3 * Pattern::BLOCK as u64;
        while (stream.len() as u64) < total {
            let piece = p.at(stream.len() as u64, 300_007);
            stream.extend_from_slice(piece);
        }
        assert_eq!(stream.len() as u64, total);
        assert!(p.matches(0, &stream));
        assert!(p.matches(12_345, &stream[12_345..]));
        // Repetitions differ: one sent twice in a row is caught.
        assert!(!p.matches(Pattern::BLOCK as u64, &stream[..Pattern::BLOCK]));
        let mut changed = stream.clone();
        changed[2 * Pattern::BLOCK + 17] ^= 1;
        assert!(!p.matches(0, &changed));
        // A byte lost.
        let mut lost = stream[..Pattern::BLOCK + 10].to_vec();
        lost.remove(Pattern::BLOCK);
        assert!(!p.matches(0, &lost));
    }
}
