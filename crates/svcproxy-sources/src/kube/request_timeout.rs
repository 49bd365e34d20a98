//! A timeout for every API request except watches: lists (each page), gets and
//! Events. A server that accepts a list and then goes silent would otherwise hold
//! that watch's re-list forever; with this, the request fails and the watcher retries
//! with backoff, the last state staying in force meanwhile.
//!
//! Entry point: [`RequestTimeoutLayer`], layered into kube's client stack. The
//! timeout bounds the wait for the response head and then for each piece of the
//! body, so a large list that keeps streaming is never cut off. Watches are left to
//! kube-runtime, whose idle timeout follows the watch's own `timeoutSeconds`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::Either;
use tower_http::timeout::TimeoutBody;
use tower_layer::Layer;
use tower_service::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A watch request (`watch=true`), which is long-lived by design.
fn is_watch<B>(req: &http::Request<B>) -> bool {
    req.uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
}

#[derive(Clone, Copy, Debug)]
pub struct RequestTimeoutLayer {
    timeout: Duration,
}

impl RequestTimeoutLayer {
    pub fn new(timeout: Duration) -> Self {
        RequestTimeoutLayer { timeout }
    }
}

impl<S> Layer<S> for RequestTimeoutLayer {
    type Service = RequestTimeout<S>;

    fn layer(&self, inner: S) -> RequestTimeout<S> {
        RequestTimeout {
            inner,
            timeout: self.timeout,
        }
    }
}

/// The service [`RequestTimeoutLayer`] makes.
#[derive(Clone, Debug)]
pub struct RequestTimeout<S> {
    inner: S,
    timeout: Duration,
}

/// The error of a request that timed out.
#[derive(Debug)]
struct Silent(Duration);

impl std::fmt::Display for Silent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no response from the API server within {:?}", self.0)
    }
}

impl std::error::Error for Silent {}

impl<S, ReqB, ResB> Service<http::Request<ReqB>> for RequestTimeout<S>
where
    S: Service<http::Request<ReqB>, Response = http::Response<ResB>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ResB: Send + 'static,
{
    type Response = http::Response<Either<TimeoutBody<ResB>, ResB>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        let watch = is_watch(&req);
        let timeout = self.timeout;
        let response = self.inner.call(req);
        Box::pin(async move {
            if watch {
                let res = response.await.map_err(Into::into)?;
                return Ok(res.map(Either::Right));
            }
            let res = tokio::time::timeout(timeout, response)
                .await
                .map_err(|_| Silent(timeout))?
                .map_err(Into::into)?;
            Ok(res.map(|body| Either::Left(TimeoutBody::new(timeout, body))))
        })
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use futures::stream::{self, StreamExt};
    use http_body::Frame;
    use http_body_util::{BodyExt, StreamBody};

    use super::*;

    type TestBody =
        StreamBody<futures::stream::BoxStream<'static, Result<Frame<Bytes>, std::io::Error>>>;

    /// Answers after `head` with a body of `chunks` chunks, one every `gap`, then
    /// (if `stall`) nothing more, ever.
    #[derive(Clone)]
    struct Server {
        head: Duration,
        chunks: usize,
        gap: Duration,
        stall: bool,
    }

    impl Service<http::Request<()>> for Server {
        type Response = http::Response<TestBody>;
        type Error = std::io::Error;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            let s = self.clone();
            Box::pin(async move {
                tokio::time::sleep(s.head).await;
                let gap = s.gap;
                let chunks = stream::iter(0..s.chunks).then(move |i| async move {
                    tokio::time::sleep(gap).await;
                    Ok(Frame::data(Bytes::from(format!("{i};"))))
                });
                let body = if s.stall {
                    chunks.chain(stream::pending()).boxed()
                } else {
                    chunks.boxed()
                };
                Ok(http::Response::new(StreamBody::new(body)))
            })
        }
    }

    async fn fetch(server: Server, uri: &str) -> Result<String, String> {
        let mut svc = RequestTimeoutLayer::new(Duration::from_secs(60)).layer(server);
        let req = http::Request::builder().uri(uri).body(()).unwrap();
        let res = svc.call(req).await.map_err(|e| e.to_string())?;
        let body = res.into_body().collect().await.map_err(|e| e.to_string())?;
        Ok(String::from_utf8(body.to_bytes().to_vec()).unwrap())
    }

    const LIST: &str = "/api/v1/nodes?limit=500";
    const WATCH: &str = "/api/v1/nodes?resourceVersion=7&watch=true&timeoutSeconds=290";

    #[tokio::test(start_paused = true)]
    async fn a_list_that_keeps_streaming_is_never_cut_off() {
        // 10 minutes in all, but never a minute without news.
        let server = Server {
            head: Duration::from_secs(50),
            chunks: 12,
            gap: Duration::from_secs(50),
            stall: false,
        };
        let body = fetch(server, LIST).await.unwrap();
        assert!(body.starts_with("0;1;") && body.ends_with("11;"), "{body}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_without_a_response_times_out() {
        let server = Server {
            head: Duration::from_secs(3600),
            chunks: 0,
            gap: Duration::ZERO,
            stall: false,
        };
        let start = tokio::time::Instant::now();
        let err = fetch(server, LIST).await.unwrap_err();
        assert_eq!(err, "no response from the API server within 60s");
        assert_eq!(start.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_that_stalls_half_way_times_out() {
        let server = Server {
            head: Duration::ZERO,
            chunks: 3,
            gap: Duration::from_secs(1),
            stall: true,
        };
        let start = tokio::time::Instant::now();
        let err = fetch(server, LIST).await.unwrap_err();
        assert_eq!(err, "data was not received within the designated timeout");
        assert_eq!(start.elapsed(), Duration::from_secs(63));
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_watch_is_left_alone() {
        // The watch goes quiet after two events; it is still open an hour later.
        let server = Server {
            head: Duration::ZERO,
            chunks: 2,
            gap: Duration::from_secs(1),
            stall: true,
        };
        let quiet = tokio::time::timeout(Duration::from_secs(3600), fetch(server, WATCH)).await;
        assert!(quiet.is_err(), "the watch ended: {quiet:?}");
    }
}
