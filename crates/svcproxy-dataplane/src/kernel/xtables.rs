//! The kernel's legacy iptables (`x_tables`) as it lists them: which tables of a
//! family exist, read from `/proc` without running a tool. Both the iptables
//! mode (is the legacy backend in use?) and kube-proxy's leftovers ask.

use svcproxy_core::model::IpFamily;

/// The legacy iptables tables of `family` in the calling thread's network
/// namespace (the kernel's list, one name a line); empty when the module is not
/// loaded, `None` when it cannot be read.
pub fn legacy_table_names(family: IpFamily) -> Option<String> {
    let path = match family {
        IpFamily::V4 => "/proc/thread-self/net/ip_tables_names",
        IpFamily::V6 => "/proc/thread-self/net/ip6_tables_names",
    };
    match std::fs::read_to_string(path) {
        Ok(names) => Some(names),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(String::new()),
        Err(_) => None,
    }
}
