//! Endpoint weights as the programs see them. For `wrr`, `random`, `sh` and
//! `mh` a weighted list is written with each endpoint in as many slots as its
//! weight, in IPVS's weighted round-robin order (its `wrr` interleaving), so that
//! the programs' choices over slots give each endpoint its share: `wrr` takes the
//! slots in turn, the others weigh by the slots an endpoint holds. For `wlc`,
//! `sed` and `nq` each endpoint keeps one slot, which carries its weight.

/// The most slots a weighted list takes; weights whose round is longer are
/// scaled down to fit (each at least 1).
pub const MAX_SLOTS: usize = 4096;

/// The slots of a weighted list: indices into `weights` (each endpoint's weight,
/// all ≥ 1), in the order IPVS's `wrr` gives them: each round visits the
/// endpoints in order and takes those whose weight reaches the current
/// threshold, which falls by the weights' greatest common divisor each round.
pub fn schedule(weights: &[u8]) -> Vec<u16> {
    let mut w: Vec<u32> = weights.iter().map(|&w| u32::from(w.max(1))).collect();
    if w.is_empty() {
        return Vec::new();
    }
    let slots = |w: &[u32]| {
        let g = w.iter().copied().fold(0, gcd);
        w.iter().map(|x| (x / g) as usize).sum::<usize>()
    };
    let len = slots(&w);
    if len > MAX_SLOTS {
        let total: u64 = w.iter().map(|&x| u64::from(x)).sum();
        for x in &mut w {
            *x = ((u64::from(*x) * MAX_SLOTS as u64 / total) as u32).max(1);
        }
    }
    let g = w.iter().copied().fold(0, gcd);
    let max = *w.iter().max().expect("not empty");
    let mut out = Vec::with_capacity(slots(&w));
    let mut threshold = max;
    loop {
        for (i, &x) in w.iter().enumerate() {
            if x >= threshold {
                out.push(i as u16);
            }
        }
        if threshold <= g {
            break;
        }
        threshold -= g;
    }
    out
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_endpoint_takes_its_weight_in_ipvs_order() {
        // IPVS's wrr for weights 4, 3, 2: a a a b a b c b c... by threshold
        // 4: a; 3: a b; 2: a b c; 1: a b c.
        assert_eq!(schedule(&[4, 3, 2]), [0, 0, 1, 0, 1, 2, 0, 1, 2]);
        // Equal weights: plain turns.
        assert_eq!(schedule(&[1, 1, 1]), [0, 1, 2]);
        // The common divisor is taken out.
        assert_eq!(schedule(&[6, 2]), [0, 0, 0, 1]);
    }

    #[test]
    fn a_long_round_is_scaled_down_keeping_the_shares() {
        let weights: Vec<u8> = (0..1000)
            .map(|i| if i % 2 == 0 { 255 } else { 254 })
            .collect();
        let s = schedule(&weights);
        assert!(s.len() <= MAX_SLOTS + weights.len(), "{}", s.len());
        let mut count = vec![0usize; weights.len()];
        for i in s {
            count[i as usize] += 1;
        }
        assert!(count.iter().all(|c| *c >= 1));
    }
}
