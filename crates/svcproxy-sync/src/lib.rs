//! svcproxy-sync: the sync's orchestration, between the pure plan and the data
//! planes that touch the kernel.
//!
//! snapshot → intent → conflicts → the mode's [`DataPlane`] → the conntrack
//! entries the intent's change left stale:
//!
//! - [`Intents`]: the intent kept from sync to sync, its delta, and the logging
//!   of what it refuses (conflicting claims, ServiceCIDRs holding a node
//!   address); every consumer takes its intent from here;
//! - [`Driver`]: one data plane with what every mode shares around its sync
//!   (adoption of a predecessor's sealed rules, the seal at a hand-over,
//!   conntrack cleanup, the conntrack sysctls once);
//! - [`conntrack`]: which UDP entries a change leaves stale, from the intent's
//!   change ([`UdpChanges`]) or, at the first sync, from the intent itself;
//! - [`Target`]: where a sync's snapshot goes: the kernel ([`Driver`]) or a
//!   one-shot tool's printer ([`print`](mod@print): `snapshot`, `explain`, `render`).
//!
//! The binary's runner decides when to sync; the data plane crate only touches
//! the kernel.
//!
//! [`DataPlane`]: svcproxy_dataplane::DataPlane

pub mod conntrack;
mod driver;
mod intents;
pub mod print;
mod target;

pub use conntrack::UdpChanges;
pub use driver::{seal_of, Driver, SyncReport, SyncSteps};
pub use intents::Intents;
pub use target::{Checked, DnsOnly, SyncDone, SyncError, Target};
