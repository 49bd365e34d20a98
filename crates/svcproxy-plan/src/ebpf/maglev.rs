//! Maglev hashing (Eisenbud et al., NSDI 2016), the `mh` scheduler's lookup
//! table: a prime number M of cells, each naming one endpoint of a list, filled
//! so that every endpoint holds about M/N cells and a change of one endpoint
//! moves few cells. The programs hash a flow to a cell.
//!
//! The table is a function of the endpoints' addresses and ports alone (not of
//! the node, the order they are listed in, or svcproxy's build): every node with
//! the same endpoints computes the same table, so a flow that an ECMP router
//! sends to another node meets the same endpoint there. The permutations use
//! FNV-1a with a fixed finaliser, written out here so that no library update can
//! change them.

use std::net::SocketAddr;

/// The table sizes, indexed by what the maps store (`route.mh_size`): primes
/// near powers of two, as IPVS's and Cilium's Maglev tables. Change only with
/// the C (`mh_cells()` in `bpf/lib/sched.h`).
pub const SIZES: [u32; 9] = [251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521];

/// Cells per endpoint the smallest fitting table aims for: the paper's M ≥ 100 N
/// keeps every endpoint within about 1% of its share.
pub const CELLS_PER_ENDPOINT: u32 = 100;

/// Cells per entry of the maps' table (`svcproxy_mh`): a table of M cells is
/// `ceil(M / CHUNK)` entries.
pub const CHUNK: usize = 256;

/// A list's Maglev table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    /// Index into [`SIZES`].
    pub size: u8,
    /// Each cell's endpoint, as its index in the list.
    pub cells: Vec<u16>,
}

/// The table size for `n` endpoints: the smallest of [`SIZES`] with
/// [`CELLS_PER_ENDPOINT`] cells per endpoint, else the largest; `None` when even
/// that has fewer cells than endpoints (the list is then chosen from at random).
pub fn size_for(n: usize) -> Option<u8> {
    let want = (n as u64).saturating_mul(u64::from(CELLS_PER_ENDPOINT));
    let i = SIZES
        .iter()
        .position(|&m| u64::from(m) >= want)
        .unwrap_or(SIZES.len() - 1);
    (n >= 1 && n <= SIZES[i] as usize).then_some(i as u8)
}

/// The table for `endpoints` (in the list's order); `None` as [`size_for`].
pub fn table(endpoints: &[SocketAddr]) -> Option<Table> {
    let size = size_for(endpoints.len())?;
    let m = u64::from(SIZES[size as usize]);
    // Filled in address order, whatever the list's order, so that the table
    // depends on the endpoints alone.
    let mut order: Vec<usize> = (0..endpoints.len()).collect();
    order.sort_by_key(|&i| endpoints[i]);
    let perms: Vec<(u64, u64)> = order
        .iter()
        .map(|&i| {
            let name = endpoints[i].to_string();
            let offset = hash(name.as_bytes(), 0) % m;
            let skip = hash(name.as_bytes(), 1) % (m - 1) + 1;
            (offset, skip)
        })
        .collect();
    let mut cells: Vec<Option<u16>> = vec![None; m as usize];
    let mut next = vec![0u64; order.len()];
    let mut filled = 0u64;
    'fill: loop {
        for (k, &(offset, skip)) in perms.iter().enumerate() {
            // Endpoint k's next preferred cell that is still free (its
            // permutation visits every cell: M is prime and skip < M).
            let cell = loop {
                let c = ((offset + next[k] * skip) % m) as usize;
                next[k] += 1;
                if cells[c].is_none() {
                    break c;
                }
            };
            cells[cell] = Some(order[k] as u16);
            filled += 1;
            if filled == m {
                break 'fill;
            }
        }
    }
    Some(Table {
        size,
        cells: cells.into_iter().map(|c| c.unwrap_or(0)).collect(),
    })
}

/// FNV-1a (64 bits) of `seed` then `bytes`, through splitmix64's finaliser.
fn hash(bytes: &[u8], seed: u8) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in std::iter::once(&seed).chain(bytes) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints(n: usize) -> Vec<SocketAddr> {
        (0..n)
            .map(|i| {
                format!("10.244.{}.{}:8080", i / 200, i % 200 + 2)
                    .parse()
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn sizes_are_prime_and_fit_the_endpoints() {
        for m in SIZES {
            assert!((2..m).take_while(|d| d * d <= m).all(|d| m % d != 0), "{m}");
        }
        assert_eq!(size_for(0), None);
        assert_eq!(SIZES[size_for(1).unwrap() as usize], 251);
        assert_eq!(SIZES[size_for(3).unwrap() as usize], 509);
        assert_eq!(SIZES[size_for(100).unwrap() as usize], 16381);
        // Past 655 endpoints the largest table, with fewer cells each.
        assert_eq!(SIZES[size_for(5000).unwrap() as usize], 65521);
        assert_eq!(size_for(65521), Some(8));
        assert_eq!(size_for(65522), None);
    }

    #[test]
    fn every_endpoint_holds_about_its_share() {
        for n in [1, 2, 3, 7, 10, 64] {
            let t = table(&endpoints(n)).unwrap();
            let m = t.cells.len();
            let mut counts = vec![0usize; n];
            for &c in &t.cells {
                counts[c as usize] += 1;
            }
            let share = m as f64 / n as f64;
            for (i, &c) in counts.iter().enumerate() {
                // Maglev's fill gives each endpoint ⌊M/N⌋ or ⌈M/N⌉ cells.
                assert!(
                    (c as f64 - share).abs() <= 1.0,
                    "n={n} endpoint {i}: {c} of {m}"
                );
            }
        }
    }

    #[test]
    fn the_table_depends_on_the_endpoints_alone() {
        let eps = endpoints(5);
        let a = table(&eps).unwrap();
        let mut reversed = eps.clone();
        reversed.reverse();
        let b = table(&reversed).unwrap();
        // The same endpoint in every cell, whatever the list's order.
        for (ca, cb) in a.cells.iter().zip(&b.cells) {
            assert_eq!(eps[*ca as usize], reversed[*cb as usize]);
        }
        // A fixed cell of a fixed list: the hash and the fill are part of the
        // wire (every node must agree, across versions).
        assert_eq!(a.cells[..8], [1, 2, 1, 2, 1, 4, 4, 4]);
    }

    #[test]
    fn removing_one_of_n_endpoints_moves_about_one_nth_of_the_cells() {
        for n in [4, 10, 32] {
            let before = endpoints(n);
            let gone = before[n / 2];
            let after: Vec<SocketAddr> = before.iter().copied().filter(|e| *e != gone).collect();
            let (a, b) = (table(&before).unwrap(), table(&after).unwrap());
            // The same size for N and N-1 here; moved: cells whose endpoint
            // changed although it is still there.
            assert_eq!(a.cells.len(), b.cells.len());
            let moved = a
                .cells
                .iter()
                .zip(&b.cells)
                .filter(|(x, y)| {
                    let (x, y) = (before[**x as usize], after[**y as usize]);
                    x != gone && x != y
                })
                .count();
            let m = a.cells.len() as f64;
            // The removed endpoint's cells (1/N) must move; of the others, the
            // paper measures a few percent.
            assert!(
                moved as f64 / m < 0.05,
                "n={n}: {moved} of {m} cells moved needlessly"
            );
        }
    }
}
