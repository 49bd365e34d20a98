//! Drift: the links that should be pinned and are not ([`missing_links`]; the
//! packet programs' per interface, [`Kernel::missing_links`]), and what of
//! svcproxy's is pinned ([`pinned`]).

use std::path::Path;

use super::load::{socket_programs, TC_PROGRAMS};
use super::maps::MAPS;
use super::Kernel;

impl Kernel {
    /// The packet programs' links that should be pinned for the interfaces
    /// they were attached to, and are not.
    pub fn missing_links(&self) -> Vec<String> {
        self.attached
            .keys()
            .flat_map(|i| {
                TC_PROGRAMS
                    .iter()
                    .map(move |(_, _, s)| format!("tc-{i}-{s}"))
            })
            .chain(
                self.xdp_links
                    .iter()
                    .filter(|(_, attached)| **attached)
                    .map(|(i, _)| format!("xdp-{i}")),
            )
            .filter(|n| !self.pin_dir.join(n).exists())
            .collect()
    }
}

/// What is pinned in `pin_dir` of svcproxy's: links and maps present, by name.
pub fn pinned(pin_dir: &Path) -> Vec<String> {
    socket_programs()
        .map(|n| format!("link-{n}"))
        .chain(MAPS.iter().map(|m| m.to_string()))
        .filter(|n| pin_dir.join(n).exists())
        .collect()
}

/// The links that should be pinned and are not.
pub fn missing_links(pin_dir: &Path) -> Vec<String> {
    socket_programs()
        .map(|n| format!("link-{n}"))
        .filter(|n| !pin_dir.join(n).exists())
        .collect()
}
