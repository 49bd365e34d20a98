//! svcproxy's cluster DNS: Kubernetes' DNS-based service discovery, answered from
//! the objects the proxy already reads.
//!
//! [`catalog`] is pure (source updates in, answers out); [`server`] puts it on UDP
//! and TCP with hickory-server, relaying other names to [`upstream`] resolvers;
//! [`probe`] asks one query, for tests and tools.

pub mod catalog;
pub mod limit;
pub mod probe;
pub mod server;
pub mod upstream;

pub use catalog::{Answer, Catalog, DnsConfig, SCHEMA_VERSION};
