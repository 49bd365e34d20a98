//! The kernel's plumbing the modes share, using none of them: the tools run and
//! bounded in time ([`command`]), netfilter's netlink ([`netfilter`]), nftables
//! tables written and probed ([`nft`]), conntrack entries deleted and its
//! settings written ([`conntrack`]), the node's sysctls ([`sysctl`]), this host's
//! addresses and interfaces ([`host_addrs`], [`xdp_features`]), the kernel's
//! listings compared ([`listing`]), the legacy iptables tables ([`xtables`]),
//! and kube-proxy's leftovers ([`kube_proxy`]).
//!
//! Nothing here decides about traffic: each piece does what a mode, or the sync's
//! orchestration, asks of the kernel.

pub mod command;
pub mod conntrack;
pub mod host_addrs;
pub mod kube_proxy;
pub mod listing;
pub mod netfilter;
pub mod nft;
pub mod sysctl;
pub mod xdp_features;
pub mod xtables;
