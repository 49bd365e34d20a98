//! Endpoint churn for soak runs: a steady stream of EndpointSlice changes, each one
//! pod replaced by another (a new address), stamped with
//! `endpoints.kubernetes.io/last-change-trigger-time` as the EndpointSlice controller
//! stamps its changes, so that a proxy's `kubeproxy_network_programming_duration_seconds`
//! measures from the change to the rules.
//!
//! Entry point: [`Churn`], made from a generated cluster ([`crate::scale::cluster`]);
//! the `svcproxy-fakeapi` binary applies its changes to its store (`--churn`) or
//! writes them as manifest files (`--manifests-out` with `--churn`).

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::util;

const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// Replacement pods get addresses in 10.200.0.0/16, reused round-robin: far more
/// than ever live at once, so a replaced address never collides with a live one.
const FRESH_BASE: u32 = 10 << 24 | 200 << 16;
const FRESH_COUNT: u32 = 65_534;

/// Cycles through a cluster's EndpointSlices, replacing one endpoint per change.
pub struct Churn {
    slices: Vec<Value>,
    changes: u64,
    fresh: u32,
}

impl Churn {
    /// Churns the EndpointSlices among `objects` that have endpoints.
    pub fn new(objects: &[Value]) -> Churn {
        let slices = objects
            .iter()
            .filter(|o| o["kind"] == "EndpointSlice")
            .filter(|o| o["endpoints"].as_array().is_some_and(|e| !e.is_empty()))
            .cloned()
            .collect();
        Churn {
            slices,
            changes: 0,
            fresh: 0,
        }
    }

    /// How many slices the churn goes through.
    pub fn len(&self) -> usize {
        self.slices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slices.is_empty()
    }

    /// The next change, made at `now`: the changed slice, whole (as a controller
    /// writes it), or None when there is nothing to churn.
    pub fn next_change(&mut self, now: SystemTime) -> Option<&Value> {
        if self.slices.is_empty() {
            return None;
        }
        let n = self.slices.len() as u64;
        let slice = &mut self.slices[(self.changes % n) as usize];
        let round = self.changes / n;
        self.changes += 1;
        let endpoints = slice["endpoints"].as_array_mut()?;
        let j = (round % endpoints.len() as u64) as usize;
        let ep = &mut endpoints[j];
        let addr = FRESH_BASE + 1 + self.fresh % FRESH_COUNT;
        self.fresh = self.fresh.wrapping_add(1);
        let addr = format!(
            "{}.{}.{}.{}",
            addr >> 24,
            (addr >> 16) & 255,
            (addr >> 8) & 255,
            addr & 255
        );
        ep["addresses"] = serde_json::json!([addr]);
        ep["conditions"] =
            serde_json::json!({"ready": true, "serving": true, "terminating": false});
        if let Some(name) = ep["targetRef"]["name"].as_str() {
            let base = name.split("-churn-").next().unwrap_or(name).to_string();
            ep["targetRef"]["name"] = Value::String(format!("{base}-churn-{}", self.fresh));
        }
        slice["metadata"]["annotations"][TRIGGER_TIME] = Value::String(rfc3339_millis(now));
        Some(slice)
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`, as Go's RFC3339Nano with the digits a change needs.
fn rfc3339_millis(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = util::rfc3339(d.as_secs());
    format!("{}.{:03}Z", secs.trim_end_matches('Z'), d.subsec_millis())
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::Duration;

    use super::*;

    #[test]
    fn each_change_replaces_one_endpoint_and_stamps_the_trigger_time() {
        let objects = crate::scale::cluster(3, 4, 2);
        let mut churn = Churn::new(&objects);
        assert_eq!(churn.len(), 3);
        let at = UNIX_EPOCH + Duration::from_millis(1_764_000_000_123);
        let mut seen = HashSet::new();
        for i in 0..12 {
            let slice = churn.next_change(at).unwrap().clone();
            assert_eq!(
                slice["metadata"]["annotations"][TRIGGER_TIME],
                "2025-11-24T16:00:00.123Z"
            );
            let addrs: Vec<&str> = slice["endpoints"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["addresses"][0].as_str().unwrap())
                .collect();
            let fresh: Vec<&&str> = addrs.iter().filter(|a| a.starts_with("10.200.")).collect();
            // Round r of the slice has replaced its first r+1 endpoints.
            assert_eq!(fresh.len(), i / 3 + 1, "{addrs:?}");
            assert!(seen.insert(slice["metadata"]["name"].to_string() + &i.to_string()));
        }
        assert!(Churn::new(&[]).next_change(at).is_none());
    }
}
