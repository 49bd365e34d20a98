//! The workspace's one network-namespace helper and skip rule (`svcproxy-testkit`),
//! wrapped in a local type so each test file can add the methods it needs.

use std::ops::Deref;

#[allow(unused_imports)] // one test binary uses it
pub use svcproxy_testkit::netns::skip;

/// A throwaway namespace `svp-<pid>-<n>-<tag>`, deleted when dropped (even when the
/// test panics).
pub struct Netns(svcproxy_testkit::netns::Netns);

impl Netns {
    /// The namespace, if running as root with `ip` and every tool in `tools`; otherwise
    /// the skip rule: SKIP on a developer machine, a failure under `CI`.
    pub fn create(test: &str, tag: &str, tools: &[&str]) -> Option<Netns> {
        svcproxy_testkit::netns::Netns::create(test, tag, tools).map(Netns)
    }
}

impl Deref for Netns {
    type Target = svcproxy_testkit::netns::Netns;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}
