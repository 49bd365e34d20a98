//! The table, chains, sets and maps declared: a set's or map's attributes
//! ([`SetSpec`]), a base chain's hook ([`base_chain_attributes`]), and the user
//! data `nft` stores with them (comments, key and data types and byte orders,
//! `typeof` descriptions), so that `nft` lists them as it would its own.

use svcproxy_core::model::{IpFamily, Protocol};
use svcproxy_plan::nft::ruleset::{Field, TABLE_COMMENT};
use svcproxy_plan::nft::{BaseChain, ChainType, Hook, Map, MapType, Set, TABLE_NAME};

use super::attr::W;

fn nul_terminated(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// A chain's comment as `nft` stores it: a user-data TLV
/// (NFTNL_UDATA_CHAIN_COMMENT, length, the text with its NUL).
pub(super) fn chain_comment(comment: &str) -> Vec<u8> {
    let text = nul_terminated(comment);
    let mut out = Vec::new();
    udata(&mut out, 0, &text[..text.len().min(255)]);
    out
}

/// A user-data TLV as libnftnl lays it out: type, length, value.
fn udata(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
    out.push(kind);
    out.push(value.len() as u8);
    out.extend_from_slice(value);
}

fn udata_u32(out: &mut Vec<u8>, kind: u8, value: u32) {
    udata(out, kind, &value.to_ne_bytes());
}

// NFTNL_UDATA_SET_* user-data types.
const UDATA_KEYBYTEORDER: u8 = 0;
const UDATA_DATABYTEORDER: u8 = 1;
const UDATA_KEY_TYPEOF: u8 = 3;
const UDATA_DATA_TYPEOF: u8 = 4;
const UDATA_DATA_INTERVAL: u8 = 6;
/// nft's byte orders: big endian (addresses), host order (numgen's integer).
const BYTEORDER_HOST: u32 = 1;
const BYTEORDER_BIG: u32 = 2;
/// nft's expression ids in a `typeof` description.
const EXPR_PAYLOAD: u32 = 7;
const EXPR_META: u32 = 9;
/// NFT_META_L4PROTO.
const META_L4PROTO: u32 = 16;
const EXPR_CONCAT: u32 = 13;
const EXPR_NUMGEN: u32 = 23;

/// A field's nft data type id and length in bytes.
fn field_type(f: Field) -> (u32, u32) {
    match f {
        Field::Addr(IpFamily::V4) => (7, 4),
        Field::Addr(IpFamily::V6) => (8, 16),
        Field::Proto => (12, 1),
        Field::Port => (13, 2),
    }
}

/// A key's type id and length: a concatenation's type is its fields' ids six
/// bits apart, each field padded to 4 bytes.
fn key_type(key: &[Field]) -> (u32, u32) {
    if let [one] = key {
        return field_type(*one);
    }
    key.iter().fold((0, 0), |(id, len), f| {
        let (fid, flen) = field_type(*f);
        ((id << 6) | fid, len + flen.div_ceil(4) * 4)
    })
}

/// The user data `nft` stores with a set of `key` (it prints the set from it):
/// the key's byte order, and for a concatenation an empty `typeof` of it.
fn key_udata(out: &mut Vec<u8>, key: &[Field]) {
    if key.len() == 1 {
        udata_u32(out, UDATA_KEYBYTEORDER, BYTEORDER_BIG);
    } else {
        udata_u32(out, UDATA_KEYBYTEORDER, 0);
    }
}

fn concat_typeof(out: &mut Vec<u8>) {
    let mut inner = Vec::new();
    udata_u32(&mut inner, 0, EXPR_CONCAT);
    udata(&mut inner, 1, &[]);
    udata(out, UDATA_KEY_TYPEOF, &inner);
}

/// `typeof` of a payload field: its protocol's and field's ids in nft.
fn payload_typeof(proto: u32, field: u32) -> Vec<u8> {
    let mut desc = Vec::new();
    udata_u32(&mut desc, 0, proto);
    udata_u32(&mut desc, 1, field);
    let mut out = Vec::new();
    udata_u32(&mut out, 0, EXPR_PAYLOAD);
    udata(&mut out, 1, &desc);
    out
}

/// `typeof numgen random mod 1`.
fn numgen_typeof() -> Vec<u8> {
    let mut numgen = Vec::new();
    udata_u32(&mut numgen, 0, 1); // NFT_NG_RANDOM
    udata_u32(&mut numgen, 1, 1); // mod 1
    udata_u32(&mut numgen, 2, 0); // offset 0
    let mut out = Vec::new();
    udata_u32(&mut out, 0, EXPR_NUMGEN);
    udata(&mut out, 1, &numgen);
    out
}

/// `typeof F daddr` (nft's protocol ids for ip and ip6, and their daddr fields).
fn daddr_typeof(family: IpFamily) -> Vec<u8> {
    match family {
        IpFamily::V4 => payload_typeof(12, 12),
        IpFamily::V6 => payload_typeof(13, 9),
    }
}

/// `typeof` of a concatenation of the `fields` (each a `typeof` description).
fn concat_of(fields: &[Vec<u8>]) -> Vec<u8> {
    let mut inner = Vec::new();
    for (i, field) in fields.iter().enumerate() {
        udata(&mut inner, i as u8, field);
    }
    let mut out = Vec::new();
    udata_u32(&mut out, 0, EXPR_CONCAT);
    udata(&mut out, 1, &inner);
    out
}

/// A cluster IP endpoint map's user data: `typeof F daddr . meta l4proto . th
/// dport . numgen random mod 1 : F daddr . P dport`.
fn cluster_endpoints_udata(family: IpFamily, protocol: Protocol) -> Vec<u8> {
    let mut l4proto = Vec::new();
    udata_u32(&mut l4proto, 0, META_L4PROTO);
    let mut meta = Vec::new();
    udata_u32(&mut meta, 0, EXPR_META);
    udata(&mut meta, 1, &l4proto);
    // nft's protocol id of `th` (the transport header, whichever it is).
    let key = concat_of(&[
        daddr_typeof(family),
        meta,
        payload_typeof(11, 2),
        numgen_typeof(),
    ]);
    dnat_map_udata(0, &key, family, protocol)
}

/// `typeof F daddr . P dport`: an endpoint map's value.
fn endpoint_typeof(family: IpFamily, protocol: Protocol) -> Vec<u8> {
    let l4 = match protocol {
        Protocol::Tcp => 8,
        Protocol::Udp => 6,
        Protocol::Sctp => 10,
    };
    concat_of(&[daddr_typeof(family), payload_typeof(l4, 2)])
}

/// An endpoint map's user data: `typeof numgen random mod 1 : F daddr . P dport`.
fn endpoints_udata(family: IpFamily, protocol: Protocol) -> Vec<u8> {
    dnat_map_udata(BYTEORDER_HOST, &numgen_typeof(), family, protocol)
}

/// The user data of a map to endpoints (`F daddr . P dport`), keyed by `key` (its
/// `typeof` description, in `key_byteorder`).
fn dnat_map_udata(key_byteorder: u32, key: &[u8], family: IpFamily, protocol: Protocol) -> Vec<u8> {
    let mut out = Vec::new();
    udata_u32(&mut out, UDATA_KEYBYTEORDER, key_byteorder);
    udata_u32(&mut out, UDATA_DATABYTEORDER, 0);
    udata(&mut out, UDATA_KEY_TYPEOF, key);
    udata(
        &mut out,
        UDATA_DATA_TYPEOF,
        &endpoint_typeof(family, protocol),
    );
    udata_u32(&mut out, UDATA_DATA_INTERVAL, 0);
    out
}

// NFT_SET_* flags.
const SET_INTERVAL: u32 = 0x4;
const SET_MAP: u32 = 0x8;
const SET_TIMEOUT: u32 = 0x10;
const SET_EVAL: u32 = 0x20;
/// NFT_DATA_VERDICT as a map's data type.
const DATA_VERDICT: u32 = 0xffff_ff00;

/// A set's or map's declaration: `NFTA_SET_*` attributes after its table and name.
pub(super) struct SetSpec {
    flags: u32,
    key: (u32, u32),
    data: Option<(u32, u32)>,
    timeout_ms: Option<u64>,
    udata: Vec<u8>,
}

impl SetSpec {
    pub(super) fn of_set(set: &Set) -> SetSpec {
        let mut udata = Vec::new();
        key_udata(&mut udata, &set.key);
        if set.key.len() > 1 {
            concat_typeof(&mut udata);
        }
        let mut flags = 0;
        if set.interval {
            flags |= SET_INTERVAL;
        }
        if set.timeout.is_some() {
            flags |= SET_TIMEOUT | SET_EVAL;
        }
        SetSpec {
            flags,
            key: key_type(&set.key),
            data: None,
            timeout_ms: set.timeout.map(|t| u64::from(t) * 1000),
            udata,
        }
    }

    pub(super) fn of_map(map: &Map) -> SetSpec {
        match &map.map_type {
            MapType::Verdict(key) => {
                let mut udata = Vec::new();
                key_udata(&mut udata, key);
                udata_u32(&mut udata, UDATA_DATABYTEORDER, 0);
                if key.len() > 1 {
                    concat_typeof(&mut udata);
                }
                udata_u32(&mut udata, UDATA_DATA_INTERVAL, 0);
                SetSpec {
                    flags: SET_MAP,
                    key: key_type(key),
                    data: Some((DATA_VERDICT, 0)),
                    timeout_ms: None,
                    udata,
                }
            }
            MapType::Endpoints { family, protocol } => SetSpec {
                flags: SET_MAP,
                // numgen's integer (nft's "integer" type, 4).
                key: (4, 4),
                data: Some(key_type(&[Field::Addr(*family), Field::Port])),
                timeout_ms: None,
                udata: endpoints_udata(*family, *protocol),
            },
            MapType::ClusterEndpoints { family, protocol } => SetSpec {
                flags: SET_MAP,
                // F daddr . meta l4proto . th dport . numgen's integer (nft's
                // "integer" type, 4).
                key: {
                    let (id, len) = key_type(&[Field::Addr(*family), Field::Proto, Field::Port]);
                    ((id << 6) | 4, len + 4)
                },
                data: Some(key_type(&[Field::Addr(*family), Field::Port])),
                timeout_ms: None,
                udata: cluster_endpoints_udata(*family, *protocol),
            },
        }
    }

    /// Writes the attributes, `id` naming the set within its batch (the kernel
    /// wants one).
    pub(super) fn write(&self, w: &mut W, name: &str, id: u32) {
        w.str(1, TABLE_NAME);
        w.str(2, name);
        w.be32(3, self.flags);
        w.be32(4, self.key.0);
        w.be32(5, self.key.1);
        if let Some((kind, len)) = self.data {
            w.be32(6, kind);
            w.be32(7, len);
        }
        w.be32(10, id);
        if let Some(ms) = self.timeout_ms {
            w.attr(11, &ms.to_be_bytes());
        }
        w.attr(13, &self.udata);
    }
}

/// A base chain's `NFTA_CHAIN_*` attributes: hook, type, policy accept.
pub(super) fn base_chain_attributes(w: &mut W, base: &BaseChain) {
    let hook = match base.hook {
        Hook::Prerouting => 0u32,
        Hook::Input => 1,
        Hook::Forward => 2,
        Hook::Output => 3,
        Hook::Postrouting => 4,
    };
    let chain_type = match base.chain_type {
        ChainType::Filter => "filter",
        ChainType::Nat => "nat",
    };
    // NFTA_CHAIN_HOOK { NFTA_HOOK_HOOKNUM, NFTA_HOOK_PRIORITY }, NFTA_CHAIN_TYPE,
    // NFTA_CHAIN_POLICY (NF_ACCEPT).
    w.nest(4, |w| {
        w.be32(1, hook);
        w.be32(2, base.priority as u32);
    });
    w.str(7, chain_type);
    w.be32(5, 1);
}

/// The table's comment as `nft` stores it (NFTNL_UDATA_TABLE_COMMENT).
pub(super) fn table_comment() -> Vec<u8> {
    let mut out = Vec::new();
    udata(&mut out, 0, &nul_terminated(TABLE_COMMENT));
    out
}
