//! client-go's retry of the answers the API server asks to be retried: a 429 or 5xx
//! response with a `Retry-After: SECONDS` header is tried again after that many
//! seconds, at most [`MAX_RETRIES`] times; any other answer, and the last one, goes
//! to the caller as it is.
//!
//! This replaces kube-rs' default retry layer, which retries every 429, 503 and 504
//! up to 15 times with a backoff growing to minutes: a watch from a resourceVersion
//! the server has not reached (504 "Too large resource version", after an etcd
//! restore) was hidden inside the client for about five minutes each time, so the
//! watch never saw the error that makes it re-list.
//!
//! Entry point: [`ServerRetryLayer`], layered outside the rate limiter and the
//! metrics layer, so that each attempt waits for the limiter and is counted, as
//! client-go's are.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use kube::client::Body;
use tower_layer::Layer;
use tower_service::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// client-go's `maxRetries` default.
pub const MAX_RETRIES: u32 = 10;

/// The longest wait one `Retry-After` may ask for. client-go has no cap; an absurd
/// header must not park a request for hours.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// How long the server asks the client to wait before trying again, if it does: a
/// 429 or 5xx with an integer `Retry-After` (client-go's `checkWait`).
pub fn retry_after(status: StatusCode, headers: &HeaderMap) -> Option<Duration> {
    if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    let secs: u64 = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs).min(MAX_WAIT))
}

#[derive(Clone, Copy, Debug)]
pub struct ServerRetryLayer {
    max_retries: u32,
}

impl ServerRetryLayer {
    pub fn new(max_retries: u32) -> Self {
        ServerRetryLayer { max_retries }
    }
}

impl<S> Layer<S> for ServerRetryLayer {
    type Service = ServerRetry<S>;

    fn layer(&self, inner: S) -> ServerRetry<S> {
        ServerRetry {
            inner,
            max_retries: self.max_retries,
        }
    }
}

/// The service [`ServerRetryLayer`] makes.
#[derive(Clone, Debug)]
pub struct ServerRetry<S> {
    inner: S,
    max_retries: u32,
}

/// A copy of `req` to send again, if its body can be replayed.
fn copy(req: &http::Request<Body>) -> Option<http::Request<Body>> {
    let mut again = http::Request::new(req.body().try_clone()?);
    *again.method_mut() = req.method().clone();
    *again.uri_mut() = req.uri().clone();
    *again.version_mut() = req.version();
    *again.headers_mut() = req.headers().clone();
    *again.extensions_mut() = req.extensions().clone();
    Some(again)
}

impl<S, ResB> Service<http::Request<Body>> for ServerRetry<S>
where
    S: Service<http::Request<Body>, Response = http::Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ResB: Send + 'static,
{
    type Response = http::Response<ResB>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        // The ready service takes this request; the clone left behind is polled
        // ready for the next one.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let max_retries = self.max_retries;
        Box::pin(async move {
            let mut req = req;
            let mut retries = 0;
            loop {
                let again = if retries < max_retries {
                    copy(&req)
                } else {
                    None
                };
                let res = inner.call(req).await.map_err(Into::into)?;
                let (Some(next), Some(wait)) = (again, retry_after(res.status(), res.headers()))
                else {
                    return Ok(res);
                };
                retries += 1;
                tracing::debug!(
                    status = res.status().as_u16(),
                    uri = %next.uri(),
                    retry = retries,
                    wait = ?wait,
                    "the API server asked for a retry"
                );
                drop(res);
                tokio::time::sleep(wait).await;
                std::future::poll_fn(|cx| inner.poll_ready(cx))
                    .await
                    .map_err(Into::into)?;
                req = next;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use super::*;

    /// Answers `status` with `Retry-After: 0` (if `retry_after`) for the first
    /// `failures` calls, then 200; counts the calls.
    #[derive(Clone)]
    struct Server {
        calls: Arc<AtomicU32>,
        failures: u32,
        status: StatusCode,
        retry_after: Option<&'static str>,
    }

    impl Service<http::Request<Body>> for Server {
        type Response = http::Response<()>;
        type Error = BoxError;
        type Future = std::future::Ready<Result<http::Response<()>, BoxError>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<Body>) -> Self::Future {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            let mut res = http::Response::new(());
            if n < self.failures {
                *res.status_mut() = self.status;
                if let Some(v) = self.retry_after {
                    res.headers_mut()
                        .insert(http::header::RETRY_AFTER, v.parse().unwrap());
                }
            }
            std::future::ready(Ok(res))
        }
    }

    async fn run(
        failures: u32,
        status: StatusCode,
        retry_after: Option<&'static str>,
    ) -> (u16, u32) {
        let calls = Arc::new(AtomicU32::new(0));
        let mut svc = ServerRetryLayer::new(MAX_RETRIES).layer(Server {
            calls: calls.clone(),
            failures,
            status,
            retry_after,
        });
        std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
        let req = http::Request::get("/api/v1/services")
            .body(Body::empty())
            .unwrap();
        let res = svc.call(req).await.unwrap();
        (res.status().as_u16(), calls.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn answers_asking_for_a_retry_are_retried_up_to_the_limit() {
        for status in [
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::GATEWAY_TIMEOUT,
            StatusCode::INTERNAL_SERVER_ERROR,
        ] {
            assert_eq!(run(3, status, Some("0")).await, (200, 4), "{status}");
            assert_eq!(
                run(100, status, Some("0")).await,
                (status.as_u16(), MAX_RETRIES + 1),
                "{status}: the last answer goes to the caller"
            );
        }
    }

    #[tokio::test]
    async fn answers_without_retry_after_go_to_the_caller_at_once() {
        // kube-rs' default layer would retry these 15 times with a growing backoff.
        for status in [StatusCode::GATEWAY_TIMEOUT, StatusCode::TOO_MANY_REQUESTS] {
            assert_eq!(run(1, status, None).await, (status.as_u16(), 1));
            assert_eq!(run(1, status, Some("soon")).await, (status.as_u16(), 1));
        }
        // Client errors are never retried, Retry-After or not.
        assert_eq!(run(1, StatusCode::GONE, Some("0")).await, (410, 1));
    }

    #[test]
    fn the_wait_is_the_servers_within_a_bound() {
        let mut h = HeaderMap::new();
        h.insert(http::header::RETRY_AFTER, "1".parse().unwrap());
        assert_eq!(
            retry_after(StatusCode::GATEWAY_TIMEOUT, &h),
            Some(Duration::from_secs(1))
        );
        h.insert(http::header::RETRY_AFTER, "86400".parse().unwrap());
        assert_eq!(
            retry_after(StatusCode::SERVICE_UNAVAILABLE, &h),
            Some(MAX_WAIT)
        );
        assert_eq!(retry_after(StatusCode::OK, &h), None);
    }
}
