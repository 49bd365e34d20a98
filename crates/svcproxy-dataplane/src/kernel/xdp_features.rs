//! Which of this host's interfaces take frames an XDP program redirects to
//! them, as the kernel says (the netdev generic-netlink family's XDP features,
//! kernel 6.3+): a driver with `ndo_xdp_xmit`, or a veth whose peer runs NAPI
//! (an XDP program or GRO on it). A frame redirected elsewhere would be dropped,
//! so the eBPF mode's XDP fast path sends only to these.

use std::collections::BTreeSet;
use std::io;

use netlink_packet_core::{
    emit_u32, parse_u32, parse_u64, DecodeError, Emitable, NlasIterator, ParseableParametrized,
    NLM_F_DUMP,
};
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::{GenlFamily, GenlHeader, GenlMessage};
use netlink_sys::protocols::NETLINK_GENERIC;

use crate::kernel::host_addrs::exchange;

const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;
/// `NETDEV_XDP_ACT_NDO_XMIT`: the interface implements `ndo_xdp_xmit`.
const NDO_XMIT: u64 = 4;

/// One message of the netdev family: a device's index and XDP features (a
/// request carries neither: a dump of every device).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct NetdevDev {
    ifindex: Option<u32>,
    xdp_features: Option<u64>,
}

impl GenlFamily for NetdevDev {
    fn family_name() -> &'static str {
        "netdev"
    }
    fn command(&self) -> u8 {
        NETDEV_CMD_DEV_GET
    }
    fn version(&self) -> u8 {
        1
    }
}

impl Emitable for NetdevDev {
    fn buffer_len(&self) -> usize {
        if self.ifindex.is_some() {
            8
        } else {
            0
        }
    }
    fn emit(&self, buffer: &mut [u8]) {
        // One attribute at most: the device asked about.
        if let Some(index) = self.ifindex {
            buffer[0..2].copy_from_slice(&8u16.to_ne_bytes());
            buffer[2..4].copy_from_slice(&NETDEV_A_DEV_IFINDEX.to_ne_bytes());
            emit_u32(&mut buffer[4..8], index).expect("four bytes");
        }
    }
}

impl ParseableParametrized<[u8], GenlHeader> for NetdevDev {
    fn parse_with_param(buf: &[u8], _header: GenlHeader) -> Result<Self, DecodeError> {
        let mut dev = NetdevDev::default();
        for nla in NlasIterator::new(buf) {
            let nla = nla?;
            match nla.kind() {
                NETDEV_A_DEV_IFINDEX => dev.ifindex = Some(parse_u32(nla.value())?),
                NETDEV_A_DEV_XDP_FEATURES => dev.xdp_features = Some(parse_u64(nla.value())?),
                _ => {}
            }
        }
        Ok(dev)
    }
}

/// The generic-netlink id the kernel gave the netdev family.
fn netdev_family() -> io::Result<u16> {
    let request = GenlMessage::from_payload(GenlCtrl {
        cmd: GenlCtrlCmd::GetFamily,
        nlas: vec![GenlCtrlAttrs::FamilyName(NetdevDev::family_name().into())],
    });
    let mut id = None;
    exchange(NETLINK_GENERIC, request, 0, "netdev family", |m| {
        id = m.payload.nlas.iter().find_map(|a| match a {
            GenlCtrlAttrs::FamilyId(id) => Some(*id),
            _ => None,
        });
    })?;
    id.ok_or_else(|| io::Error::other("the kernel named no id for the netdev family"))
}

/// The indexes of this host's interfaces that take redirected XDP frames. An
/// error when the kernel has no netdev family (before 6.3): nothing is then
/// known to take them.
pub fn redirect_targets() -> io::Result<BTreeSet<u32>> {
    let family = netdev_family()?;
    let mut request = GenlMessage::from_payload(NetdevDev::default());
    request.set_resolved_family_id(family);
    let mut targets = BTreeSet::new();
    exchange(
        NETLINK_GENERIC,
        request,
        NLM_F_DUMP,
        "netdev device dump",
        |m| {
            let dev = m.payload;
            if let (Some(index), Some(features)) = (dev.ifindex, dev.xdp_features) {
                if features & NDO_XMIT != 0 {
                    targets.insert(index);
                }
            }
        },
    )?;
    Ok(targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_for_one_device_carries_its_index() {
        let dev = NetdevDev {
            ifindex: Some(7),
            xdp_features: None,
        };
        let mut buf = vec![0u8; dev.buffer_len()];
        dev.emit(&mut buf);
        let header = GenlHeader {
            cmd: NETDEV_CMD_DEV_GET,
            version: 1,
        };
        assert_eq!(NetdevDev::parse_with_param(&buf, header).unwrap(), dev);
        assert_eq!(NetdevDev::default().buffer_len(), 0);
    }
}
