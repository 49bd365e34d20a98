//! Keys of the shared `endpoint-dnat-*` maps: each endpoint set that dispatches
//! through the map owns a run of consecutive keys (`numgen random mod N offset B`
//! draws from `B..B+N`), handed out here.
//!
//! Runs come in power-of-two sizes; a freed run is kept for the next run of its
//! size, newest first, so a service port whose endpoints change but whose count
//! stays within its size gets the very keys it had (a partial sync then rewrites
//! only the elements that changed). Keys are never shared between live runs. The
//! key space is 32 bits: the keys ever handed out stay below twice the peak of
//! live keys per size, summed over sizes, so exhaustion needs billions of live
//! endpoints; should it happen anyway, [`Slots::alloc`] says `None` and the set
//! is dispatched without the map.

/// A run of keys: its first key and its size class (2^class keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub first: u32,
    class: u8,
}

#[derive(Debug, Default)]
pub(crate) struct Slots {
    /// The first key never handed out (key 0 never is: `offset 0` would list
    /// differently from how it is written).
    next: u64,
    /// Freed runs per size class, reused last in, first out.
    free: Vec<Vec<u32>>,
    /// Keys in live runs (for statistics and tests).
    live: u64,
}

impl Slots {
    pub fn new() -> Self {
        Slots {
            next: 1,
            free: Vec::new(),
            live: 0,
        }
    }

    /// A run of at least `n` keys (`n` ≥ 1).
    pub fn alloc(&mut self, n: usize) -> Option<Run> {
        let class = n.max(1).next_power_of_two().trailing_zeros() as u8;
        let size = 1u64 << class;
        let first = match self.free.get_mut(class as usize).and_then(Vec::pop) {
            Some(first) => first,
            None => {
                let first = self.next;
                if first + size > u64::from(u32::MAX) + 1 {
                    return None;
                }
                self.next += size;
                first as u32
            }
        };
        self.live += size;
        Some(Run { first, class })
    }

    pub fn free(&mut self, run: Run) {
        let class = run.class as usize;
        if self.free.len() <= class {
            self.free.resize_with(class + 1, Vec::new);
        }
        self.free[class].push(run.first);
        self.live -= 1u64 << run.class;
    }

    /// Keys in live runs.
    #[cfg(test)]
    pub fn live(&self) -> u64 {
        self.live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_never_overlap_and_a_freed_run_comes_back_to_its_size() {
        let mut s = Slots::new();
        let a = s.alloc(10).unwrap();
        let b = s.alloc(3).unwrap();
        let c = s.alloc(16).unwrap();
        assert_eq!((a.first, b.first, c.first), (1, 17, 21));
        assert_eq!(s.live(), 16 + 4 + 16);
        s.free(a);
        // Another size does not take it; the same size does.
        assert_eq!(s.alloc(20).unwrap().first, 37);
        assert_eq!(s.alloc(9).unwrap().first, 1);
        s.free(b);
        s.free(c);
        assert_eq!(s.live(), 16 + 32);
    }

    #[test]
    fn the_key_space_ends_cleanly() {
        let mut s = Slots::new();
        assert!(s.alloc(1 << 31).is_some());
        // 2^31 + 1 keys used (key 0 is never handed out): another 2^31 does not fit.
        assert!(s.alloc(1 << 31).is_none());
        assert!(s.alloc(1 << 30).is_some());
    }
}
