//! Set and map element changes as typed values: what a partial plan that only
//! moves elements says, for a writer that talks to the kernel directly (netlink)
//! instead of through `nft -f` text. The text of each change ([`ElemOp::text`])
//! is what the plan's script holds, so both writers apply the same thing.
//!
//! A key or value is a concatenation of [`Atom`]s, each typed as the set
//! declares it: addresses (`ipv4_addr`, `ipv6_addr`), `inet_proto`,
//! `inet_service`, and the endpoint maps' integer keys (`numgen`'s, in host byte
//! order).

use std::fmt::Write as _;
use std::net::IpAddr;

use svcproxy_core::model::{IpFamily, Protocol};

use crate::names::protocol_keyword;

use super::decl::{family_keyword, TABLE_NAME};

/// One field of an element's key or value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Atom {
    Ip(IpAddr),
    Proto(Protocol),
    Port(u16),
    /// An endpoint map's key, or the last field of a cluster IP endpoint map's.
    Num(u32),
}

impl std::fmt::Display for Atom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Atom::Ip(ip) => write!(f, "{ip}"),
            Atom::Proto(p) => f.write_str(protocol_keyword(*p)),
            Atom::Port(p) => write!(f, "{p}"),
            Atom::Num(n) => write!(f, "{n}"),
        }
    }
}

/// A verdict map element's verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ElemVerdict {
    Goto(String),
    Drop,
}

/// What a map element maps to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ElemValue {
    Data(Vec<Atom>),
    Verdict(ElemVerdict),
}

/// One element added to or deleted from a set or map of svcproxy's table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElemOp {
    pub family: IpFamily,
    pub add: bool,
    pub set: String,
    pub key: Vec<Atom>,
    /// Only for an addition to a map.
    pub value: Option<ElemValue>,
}

/// Writes a key or value as `nft` reads it: the atoms joined by ` . `.
pub(crate) fn concat(out: &mut String, atoms: &[Atom]) {
    for (i, a) in atoms.iter().enumerate() {
        if i > 0 {
            out.push_str(" . ");
        }
        let _ = write!(out, "{a}");
    }
}

/// [`concat`] as a new string.
pub(crate) fn concat_text(atoms: &[Atom]) -> String {
    let mut out = String::new();
    concat(&mut out, atoms);
    out
}

impl ElemOp {
    /// The `nft` statement, newline included.
    pub fn text(&self) -> String {
        let mut out = format!(
            "{} element {} {TABLE_NAME} {} {{ ",
            if self.add { "add" } else { "delete" },
            family_keyword(self.family),
            self.set
        );
        concat(&mut out, &self.key);
        match &self.value {
            Some(ElemValue::Data(atoms)) => {
                out.push_str(" : ");
                concat(&mut out, atoms);
            }
            Some(ElemValue::Verdict(ElemVerdict::Goto(chain))) => {
                let _ = write!(out, " : goto {chain}");
            }
            Some(ElemValue::Verdict(ElemVerdict::Drop)) => out.push_str(" : drop"),
            None => {}
        }
        out.push_str(" }\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_is_the_nft_statement() {
        let op = ElemOp {
            family: IpFamily::V6,
            add: true,
            set: "service-ips".into(),
            key: vec![
                Atom::Ip("2001:db8::1".parse().unwrap()),
                Atom::Proto(Protocol::Tcp),
                Atom::Port(80),
            ],
            value: Some(ElemValue::Verdict(ElemVerdict::Goto("service-1".into()))),
        };
        assert_eq!(
            op.text(),
            "add element ip6 svcproxy service-ips { 2001:db8::1 . tcp . 80 : goto service-1 }\n"
        );
        let op = ElemOp {
            family: IpFamily::V4,
            add: false,
            set: "endpoint-dnat-udp-00".into(),
            key: vec![Atom::Num(7)],
            value: None,
        };
        assert_eq!(
            op.text(),
            "delete element ip svcproxy endpoint-dnat-udp-00 { 7 }\n"
        );
    }
}
