//! The typed nftables model and its rendering to `nft -f` text.
//!
//! Entry point: [`Ruleset`], one family's `table <family> svcproxy`: chains (base or
//! regular, each with its rules), sets and verdict maps with their elements.
//! [`Ruleset::render`] prints it as one `table { ... }` block; the planner reuses the
//! same writers to stream very large tables section by section and to print the
//! individual statements (`add rule`, `delete element`, ...) of a delta.
//!
//! Rendering is byte-for-byte deterministic: maps are ordered by name, elements and
//! rules keep the order they were given in, and nothing depends on hashing order.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use svcproxy_core::model::IpFamily;

use crate::names::sanitize_comment;

use super::typed::TypedRule;

pub use super::decl::{
    addr_type, family_keyword, key_text, BaseChain, ChainType, Field, Hook, Map, MapType, Set,
    TABLE_COMMENT, TABLE_NAME,
};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// `Some` for a base chain.
    pub base: Option<BaseChain>,
    /// Sanitized again when rendered, whatever it holds.
    pub comment: Option<String>,
    pub rules: Vec<TypedRule>,
}

/// One family's table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ruleset {
    pub family: IpFamily,
    pub chains: BTreeMap<String, Chain>,
    pub sets: BTreeMap<String, Set>,
    pub maps: BTreeMap<String, Map>,
}

impl Ruleset {
    pub fn new(family: IpFamily) -> Self {
        Ruleset {
            family,
            chains: BTreeMap::new(),
            sets: BTreeMap::new(),
            maps: BTreeMap::new(),
        }
    }

    /// The table as one `table <family> svcproxy { ... }` block.
    pub fn render(&self) -> String {
        let mut out = String::new();
        write_table_open(&mut out, self.family);
        self.write_body(&mut out);
        write_table_close(&mut out);
        out
    }

    /// The table's contents (sets, then maps, then chains, each by name), as they
    /// appear between the braces of a table block.
    pub fn write_body(&self, out: &mut String) {
        for (name, set) in &self.sets {
            write_set(out, name, set);
        }
        for (name, map) in &self.maps {
            write_map(out, name, map);
        }
        for (name, chain) in &self.chains {
            write_chain(out, name, chain);
        }
    }

    /// Adds everything of `other` (same family) to this ruleset; later entries with
    /// the same name replace earlier ones.
    pub fn extend(&mut self, other: Ruleset) {
        self.chains.extend(other.chains);
        self.sets.extend(other.sets);
        self.maps.extend(other.maps);
    }
}

pub(crate) fn write_table_open(out: &mut String, family: IpFamily) {
    let _ = writeln!(
        out,
        "table {} {TABLE_NAME} {{\n\tcomment \"{}\"",
        family_keyword(family),
        sanitize_comment(TABLE_COMMENT)
    );
}

pub(crate) fn write_table_close(out: &mut String) {
    out.push_str("}\n");
}

fn set_spec_lines(set: &Set) -> Vec<String> {
    let mut lines = vec![format!("type {}", key_text(&set.key))];
    if let Some(t) = set.timeout {
        lines.push("flags dynamic,timeout".to_string());
        lines.push(format!("timeout {t}s"));
    } else if set.interval {
        lines.push("flags interval".to_string());
    }
    lines
}

pub(crate) fn write_set(out: &mut String, name: &str, set: &Set) {
    let _ = writeln!(out, "\n\tset {name} {{");
    for line in set_spec_lines(set) {
        let _ = writeln!(out, "\t\t{line}");
    }
    if !set.elements.is_empty() {
        out.push_str("\t\telements = {\n");
        for e in &set.elements {
            let _ = writeln!(out, "\t\t\t{e},");
        }
        out.push_str("\t\t}\n");
    }
    out.push_str("\t}\n");
}

pub(crate) fn write_map(out: &mut String, name: &str, map: &Map) {
    let _ = writeln!(out, "\n\tmap {name} {{\n\t\t{}", map.declaration());
    if !map.elements.is_empty() {
        out.push_str("\t\telements = {\n");
        for (k, v) in &map.elements {
            let _ = writeln!(out, "\t\t\t{k} : {v},");
        }
        out.push_str("\t\t}\n");
    }
    out.push_str("\t}\n");
}

pub(crate) fn write_chain(out: &mut String, name: &str, chain: &Chain) {
    let _ = writeln!(out, "\n\tchain {name} {{");
    if let Some(c) = &chain.comment {
        let _ = writeln!(out, "\t\tcomment \"{}\"", sanitize_comment(c));
    }
    if let Some(base) = &chain.base {
        let _ = writeln!(out, "\t\t{}", base.spec());
    }
    for rule in &chain.rules {
        let _ = writeln!(out, "\t\t{}", rule.text());
    }
    out.push_str("\t}\n");
}

/// Single statements, as used in partial (delta) scripts and full resyncs. Each
/// returns one line, newline included.
pub(crate) mod stmt {
    use super::*;

    fn table(family: IpFamily) -> String {
        format!("{} {TABLE_NAME}", family_keyword(family))
    }

    pub fn add_table(family: IpFamily) -> String {
        format!(
            "add table {} {{ comment \"{}\" ; }}\n",
            table(family),
            sanitize_comment(TABLE_COMMENT)
        )
    }

    pub fn delete_table(family: IpFamily) -> String {
        format!("delete table {}\n", table(family))
    }

    pub fn flush_table(family: IpFamily) -> String {
        format!("flush table {}\n", table(family))
    }

    pub fn add_chain(family: IpFamily, name: &str, chain: &Chain) -> String {
        let mut spec = Vec::new();
        if let Some(c) = &chain.comment {
            spec.push(format!("comment \"{}\" ;", sanitize_comment(c)));
        }
        if let Some(b) = &chain.base {
            spec.push(b.spec());
        }
        if spec.is_empty() {
            format!("add chain {} {name}\n", table(family))
        } else {
            format!(
                "add chain {} {name} {{ {} }}\n",
                table(family),
                spec.join(" ")
            )
        }
    }

    pub fn flush_chain(family: IpFamily, name: &str) -> String {
        format!("flush chain {} {name}\n", table(family))
    }

    pub fn delete_chain(family: IpFamily, name: &str) -> String {
        format!("delete chain {} {name}\n", table(family))
    }

    pub fn add_rule(family: IpFamily, chain: &str, rule: &str) -> String {
        format!("add rule {} {chain} {rule}\n", table(family))
    }

    pub fn add_set(family: IpFamily, name: &str, set: &Set) -> String {
        let spec: Vec<String> = set_spec_lines(set)
            .into_iter()
            .map(|l| format!("{l} ;"))
            .collect();
        format!(
            "add set {} {name} {{ {} }}\n",
            table(family),
            spec.join(" ")
        )
    }

    pub fn delete_set(family: IpFamily, name: &str) -> String {
        format!("delete set {} {name}\n", table(family))
    }

    pub fn flush_set(family: IpFamily, name: &str) -> String {
        format!("flush set {} {name}\n", table(family))
    }

    pub fn add_map(family: IpFamily, name: &str, map: &Map) -> String {
        format!(
            "add map {} {name} {{ {} ; }}\n",
            table(family),
            map.declaration()
        )
    }

    pub fn flush_map(family: IpFamily, name: &str) -> String {
        format!("flush map {} {name}\n", table(family))
    }

    pub fn delete_map(family: IpFamily, name: &str) -> String {
        format!("delete map {} {name}\n", table(family))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_small_table_deterministically() {
        let mut rs = Ruleset::new(IpFamily::V4);
        rs.chains.insert(
            "b".into(),
            Chain {
                comment: Some("x\"; drop".into()),
                rules: vec![TypedRule::new(
                    IpFamily::V4,
                    Vec::new(),
                    super::super::typed::Action::Jump("a".into()),
                )],
                ..Chain::default()
            },
        );
        rs.chains.insert(
            "a".into(),
            Chain {
                base: Some(BaseChain {
                    chain_type: ChainType::Filter,
                    hook: Hook::Input,
                    priority: -110,
                }),
                ..Chain::default()
            },
        );
        rs.maps.insert(
            "m".into(),
            Map {
                elements: vec![("tcp . 80".into(), "drop".into())],
                ..Map::verdict(vec![Field::Proto, Field::Port])
            },
        );
        let text = rs.render();
        assert_eq!(text, rs.clone().render());
        assert_eq!(
            text,
            "table ip svcproxy {\n\tcomment \"managed-by-svcproxy\"\n\
             \n\tmap m {\n\t\ttype inet_proto . inet_service : verdict\n\t\telements = {\n\t\t\ttcp . 80 : drop,\n\t\t}\n\t}\n\
             \n\tchain a {\n\t\ttype filter hook input priority -110; policy accept;\n\t}\n\
             \n\tchain b {\n\t\tcomment \"x---drop\"\n\t\tjump a\n\t}\n}\n"
        );
    }
}
