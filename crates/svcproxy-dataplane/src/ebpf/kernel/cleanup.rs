//! Everything svcproxy pinned removed ([`cleanup`]): the links first (the
//! programs detached), then the maps, then the directory; the pins of another
//! network namespace's svcproxy are left alone.

use std::path::Path;

use aya::programs::links::PinnedLink;

use super::attach::{pinned_interfaces, release_interface};
use super::host::netns_cookie;
use super::kernel_err;
use super::load::socket_programs;
use super::maps::{pinned_owner, MAPS, RETIRED_MAPS};
use crate::error::DataPlaneError;

/// Removes what svcproxy pinned in `pin_dir`: the links first (detaching the
/// programs), then the maps, then the directory. Nothing there is no error.
///
/// Pins another network namespace's svcproxy made (the host's, seen from a
/// namespace sharing its filesystem) are left alone: the cookie of the namespace
/// whose processes count as the host, pinned in `svcproxy_cfg`, must be this one's.
pub fn cleanup(pin_dir: &Path) -> Result<(), DataPlaneError> {
    if !pin_dir.exists() {
        return Ok(());
    }
    if let Some(owner) = pinned_owner(pin_dir) {
        let here = netns_cookie()?;
        if owner != here {
            tracing::warn!(
                pin_dir = %pin_dir.display(),
                "the eBPF pins there belong to svcproxy in another network namespace; left alone"
            );
            return Ok(());
        }
    }
    for index in pinned_interfaces(pin_dir) {
        release_interface(pin_dir, index)?;
    }
    for name in socket_programs() {
        let _ = std::fs::remove_file(pin_dir.join(format!("link-{name}-new")));
        let pin = pin_dir.join(format!("link-{name}"));
        if pin.exists() {
            let link = PinnedLink::from_pin(&pin)
                .map_err(|e| kernel_err(format!("opening {}", pin.display()), e))?;
            link.unpin()
                .map_err(|e| kernel_err(format!("unpinning {}", pin.display()), e))?;
        }
    }
    for name in MAPS.iter().chain(&RETIRED_MAPS) {
        let pin = pin_dir.join(name);
        match std::fs::remove_file(&pin) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(kernel_err(format!("unpinning {}", pin.display()), e)),
        }
    }
    super::seal::unseal(pin_dir)?;
    match std::fs::remove_dir(pin_dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(kernel_err(format!("removing {}", pin_dir.display()), e)),
    }
}
