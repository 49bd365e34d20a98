//! client-go's REST client metrics, which kube-proxy dashboards chart:
//! `rest_client_requests_total{code,host,method}` and
//! `rest_client_request_duration_seconds{host,verb}`, observed for every request of
//! kube's client stack (lists, watches, gets, Events).
//!
//! Entry point: [`ClientMetricsLayer`], layered into the client with the
//! [`RestClientMetrics`] the metrics registry owns. As client-go, the duration is up to
//! the response head (a watch counts as answered once the server accepted it), `code`
//! is the HTTP status, or `<error>` when no response came (a request the timeout
//! ended included), and `host` the server's
//! `host:port`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus::{HistogramVec, IntCounterVec};
use tower_layer::Layer;
use tower_service::Service;

/// The two metric families, registered by `http::metrics::Metrics`.
#[derive(Clone, Debug)]
pub struct RestClientMetrics {
    pub requests: IntCounterVec,
    pub duration: HistogramVec,
}

impl RestClientMetrics {
    /// The families with client-go's names, help texts, labels and buckets, not yet
    /// in any registry.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let requests = IntCounterVec::new(
            prometheus::Opts::new(
                "rest_client_requests_total",
                "[ALPHA] Number of HTTP requests, partitioned by status code, method, and host.",
            ),
            &["code", "host", "method"],
        )
        .expect("valid counter");
        let duration = HistogramVec::new(
            prometheus::HistogramOpts::new(
                "rest_client_request_duration_seconds",
                "[ALPHA] Request latency in seconds. Broken down by verb, and host.",
            )
            .buckets(vec![
                0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
            ]),
            &["host", "verb"],
        )
        .expect("valid histogram");
        RestClientMetrics { requests, duration }
    }
}

#[derive(Clone, Debug)]
pub struct ClientMetricsLayer {
    metrics: RestClientMetrics,
    host: String,
}

impl ClientMetricsLayer {
    /// Observes requests to the server at `host` (`host:port`).
    pub fn new(metrics: RestClientMetrics, host: String) -> Self {
        ClientMetricsLayer { metrics, host }
    }
}

impl<S> Layer<S> for ClientMetricsLayer {
    type Service = ClientMetrics<S>;

    fn layer(&self, inner: S) -> ClientMetrics<S> {
        ClientMetrics {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`ClientMetricsLayer`] makes.
#[derive(Clone, Debug)]
pub struct ClientMetrics<S> {
    inner: S,
    layer: ClientMetricsLayer,
}

impl<S, ReqB, ResB> Service<http::Request<ReqB>> for ClientMetrics<S>
where
    S: Service<http::Request<ReqB>, Response = http::Response<ResB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResB: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        let mut pending = Pending {
            layer: self.layer.clone(),
            method: req.method().as_str().to_string(),
            start: Instant::now(),
            observed: false,
        };
        let response = self.inner.call(req);
        Box::pin(async move {
            let result = response.await;
            match &result {
                Ok(res) => pending.observe(&res.status().as_u16().to_string()),
                Err(_) => pending.observe(ERROR),
            }
            result
        })
    }
}

/// What client-go's `code` label says of a request that got no response.
const ERROR: &str = "<error>";

/// One request in flight. Dropped before it was observed (a request timeout, or the
/// caller giving up), it counts as a request without a response, as client-go counts
/// a request whose context ended.
struct Pending {
    layer: ClientMetricsLayer,
    method: String,
    start: Instant,
    observed: bool,
}

impl Pending {
    fn observe(&mut self, code: &str) {
        self.observed = true;
        let (m, host) = (&self.layer.metrics, self.layer.host.as_str());
        m.duration
            .with_label_values(&[host, self.method.as_str()])
            .observe(self.start.elapsed().as_secs_f64());
        m.requests
            .with_label_values(&[code, host, self.method.as_str()])
            .inc();
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.observed {
            self.observe(ERROR);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{HistogramOpts, Opts};

    #[derive(Clone)]
    struct Fixed(Option<u16>);

    impl Service<http::Request<()>> for Fixed {
        type Response = http::Response<()>;
        type Error = &'static str;
        type Future = std::future::Ready<Result<http::Response<()>, &'static str>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            std::future::ready(match self.0 {
                Some(code) => Ok(http::Response::builder().status(code).body(()).unwrap()),
                None => Err("connection refused"),
            })
        }
    }

    #[tokio::test]
    async fn counts_by_code_host_and_method() {
        let metrics = RestClientMetrics {
            requests: IntCounterVec::new(Opts::new("r", "r"), &["code", "host", "method"]).unwrap(),
            duration: HistogramVec::new(HistogramOpts::new("d", "d"), &["host", "verb"]).unwrap(),
        };
        let layer = ClientMetricsLayer::new(metrics.clone(), "10.0.0.1:6443".to_string());
        let get = || http::Request::get("/api/v1/nodes").body(()).unwrap();
        let mut ok = layer.layer(Fixed(Some(200)));
        ok.call(get()).await.unwrap();
        ok.call(get()).await.unwrap();
        let mut gone = layer.layer(Fixed(Some(410)));
        gone.call(get()).await.unwrap();
        let mut down = layer.layer(Fixed(None));
        assert!(down.call(get()).await.is_err());
        let count = |code: &str| {
            metrics
                .requests
                .with_label_values(&[code, "10.0.0.1:6443", "GET"])
                .get()
        };
        assert_eq!((count("200"), count("410"), count("<error>")), (2, 1, 1));
        let h = metrics
            .duration
            .with_label_values(&["10.0.0.1:6443", "GET"]);
        assert_eq!(h.get_sample_count(), 4);
    }

    /// Never answers.
    #[derive(Clone)]
    struct Silent;

    impl Service<http::Request<()>> for Silent {
        type Response = http::Response<()>;
        type Error = &'static str;
        type Future = std::future::Pending<Result<http::Response<()>, &'static str>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            std::future::pending()
        }
    }

    #[tokio::test]
    async fn a_request_ended_by_the_timeout_counts_as_an_error() {
        let metrics = RestClientMetrics::new();
        let layer = ClientMetricsLayer::new(metrics.clone(), "10.0.0.1:6443".to_string());
        // The timeout layer sits outside this one and drops the request's future.
        let mut svc = super::super::request_timeout::RequestTimeoutLayer::new(
            std::time::Duration::from_millis(50),
        )
        .layer(layer.layer(Silent));
        let get = http::Request::get("/api/v1/nodes").body(()).unwrap();
        assert!(svc.call(get).await.is_err());
        assert_eq!(
            metrics
                .requests
                .with_label_values(&["<error>", "10.0.0.1:6443", "GET"])
                .get(),
            1
        );
        let h = metrics
            .duration
            .with_label_values(&["10.0.0.1:6443", "GET"]);
        assert_eq!(h.get_sample_count(), 1);
        assert!(h.get_sample_sum() >= 0.05);
    }
}
