//! The typed statements and element values every kind of plan writes: the
//! declarations of chains, sets and maps without their contents, and the
//! elements of the shared sets and the endpoint maps.
//!
//! Entry points: [`add_chain`], [`add_set`], [`add_map`], [`delete_set`],
//! [`add_element`].

use super::*;

pub(super) fn add_chain(family: IpFamily, name: &str, chain: &Chain) -> Op {
    Op::AddChain {
        family,
        name: name.to_string(),
        comment: chain.comment.as_deref().map(sanitize_comment),
        base: chain.base,
    }
}

/// A set's declaration, without its elements.
pub(super) fn add_set(family: IpFamily, name: &str, set: &Set) -> Op {
    Op::AddSet {
        family,
        name: name.to_string(),
        set: Set {
            elements: Vec::new(),
            ..set.clone()
        },
    }
}

/// A map's declaration, without its elements.
pub(super) fn add_map(family: IpFamily, name: &str, map: &Map) -> Op {
    Op::AddMap {
        family,
        name: name.to_string(),
        map: Map {
            elements: Vec::new(),
            ..map.clone()
        },
    }
}

/// Deletes a set or a map.
pub(super) fn delete_set(family: IpFamily, name: &str) -> Op {
    Op::DeleteSet {
        family,
        name: name.to_string(),
    }
}

/// An element added to `set`.
pub(super) fn add_element(
    family: IpFamily,
    set: &str,
    key: Vec<Atom>,
    value: Option<ElemValue>,
) -> Op {
    Op::Element(ElemOp {
        family,
        add: true,
        set: set.to_string(),
        key,
        value,
    })
}

/// A value of an `endpoint-dnat-*` map: `address . port`.
pub(super) fn dnat_value(ep: &SocketAddr) -> Vec<Atom> {
    vec![Atom::Ip(ep.ip()), Atom::Port(ep.port())]
}

/// A `hairpin-endpoints` element: `address . address`.
pub(super) fn hairpin_elem(ip: IpAddr) -> Vec<Atom> {
    vec![Atom::Ip(ip), Atom::Ip(ip)]
}

/// An element of a cluster IP set or map ([`DataElem`]) added.
pub(super) fn data_elem(family: IpFamily, e: DataElem) -> Op {
    add_element(family, &e.set, e.key, e.value.map(ElemValue::Data))
}
