//! What every svcproxy test shares, so there is one of each in the workspace:
//!
//! - [`objects`]: Kubernetes objects from YAML, through the same parser the `--manifests`
//!   source uses ([`svcproxy_core::manifest`]); test data that the proxy would reject or
//!   skip fails the test instead of vanishing.
//! - [`netns`]: network namespaces the test creates and deletes (also on panic, and
//!   leftovers of killed test processes), bounded command execution, and the one skip rule:
//!   a test that cannot run here (not root, a tool missing) prints `SKIP` and passes on a
//!   developer machine, and fails when `CI` or `SVCPROXY_E2E_REQUIRED` is set.
//! - [`confine`]: a cgroup and a bpffs of a test's own, for the eBPF data plane.
//! - [`pattern`]: a byte stream whose every byte a receiver can check (bulk
//!   transfers through the proxy).
//! - [`rng`]: a seeded generator for randomized tests that are the same at every run.
//! - [`scenario`]: the scenario directories under `testdata/scenarios/` (objects, config,
//!   expected intent, expected ruleset per backend), read once for the golden tests and
//!   the real-packet tests.
//!
//! A dev-dependency only (and of the test tools in `svcproxy-e2e`): nothing here
//! ships in the proxy.

pub mod confine;
pub mod netns;
pub mod objects;
pub mod pattern;
pub mod process;
pub mod rng;
pub mod scenario;
