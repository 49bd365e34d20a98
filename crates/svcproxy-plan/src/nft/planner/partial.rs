//! A partial plan's script: the statements about the changed service ports
//! and frontends, kept in sections that are emitted in an order in which every
//! reference resolves.
//!
//! Entry point: [`Delta`] ([`Delta::new`], filled by `FamilyState::apply`,
//! then [`Delta::finish`]).

use super::*;

/// One part of a partial plan's script, and the same statements typed.
#[derive(Default)]
pub(super) struct Section {
    text: String,
    ops: Vec<Op>,
}

impl Section {
    pub(super) fn typed(&mut self, text: &str, op: Op) {
        self.text.push_str(text);
        self.ops.push(op);
    }

    fn is_empty(&self) -> bool {
        self.text.is_empty()
    }
}

/// Script fragments of a partial plan, kept apart so they can be emitted in an
/// order in which every reference resolves.
pub(super) struct Delta {
    family: IpFamily,
    pub(super) declare: Section,
    flush: Section,
    pub(super) rules: Section,
    delete_elements: Section,
    add_elements: Section,
    flush_stale: Section,
    delete_stale_chains: Section,
    pub(super) delete_stale_sets: Section,
}

impl Delta {
    pub(super) fn new(family: IpFamily) -> Self {
        Delta {
            family,
            declare: Section::default(),
            flush: Section::default(),
            rules: Section::default(),
            delete_elements: Section::default(),
            add_elements: Section::default(),
            flush_stale: Section::default(),
            delete_stale_chains: Section::default(),
            delete_stale_sets: Section::default(),
        }
    }

    /// Writes the script; `ops` gets the statements typed, in the script's order.
    pub(super) fn finish(self, out: &mut String, ops: &mut Vec<Op>) {
        for part in [
            self.declare,
            self.flush,
            self.rules,
            self.delete_elements,
            self.add_elements,
            self.flush_stale,
            self.delete_stale_chains,
            self.delete_stale_sets,
        ] {
            if part.is_empty() {
                continue;
            }
            out.push_str(&part.text);
            ops.extend(part.ops);
        }
    }

    pub(super) fn element(
        &mut self,
        add: bool,
        set: &str,
        key: Vec<Atom>,
        value: Option<ElemValue>,
    ) {
        let op = ElemOp {
            family: self.family,
            add,
            set: set.to_string(),
            key,
            value,
        };
        let section = if add {
            &mut self.add_elements
        } else {
            &mut self.delete_elements
        };
        section.typed(&op.text(), Op::Element(op));
    }

    /// Statements moving one service port's elements of the `endpoint-dnat-*` maps
    /// from `old` to `new`: an element whose key keeps its endpoint is left alone.
    pub(super) fn dnat_elements(
        &mut self,
        old: Option<&Fragment>,
        new: Option<&Fragment>,
        stats: &mut PlanStats,
    ) {
        let collect = |frag: Option<&Fragment>| {
            let mut elems = BTreeMap::new();
            if let Some(frag) = frag {
                frag.dnat_elements(|k, ep| {
                    elems.insert(k, *ep);
                });
            }
            elems
        };
        let map_of = |frag: Option<&Fragment>| frag.map(Fragment::endpoint_map);
        let (old_map, new_map) = (map_of(old), map_of(new));
        let (old, new) = (collect(old), collect(new));
        for (k, ep) in &old {
            if new.get(k) != Some(ep) || new_map != old_map {
                self.element(
                    false,
                    old_map.as_deref().unwrap_or_default(),
                    vec![Atom::Num(*k)],
                    None,
                );
                stats.elements_deleted += 1;
            }
        }
        for (k, ep) in &new {
            if old.get(k) != Some(ep) || new_map != old_map {
                self.element(
                    true,
                    new_map.as_deref().unwrap_or_default(),
                    vec![Atom::Num(*k)],
                    Some(ElemValue::Data(dnat_value(ep))),
                );
                stats.elements_added += 1;
            }
        }
    }

    /// Statements turning `old` objects of one service port into `new` ones.
    pub(super) fn objects(&mut self, old: &Ruleset, new: &Ruleset, stats: &mut PlanStats) {
        let f = self.family;
        let flush = |name: &String| Op::FlushChain {
            family: f,
            name: name.clone(),
        };
        for (name, chain) in &new.chains {
            match old.chains.get(name) {
                Some(prev) if prev == chain => continue,
                Some(_) => self.flush.typed(&stmt::flush_chain(f, name), flush(name)),
                None => self
                    .declare
                    .typed(&stmt::add_chain(f, name, chain), add_chain(f, name, chain)),
            }
            stats.chains_written += 1;
            for rule in &chain.rules {
                self.rules.typed(
                    &stmt::add_rule(f, name, &rule.text()),
                    Op::AddRule {
                        family: f,
                        chain: name.clone(),
                        rule: rule.clone(),
                    },
                );
            }
        }
        for name in old.chains.keys() {
            if !new.chains.contains_key(name) {
                // Stale chains reference each other (service → endpoint), so all
                // are flushed before any is deleted.
                self.flush_stale
                    .typed(&stmt::flush_chain(f, name), flush(name));
                self.delete_stale_chains.typed(
                    &stmt::delete_chain(f, name),
                    Op::DeleteChain {
                        family: f,
                        name: name.clone(),
                    },
                );
                stats.chains_deleted += 1;
            }
        }
        for (name, set) in &new.sets {
            if !old.sets.contains_key(name) {
                self.declare
                    .typed(&stmt::add_set(f, name, set), add_set(f, name, set));
            }
        }
        for name in old.sets.keys() {
            if !new.sets.contains_key(name) {
                self.delete_stale_sets
                    .typed(&stmt::delete_set(f, name), delete_set(f, name));
            }
        }
    }
}
