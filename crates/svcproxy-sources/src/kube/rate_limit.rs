//! Client-side rate limiting of API requests: `clientConnection.qps` and `burst`, as
//! client-go's token bucket (a bucket of `burst` tokens refilled at `qps` per
//! second; a request takes one, waiting for it when the bucket is empty).
//!
//! Entry point: [`RateLimitLayer`], layered into kube's client stack. Watches are
//! long-lived, so this bounds how fast lists and watch (re)connections hit the API
//! server, for example after an outage when every watch re-lists at once. The pages
//! of one list after its first (`continue=` requests) take no token: client-go lists
//! from the watch cache in one request, where svcproxy pages by 500 objects to bound
//! its memory, and a 10k-Service cluster must not take 10 s to list at 5 qps.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower_layer::Layer;
use tower_service::Service;

/// A token bucket shared by every request of one client.
#[derive(Debug)]
struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// Takes a token if there is one; otherwise, how long until there is.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let refill = now.saturating_duration_since(self.last).as_secs_f64() * self.qps;
        self.tokens = (self.tokens + refill).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }

    /// Gives back a token taken for a request that turned out not to need one.
    fn refund(&mut self) {
        self.tokens = (self.tokens + 1.0).min(self.burst);
    }
}

/// A later page of a paginated list.
fn is_continuation<B>(req: &http::Request<B>) -> bool {
    req.uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv.starts_with("continue=")))
}

/// Limits requests to `qps` per second with bursts of `burst`.
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    /// `None`: unlimited.
    bucket: Option<Arc<Mutex<Bucket>>>,
}

impl RateLimitLayer {
    /// As client-go: a negative `qps` means no limit; a `burst` below 1 is 1.
    pub fn new(qps: f32, burst: u32) -> Self {
        let bucket = (qps > 0.0).then(|| {
            let burst = f64::from(burst.max(1));
            Arc::new(Mutex::new(Bucket {
                qps: f64::from(qps),
                burst,
                tokens: burst,
                last: Instant::now(),
            }))
        });
        RateLimitLayer { bucket }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            bucket: self.bucket.clone(),
            has_token: false,
            wait: None,
        }
    }
}

/// The service [`RateLimitLayer`] makes: ready once it holds a token and the inner
/// service is ready.
pub struct RateLimit<S> {
    inner: S,
    bucket: Option<Arc<Mutex<Bucket>>>,
    has_token: bool,
    wait: Option<Pin<Box<Sleep>>>,
}

impl<S, B> Service<http::Request<B>> for RateLimit<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if let (false, Some(bucket)) = (self.has_token, &self.bucket) {
            loop {
                if let Some(wait) = &mut self.wait {
                    if wait.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    self.wait = None;
                }
                let taken = bucket
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take(Instant::now());
                match taken {
                    Ok(()) => break,
                    Err(delay) => self.wait = Some(Box::pin(tokio::time::sleep(delay))),
                }
            }
            self.has_token = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> S::Future {
        if let (true, Some(bucket)) = (self.has_token, &self.bucket) {
            if is_continuation(&req) {
                bucket.lock().unwrap_or_else(|e| e.into_inner()).refund();
            }
        }
        self.has_token = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts calls; always ready.
    struct Counter(u32);

    impl Service<http::Request<()>> for Counter {
        type Response = u32;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<u32, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            self.0 += 1;
            std::future::ready(Ok(self.0))
        }
    }

    /// Sends requests for `uris` one after another; returns when each was sent.
    async fn send_uris(layer: &RateLimitLayer, uris: &[&str]) -> Vec<Duration> {
        let mut svc = layer.layer(Counter(0));
        let start = Instant::now();
        let mut at = Vec::new();
        for uri in uris {
            std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
            let req = http::Request::get(*uri).body(()).unwrap();
            svc.call(req).await.unwrap();
            at.push(start.elapsed());
        }
        at
    }

    /// Sends `n` list requests one after another.
    async fn send(layer: &RateLimitLayer, n: usize) -> Vec<Duration> {
        send_uris(layer, &vec!["/api/v1/services?limit=500"; n]).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_goes_at_once_then_requests_are_paced_at_qps() {
        let at = send(&RateLimitLayer::new(2.0, 3), 7).await;
        let ms: Vec<u128> = at.iter().map(Duration::as_millis).collect();
        // Three at once (the burst), then one every 500 ms.
        assert_eq!(ms, vec![0, 0, 0, 500, 1000, 1500, 2000]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_bucket_refills_up_to_burst_only() {
        let layer = RateLimitLayer::new(10.0, 2);
        send(&layer, 2).await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        let ms: Vec<u128> = send(&layer, 4)
            .await
            .iter()
            .map(Duration::as_millis)
            .collect();
        assert_eq!(ms, vec![0, 0, 100, 200]);
    }

    #[tokio::test(start_paused = true)]
    async fn later_pages_of_a_list_take_no_token() {
        let layer = RateLimitLayer::new(1.0, 1);
        let page = "/api/v1/nodes?limit=500&continue=abc";
        let first = "/api/v1/nodes?limit=500";
        let ms: Vec<u128> = send_uris(&layer, &[first, page, page, page, first])
            .await
            .iter()
            .map(Duration::as_millis)
            .collect();
        // The pages wait for the token like any request, then hand it back.
        assert_eq!(ms, vec![0, 1000, 1000, 1000, 1000]);
    }

    #[tokio::test(start_paused = true)]
    async fn negative_qps_means_unlimited() {
        let at = send(&RateLimitLayer::new(-1.0, 0), 100).await;
        assert!(at.iter().all(|d| d.is_zero()));
    }
}
