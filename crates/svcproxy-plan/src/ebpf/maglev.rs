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
pub const SIZES: [u32; 10] = svcproxy_core::model::MAGLEV_TABLE_SIZES;

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

/// The index in [`SIZES`] of a table of `cells` cells; `None` when it is not
/// one of them.
pub fn size_index(cells: u32) -> Option<u8> {
    SIZES.iter().position(|&m| m == cells).map(|i| i as u8)
}

/// Whether a list of `n` slots has a table of `cells` cells: one of [`SIZES`],
/// with a cell for every slot, each slot named in 16 bits (a longer list is
/// chosen from at random).
pub fn fits(n: usize, cells: u32) -> bool {
    size_index(cells).is_some() && n >= 1 && n <= cells as usize && n <= 1 << 16
}

/// The table of `cells` cells for `endpoints` (in the list's order, a weighted
/// endpoint once per slot it holds); `None` when they do not fit ([`fits`]).
///
/// The size is the service's, whatever the number of endpoints: an endpoint
/// added or removed then takes or gives up only about its share of the cells,
/// as IPVS's `mh` and Cilium keep it (a size that followed the count would move
/// almost every flow when the count crossed a size). Each round every slot takes
/// its next preferred free cell, so an endpoint holding k slots gets about k
/// shares.
pub fn table(endpoints: &[SocketAddr], cells: u32) -> Option<Table> {
    if !fits(endpoints.len(), cells) {
        return None;
    }
    let size = size_index(cells)?;
    let m = u64::from(cells);
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
    let mut table: Vec<Option<u16>> = vec![None; m as usize];
    let mut next = vec![0u64; order.len()];
    let mut filled = 0u64;
    'fill: loop {
        for (k, &(offset, skip)) in perms.iter().enumerate() {
            // Endpoint k's next preferred cell that is still free (its
            // permutation visits every cell: M is prime and skip < M).
            let cell = loop {
                let c = ((offset + next[k] * skip) % m) as usize;
                next[k] += 1;
                if table[c].is_none() {
                    break c;
                }
            };
            table[cell] = Some(order[k] as u16);
            filled += 1;
            if filled == m {
                break 'fill;
            }
        }
    }
    Some(Table {
        size,
        cells: table.into_iter().map(|c| c.unwrap_or(0)).collect(),
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

    const M: u32 = svcproxy_core::model::DEFAULT_MAGLEV_TABLE_SIZE;

    #[test]
    fn sizes_are_prime_and_a_list_fits_one_with_a_cell_per_slot() {
        for m in SIZES {
            assert!((2..m).take_while(|d| d * d <= m).all(|d| m % d != 0), "{m}");
        }
        assert_eq!(size_index(16381), Some(6));
        assert_eq!(size_index(131071), Some(9));
        assert_eq!(size_index(16384), None);
        assert!(fits(1, 251) && fits(251, 251));
        assert!(!fits(0, 251) && !fits(252, 251) && !fits(10, 1000));
        assert!(table(&endpoints(300), 251).is_none());
    }

    #[test]
    fn every_endpoint_holds_about_its_share() {
        for n in [1, 2, 3, 7, 10, 64] {
            let t = table(&endpoints(n), M).unwrap();
            let m = t.cells.len();
            assert_eq!(m, M as usize);
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
    fn an_endpoint_in_k_slots_holds_about_k_shares() {
        // Weights 1, 2, 3: the list holds them in 1, 2, 3 slots.
        let e = endpoints(3);
        let slots = [e[0], e[1], e[1], e[2], e[2], e[2]];
        let t = table(&slots, M).unwrap();
        let mut counts = [0usize; 3];
        for &c in &t.cells {
            counts[e.iter().position(|x| *x == slots[c as usize]).unwrap()] += 1;
        }
        let share = f64::from(M) / 6.0;
        for (i, &c) in counts.iter().enumerate() {
            let want = share * (i + 1) as f64;
            assert!(
                (c as f64 - want).abs() <= 3.0,
                "weight {}: {c} cells, {want} wanted",
                i + 1
            );
        }
    }

    #[test]
    fn the_table_depends_on_the_endpoints_and_its_size_alone() {
        let eps = endpoints(5);
        let a = table(&eps, 509).unwrap();
        let mut reversed = eps.clone();
        reversed.reverse();
        let b = table(&reversed, 509).unwrap();
        // The same endpoint in every cell, whatever the list's order.
        for (ca, cb) in a.cells.iter().zip(&b.cells) {
            assert_eq!(eps[*ca as usize], reversed[*cb as usize]);
        }
        // A fixed cell of a fixed list: the hash and the fill are part of the
        // wire (every node must agree, across versions).
        assert_eq!(a.cells[..8], [1, 2, 1, 2, 1, 4, 4, 4]);
    }

    /// The cells of `before`'s table whose endpoint is still there but changed
    /// in `after`'s, as a share of the cells of the endpoints still there.
    fn moved_of_the_others(before: &[SocketAddr], after: &[SocketAddr], cells: u32) -> f64 {
        let (a, b) = (table(before, cells).unwrap(), table(after, cells).unwrap());
        let (mut others, mut moved) = (0usize, 0usize);
        for (x, y) in a.cells.iter().zip(&b.cells) {
            let (x, y) = (before[*x as usize], after[*y as usize]);
            if after.contains(&x) {
                others += 1;
                if x != y {
                    moved += 1;
                }
            }
        }
        moved as f64 / others as f64
    }

    #[test]
    fn removing_one_of_n_endpoints_moves_at_most_one_nth_and_two_percent_of_the_others() {
        for n in 2..=100 {
            let before = endpoints(n);
            let gone = before[n / 2];
            let after: Vec<SocketAddr> = before.iter().copied().filter(|e| *e != gone).collect();
            let moved = moved_of_the_others(&before, &after, M);
            assert!(
                moved <= 1.0 / n as f64 + 0.02,
                "n={n}: {:.1}% of the other endpoints' cells moved",
                moved * 100.0
            );
        }
    }

    #[test]
    fn a_count_crossing_what_used_to_be_a_size_boundary_keeps_the_flows() {
        // 6 to 5 endpoints: a table sized from the count went from 1021 cells to
        // 509 and kept 17% of the surviving flows; one size keeps nearly all.
        let before = endpoints(6);
        let after = &before[..5];
        assert!(moved_of_the_others(&before, after, M) < 0.05);
    }
}
