//! A resync: the whole table rewritten in place, while the kernel is known to
//! hold the last committed plan. Every rule and every static element is
//! flushed, objects no longer wanted are deleted, and the whole table is added
//! again; the session-affinity sets keep their contents.
//!
//! Entry points: [`Planner::write_resync`] (the script) and
//! [`Planner::resync_ops`] (the same statements typed), from the [`Names`] the
//! kernel held before the plan.

use super::*;

/// Names of a family's objects, to work out what a resync must delete.
#[derive(Default)]
pub(super) struct Names {
    pub(super) chains: BTreeSet<String>,
    /// Set name and whether it is a dynamic (affinity) set, whose contents survive.
    pub(super) sets: BTreeMap<String, bool>,
    pub(super) maps: BTreeSet<String>,
}

impl Planner {
    pub(super) fn write_resync(
        fam: &FamilyState,
        fi: &FamilyIntent,
        old: &Names,
        out: &mut String,
        stats: &mut PlanStats,
    ) {
        let f = fam.family;
        out.push_str(&stmt::add_table(f));
        if fam.node.is_none() {
            out.push_str(&stmt::delete_table(f));
            return;
        }
        // Drop every rule and every static element first: after that nothing in
        // the table references a chain, so stale ones can go.
        out.push_str(&stmt::flush_table(f));
        for name in &old.maps {
            out.push_str(&stmt::flush_map(f, name));
        }
        for (name, dynamic) in &old.sets {
            if !dynamic {
                out.push_str(&stmt::flush_set(f, name));
            }
        }
        let new = fam.names();
        for name in old.chains.difference(&new.chains) {
            out.push_str(&stmt::delete_chain(f, name));
            stats.chains_deleted += 1;
        }
        for name in old.sets.keys() {
            if !new.sets.contains_key(name) {
                out.push_str(&stmt::delete_set(f, name));
            }
        }
        for name in old.maps.difference(&new.maps) {
            out.push_str(&stmt::delete_map(f, name));
        }
        stats.chains_written += fam.write_table(fi, out);
    }

    /// [`Planner::write_resync`]'s statements typed.
    pub(super) fn resync_ops(
        fam: &FamilyState,
        fi: &FamilyIntent,
        old: &Names,
        out: &mut dyn FnMut(Op),
    ) {
        let f = fam.family;
        out(Op::AddTable { family: f });
        if fam.node.is_none() {
            out(Op::DeleteTable { family: f });
            return;
        }
        out(Op::FlushTable { family: f });
        let flush = |name: &String| Op::FlushSet {
            family: f,
            name: name.clone(),
        };
        old.maps.iter().map(flush).for_each(&mut *out);
        old.sets
            .iter()
            .filter(|(_, dynamic)| !**dynamic)
            .map(|(name, _)| flush(name))
            .for_each(&mut *out);
        let new = fam.names();
        old.chains
            .difference(&new.chains)
            .map(|name| Op::DeleteChain {
                family: f,
                name: name.clone(),
            })
            .for_each(&mut *out);
        old.sets
            .keys()
            .filter(|name| !new.sets.contains_key(*name))
            .chain(old.maps.difference(&new.maps))
            .map(|name| delete_set(f, name))
            .for_each(&mut *out);
        fam.table_ops(fi, out)
    }
}
