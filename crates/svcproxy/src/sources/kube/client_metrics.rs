//! client-go's REST client metrics, which kube-proxy dashboards chart:
//! `rest_client_requests_total{code,host,method}` and
//! `rest_client_request_duration_seconds{host,verb}`, observed for every request of
//! kube's client stack (lists, watches, gets, Events).
//!
//! Entry point: [`ClientMetricsLayer`], layered into the client with the
//! [`RestClientMetrics`] the metrics registry owns. As client-go, the duration is up to
//! the response head (a watch counts as answered once the server accepted it), `code`
//! is the HTTP status, or `<error>` when no response came, and `host` the server's
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
        let method = req.method().as_str().to_string();
        let layer = self.layer.clone();
        let start = Instant::now();
        let response = self.inner.call(req);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(res) => res.status().as_u16().to_string(),
                Err(_) => "<error>".to_string(),
            };
            let m = &layer.metrics;
            m.duration
                .with_label_values(&[layer.host.as_str(), method.as_str()])
                .observe(start.elapsed().as_secs_f64());
            m.requests
                .with_label_values(&[code.as_str(), layer.host.as_str(), method.as_str()])
                .inc();
            result
        })
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
}
