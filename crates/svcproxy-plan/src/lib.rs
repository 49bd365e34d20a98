//! svcproxy-plan: the pure part of turning a node's snapshot into rules.
//!
//! Two layers, both pure (no I/O, no tokio, no kernel):
//!
//! - [`intent`]: the backend-neutral intent. From the per-node snapshots
//!   ([`svcproxy_core::snapshot::NodeSnapshot`]) and the configuration
//!   ([`PlanConfig`]), per IP family: every frontend (cluster IP, external IP,
//!   load-balancer IP, NodePort) and what happens to a connection to it (forward
//!   to an endpoint set, with its masquerade rule and affinity; drop; reject), the
//!   loadBalancerSourceRanges firewall, and the node-wide parts. Every decision that
//!   is not syntax is made there, once; [`intent::IntentBuilder::update`] also says
//!   what changed, for partial syncs.
//! - One module per data plane that translates the intent into its own syntax and
//!   decides nothing: [`nft`], [`iptables`], [`ebpf`] (map contents).
//!
//! [`names`] holds the hashed object names every backend uses (stable, short,
//! injection-proof).

pub mod config;
pub mod ebpf;
pub mod explain;
pub mod intent;
pub mod iptables;
pub mod names;
pub mod nft;

pub use config::{
    holds_loopback, ConfigError, InterfaceName, LocalDetection, LocalhostGate, LocalhostNodePorts,
    ModeSemantics, NodePortAddresses, PlanConfig,
};
pub use intent::{build_intent, Conflict, Intent, IntentBuilder, IntentDelta};
