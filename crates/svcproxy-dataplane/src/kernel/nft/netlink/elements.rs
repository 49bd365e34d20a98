//! Set elements as the kernel takes them: keys and values laid out as it
//! stores them ([`layout`]), one element of an element list ([`element`]), and
//! an interval set's elements for a list of prefixes ([`interval_elements`]).

use std::net::IpAddr;

use ipnet::IpNet;
use svcproxy_plan::nft::elements::{Atom, ElemOp, ElemValue, ElemVerdict};

use super::attr::{verdict_data, NFTA_DATA_VALUE, NFTA_LIST_ELEM, NFT_GOTO, NF_DROP, W};
use crate::kernel::netfilter::ip_protocol;

pub(super) fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// A key or value as the kernel stores it: a single field as is, a
/// concatenation with each field padded to 4 bytes. Written into one buffer,
/// not one per field: a cold start at 100k Services encodes millions of these.
pub fn layout(atoms: &[Atom]) -> Vec<u8> {
    let mut out = Vec::with_capacity(atoms.len() * 16);
    let concat = atoms.len() > 1;
    for atom in atoms {
        let start = out.len();
        match atom {
            Atom::Ip(IpAddr::V4(a)) => out.extend_from_slice(&a.octets()),
            Atom::Ip(IpAddr::V6(a)) => out.extend_from_slice(&a.octets()),
            Atom::Proto(p) => out.push(ip_protocol(*p)),
            Atom::Port(p) => out.extend_from_slice(&p.to_be_bytes()),
            Atom::Num(n) => out.extend_from_slice(&n.to_ne_bytes()),
        }
        if concat {
            let padded = (out.len() - start).div_ceil(4) * 4;
            out.resize(start + padded, 0);
        }
    }
    out
}

/// One element (`NFTA_LIST_ELEM`) of a set element list.
pub(super) fn element(w: &mut W, op: &ElemOp) {
    w.nest(NFTA_LIST_ELEM, |w| {
        // NFTA_SET_ELEM_KEY { NFTA_DATA_VALUE }.
        w.nest(1, |w| w.attr(NFTA_DATA_VALUE, &layout(&op.key)));
        match &op.value {
            // NFTA_SET_ELEM_DATA.
            Some(ElemValue::Data(atoms)) => w.nest(2, |w| w.attr(NFTA_DATA_VALUE, &layout(atoms))),
            Some(ElemValue::Verdict(v)) => w.nest(2, |w| match v {
                ElemVerdict::Goto(chain) => verdict_data(w, NFT_GOTO, Some(chain)),
                ElemVerdict::Drop => verdict_data(w, NF_DROP, None),
            }),
            None => {}
        }
    });
}

/// An interval set's elements for `nets` (sorted, disjoint), as the kernel's
/// interval sets take them: each prefix's first address, and the address after
/// its last flagged as an interval's end (none past the top of the space), with
/// an end at address zero first when the first prefix starts later.
pub(super) fn interval_elements(w: &mut W, nets: &[IpNet]) {
    let bytes = |v: u128, net: &IpNet| match net {
        IpNet::V4(_) => (v as u32).to_be_bytes().to_vec(),
        IpNet::V6(_) => v.to_be_bytes().to_vec(),
    };
    let value = |ip: IpAddr| match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    };
    // NFTA_SET_ELEM_KEY { NFTA_DATA_VALUE }, and NFTA_SET_ELEM_FLAGS
    // (NFT_SET_ELEM_INTERVAL_END) for an end.
    let one = |w: &mut W, key: &[u8], end: bool| {
        w.nest(NFTA_LIST_ELEM, |w| {
            w.nest(1, |w| w.attr(NFTA_DATA_VALUE, key));
            if end {
                w.be32(3, 1);
            }
        })
    };
    if let Some(first) = nets.first() {
        if value(first.network()) != 0 {
            one(w, &bytes(0, first), true);
        }
    }
    for net in nets {
        one(w, &ip_bytes(&net.network()), false);
        if let Some(next) = value(net.broadcast()).checked_add(1) {
            let top = match net {
                IpNet::V4(_) => u128::from(u32::MAX),
                IpNet::V6(_) => u128::MAX,
            };
            if next <= top {
                one(w, &bytes(next, net), true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::attr::attrs;
    use super::*;
    use svcproxy_core::model::Protocol;

    #[test]
    fn keys_and_values_are_laid_out_as_the_kernel_stores_them() {
        let v4: IpAddr = "198.19.0.10".parse().unwrap();
        // ipv4_addr . inet_proto . inet_service: 4 + 4 + 4 bytes.
        assert_eq!(
            layout(&[Atom::Ip(v4), Atom::Proto(Protocol::Tcp), Atom::Port(80)]),
            vec![198, 19, 0, 10, 6, 0, 0, 0, 0, 80, 0, 0]
        );
        // A single address: as is.
        assert_eq!(layout(&[Atom::Ip(v4)]), vec![198, 19, 0, 10]);
        // An endpoint map's key, in host order; its value address . port.
        assert_eq!(layout(&[Atom::Num(7)]), 7u32.to_ne_bytes().to_vec());
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let value = layout(&[Atom::Ip(v6), Atom::Port(8080)]);
        assert_eq!(value.len(), 20);
        assert_eq!(&value[16..], &[0x1f, 0x90, 0, 0]);
        // inet_proto . inet_service (NodePorts).
        assert_eq!(
            layout(&[Atom::Proto(Protocol::Sctp), Atom::Port(30000)]),
            vec![132, 0, 0, 0, 0x75, 0x30, 0, 0]
        );
    }

    #[test]
    fn intervals_end_after_each_prefix_and_start_from_zero() {
        let keys = |nets: &[&str]| -> Vec<(Vec<u8>, bool)> {
            let nets: Vec<IpNet> = nets.iter().map(|n| n.parse().unwrap()).collect();
            let mut buf = Vec::new();
            interval_elements(&mut W(&mut buf), &nets);
            // Each NFTA_LIST_ELEM { NFTA_SET_ELEM_KEY { NFTA_DATA_VALUE }, [FLAGS] }.
            attrs(&buf)
                .into_iter()
                .map(|(_, elem)| {
                    let inner = attrs(elem);
                    let key = attrs(inner[0].1)[0].1.to_vec();
                    (key, inner.len() == 2)
                })
                .collect()
        };
        // Adjacent prefixes: the first's end, then the next's start, same key.
        assert_eq!(
            keys(&["10.0.0.0/8", "11.0.0.0/8"]),
            vec![
                (vec![0, 0, 0, 0], true),
                (vec![10, 0, 0, 0], false),
                (vec![11, 0, 0, 0], true),
                (vec![11, 0, 0, 0], false),
                (vec![12, 0, 0, 0], true),
            ]
        );
        // From zero to the top: no end before, none after.
        assert_eq!(
            keys(&["0.0.0.0/1", "128.0.0.0/1"]),
            vec![
                (vec![0, 0, 0, 0], false),
                (vec![128, 0, 0, 0], true),
                (vec![128, 0, 0, 0], false),
            ]
        );
        assert_eq!(keys(&["::/0"]), vec![(vec![0; 16], false)]);
    }
}
