//! svcproxy's own figures of its life on a node, beside kube-proxy's: where a
//! sync's time goes, how long the start took, and how this process came to own
//! the node (the hand-over).
//!
//! - `svcproxy_sync_step_duration_seconds{step}` (histogram, the sync buckets):
//!   each successful kernel sync's `decide`, `translate`, `apply` and `conntrack`
//!   steps ([`svcproxy_sync::SyncSteps`]);
//! - `svcproxy_sync_failures_total`: failed syncs, in every mode (kube-proxy's
//!   failure counters are per mode, and the ebpf and ipvs modes have none);
//! - `svcproxy_startup_duration_seconds{step}` (gauge, seconds from the process's
//!   start): `listed` when every source had listed (the first sync may run),
//!   `programmed` when the first sync as the node's owner was in the kernel;
//! - `svcproxy_ownership{how}` (gauge, 1 on the current way): how this process
//!   came to program the node: `first` (nobody held it), `handed_over` (its
//!   predecessor handed over, sealing its rules), `took_over` (it waited as a
//!   standby and the owner went without handing over), `unlocked` (the lock could
//!   not be taken; the node is programmed without it);
//! - `svcproxy_ownership_duration_seconds{phase}` (gauge): `standby`, how long
//!   it waited as a standby (0: never), and `take_over`, from its first sync
//!   attempt as the owner to that sync in the kernel (a standby's is asked for the
//!   moment it owns the node; the first owner's once every source has listed);
//! - `svcproxy_first_sync_adopted` (gauge): 1 when that first sync took the
//!   predecessor's sealed objects as they were, writing nothing.
//!
//! A standby serves no metrics (the owner holds the port): these are the new
//! owner's, once it has taken over.

use std::time::Duration;

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntGauge, IntGaugeVec, Opts, Registry,
};

use super::{register, sync_buckets};

/// How this process came to program the node (`svcproxy_ownership{how}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnershipHow {
    First,
    HandedOver,
    TookOver,
    Unlocked,
}

impl OwnershipHow {
    pub const ALL: [OwnershipHow; 4] = [
        OwnershipHow::First,
        OwnershipHow::HandedOver,
        OwnershipHow::TookOver,
        OwnershipHow::Unlocked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OwnershipHow::First => "first",
            OwnershipHow::HandedOver => "handed_over",
            OwnershipHow::TookOver => "took_over",
            OwnershipHow::Unlocked => "unlocked",
        }
    }
}

/// How the first sync as owner went, for the ownership series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ownership {
    pub how: OwnershipHow,
    /// How long the process waited as a standby.
    pub standby: Duration,
    /// From owning the node to the first sync in the kernel.
    pub take_over: Duration,
    /// That sync adopted the predecessor's sealed objects.
    pub adopted: bool,
}

pub(super) struct LifecycleSeries {
    steps: HistogramVec,
    failures: IntCounter,
    startup: GaugeVec,
    ownership: IntGaugeVec,
    ownership_duration: GaugeVec,
    adopted: IntGauge,
}

impl LifecycleSeries {
    pub(super) fn register(r: &Registry) -> Self {
        let series = LifecycleSeries {
            steps: register(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "svcproxy_sync_step_duration_seconds",
                        "Each successful sync's time by step: decide (the changed service \
                         ports decided again), translate (the data plane's objects worked \
                         out), apply (written to the kernel), conntrack (UDP cleanup)",
                    )
                    .buckets(sync_buckets()),
                    &["step"],
                )
                .expect("valid histogram"),
            ),
            failures: register(
                r,
                IntCounter::new(
                    "svcproxy_sync_failures_total",
                    "Syncs that failed to bring the kernel to the snapshot (the previous \
                     rules stay in force; retried with backoff), in every mode",
                )
                .expect("valid counter"),
            ),
            startup: register(
                r,
                GaugeVec::new(
                    Opts::new(
                        "svcproxy_startup_duration_seconds",
                        "Seconds from the process's start to each start-up step: listed \
                         (every source had listed), programmed (the first sync as the \
                         node's owner was in the kernel)",
                    ),
                    &["step"],
                )
                .expect("valid gauge"),
            ),
            ownership: register(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "svcproxy_ownership",
                        "How this process came to program the node (1 on the way it did): \
                         first, handed_over, took_over (its owner went without handing \
                         over), unlocked (without the lock)",
                    ),
                    &["how"],
                )
                .expect("valid gauge"),
            ),
            ownership_duration: register(
                r,
                GaugeVec::new(
                    Opts::new(
                        "svcproxy_ownership_duration_seconds",
                        "standby: how long this process waited as a standby; take_over: \
                         from its first sync attempt as the node's owner to that sync in \
                         the kernel",
                    ),
                    &["phase"],
                )
                .expect("valid gauge"),
            ),
            adopted: register(
                r,
                IntGauge::new(
                    "svcproxy_first_sync_adopted",
                    "1 when the first sync as owner took the predecessor's sealed objects \
                     as they were, writing nothing",
                )
                .expect("valid gauge"),
            ),
        };
        for (step, _) in svcproxy_sync::SyncSteps::default().labelled() {
            series.steps.with_label_values(&[step]);
        }
        series
    }

    pub(super) fn observe_steps(&self, steps: &svcproxy_sync::SyncSteps) {
        for (step, d) in steps.labelled() {
            self.steps
                .with_label_values(&[step])
                .observe(d.as_secs_f64());
        }
    }

    pub(super) fn sync_failed(&self) {
        self.failures.inc();
    }

    pub(super) fn startup_step(&self, step: &str, since_start: Duration) {
        self.startup
            .with_label_values(&[step])
            .set(since_start.as_secs_f64());
    }

    pub(super) fn set_ownership(&self, o: &Ownership) {
        for how in OwnershipHow::ALL {
            self.ownership
                .with_label_values(&[how.as_str()])
                .set(i64::from(how == o.how));
        }
        self.ownership_duration
            .with_label_values(&["standby"])
            .set(o.standby.as_secs_f64());
        self.ownership_duration
            .with_label_values(&["take_over"])
            .set(o.take_over.as_secs_f64());
        self.adopted.set(i64::from(o.adopted));
    }
}

#[cfg(test)]
mod tests {
    use super::super::Metrics;
    use super::*;

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    #[test]
    fn steps_start_up_and_ownership_are_exported() {
        let m = Metrics::new();
        // Every step's histogram exists before the first sync.
        let text = m.render();
        for step in ["decide", "translate", "apply", "conntrack"] {
            let count = format!("svcproxy_sync_step_duration_seconds_count{{step=\"{step}\"}}");
            assert_eq!(value(&text, &count), Some(0.0), "{text}");
        }
        m.observe_sync_steps(&svcproxy_sync::SyncSteps {
            decide: Duration::from_millis(3),
            translate: Duration::from_millis(20),
            apply: Duration::from_millis(700),
            conntrack: Duration::ZERO,
        });
        m.startup_step("listed");
        m.set_ownership(&Ownership {
            how: OwnershipHow::HandedOver,
            standby: Duration::from_secs(42),
            take_over: Duration::from_millis(250),
            adopted: true,
        });
        let text = m.render();
        let apply = "svcproxy_sync_step_duration_seconds_sum{step=\"apply\"}";
        assert_eq!(value(&text, apply), Some(0.7), "{text}");
        // 700 ms is in the 1.024 s bucket, not in the 0.512 s one.
        assert_eq!(
            value(
                &text,
                "svcproxy_sync_step_duration_seconds_bucket{step=\"apply\",le=\"0.512\"}"
            ),
            Some(0.0)
        );
        assert_eq!(
            value(
                &text,
                "svcproxy_sync_step_duration_seconds_bucket{step=\"apply\",le=\"1.024\"}"
            ),
            Some(1.0)
        );
        let listed = value(&text, "svcproxy_startup_duration_seconds{step=\"listed\"}");
        assert!(listed.is_some_and(|s| (0.0..60.0).contains(&s)), "{text}");
        assert!(
            !text.contains("step=\"programmed\""),
            "not programmed yet: {text}"
        );
        for (how, want) in [
            ("first", 0.0),
            ("handed_over", 1.0),
            ("took_over", 0.0),
            ("unlocked", 0.0),
        ] {
            assert_eq!(
                value(&text, &format!("svcproxy_ownership{{how=\"{how}\"}}")),
                Some(want),
                "{how}: {text}"
            );
        }
        assert_eq!(
            value(
                &text,
                "svcproxy_ownership_duration_seconds{phase=\"standby\"}"
            ),
            Some(42.0)
        );
        assert_eq!(
            value(
                &text,
                "svcproxy_ownership_duration_seconds{phase=\"take_over\"}"
            ),
            Some(0.25)
        );
        assert_eq!(value(&text, "svcproxy_first_sync_adopted"), Some(1.0));
        // A failed sync counts in every mode, ebpf's (which has no kube-proxy
        // counter) included.
        let ebpf = Metrics::for_backend(svcproxy_dataplane::resolve_mode("ebpf").unwrap().backend);
        assert_eq!(
            value(&ebpf.render(), "svcproxy_sync_failures_total"),
            Some(0.0)
        );
        ebpf.sync_failed(false);
        assert_eq!(
            value(&ebpf.render(), "svcproxy_sync_failures_total"),
            Some(1.0)
        );
    }
}
