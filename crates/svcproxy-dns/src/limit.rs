//! Per-client query rate limit: a token bucket per source address, refilled at
//! `rate` per second up to `burst`. The table of clients is bounded: past
//! [`MAX_CLIENTS`] entries, those that have been idle long enough to be full again
//! are forgotten first (they would start full anyway), and if none has, the new
//! client is limited rather than the table grown.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Clients tracked at most.
pub const MAX_CLIENTS: usize = 100_000;

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Token buckets by client address.
#[derive(Debug)]
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    max_clients: usize,
    clients: HashMap<IpAddr, Bucket>,
}

impl RateLimiter {
    /// `rate` queries per second per client, `burst` at once (at least 1).
    pub fn new(rate: u32, burst: u32) -> Self {
        RateLimiter::with_capacity(rate, burst, MAX_CLIENTS)
    }

    /// [`RateLimiter::new`] tracking at most `max_clients` clients.
    pub fn with_capacity(rate: u32, burst: u32, max_clients: usize) -> Self {
        RateLimiter {
            rate: f64::from(rate.max(1)),
            burst: f64::from(burst.max(1)),
            max_clients: max_clients.max(1),
            clients: HashMap::new(),
        }
    }

    /// Whether `client` may have one more answer at `now`.
    pub fn allow(&mut self, client: IpAddr, now: Instant) -> bool {
        let (rate, burst) = (self.rate, self.burst);
        let refill = |b: &mut Bucket| {
            let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
            b.tokens = (b.tokens + elapsed * rate).min(burst);
            b.at = now;
        };
        if let Some(b) = self.clients.get_mut(&client) {
            refill(b);
        } else {
            if self.clients.len() >= self.max_clients {
                // Those idle long enough to be full again hold nothing worth keeping.
                let full_after = Duration::from_secs_f64(burst / rate);
                self.clients
                    .retain(|_, b| now.saturating_duration_since(b.at) < full_after);
                if self.clients.len() >= self.max_clients {
                    return false;
                }
            }
            self.clients.insert(
                client,
                Bucket {
                    tokens: burst,
                    at: now,
                },
            );
        }
        let b = self.clients.get_mut(&client).expect("just ensured");
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Clients tracked now.
    pub fn clients(&self) -> usize {
        self.clients.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate_per_client_and_a_bounded_table() {
        let mut l = RateLimiter::with_capacity(10, 5, 2);
        let t0 = Instant::now();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        let allowed = (0..20).filter(|_| l.allow(a, t0)).count();
        assert_eq!(allowed, 5, "the burst");
        assert!(l.allow(b, t0), "another client has its own bucket");
        // 100 ms later: one more token (10/s).
        assert!(l.allow(a, t0 + Duration::from_millis(100)));
        assert!(!l.allow(a, t0 + Duration::from_millis(100)));
        // The table is full (a, b) and nobody is idle: the newcomer is limited.
        assert!(!l.allow(c, t0 + Duration::from_millis(100)));
        assert_eq!(l.clients(), 2);
        // Once a and b have been idle long enough to be full again (0.5 s), they
        // are forgotten and c gets a bucket.
        assert!(l.allow(c, t0 + Duration::from_secs(1)));
        assert_eq!(l.clients(), 1);
    }
}
