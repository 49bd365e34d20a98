//! What `--help` shows for each command. Every command accepts every flag, so that
//! a DaemonSet's command line (or a kube-proxy one) runs unchanged whichever command
//! it starts; each subcommand's help shows only the flags that change what that
//! command does, and the daemon's help shows them all, grouped under the headings of
//! [`heading`], the data planes' own flags under their mode's heading (from the
//! registry), and the kube-proxy flags accepted without effect last.

use std::collections::BTreeMap;

use clap::Command;

use crate::config::flags::heading;

/// What a subcommand's help shows: the flags under a heading, or one flag (by clap
/// id) from a heading it does not show.
enum Shown {
    Heading(&'static str),
    Flag(&'static str),
}

use Shown::{Flag, Heading};

/// What `render` and `explain` read: the rules a sync would write.
const RULE_COMMANDS: &[Shown] = &[
    Heading(heading::SOURCES),
    Heading(heading::ADDRESSES),
    Heading(heading::RULES),
    Heading(heading::LOGGING),
];

/// Per subcommand, the flags that change what it does. The data planes' flags and
/// the ignored ones are the daemon's alone.
const SUBCOMMANDS: &[(&str, &[Shown])] = &[
    (
        "snapshot",
        &[
            Heading(heading::SOURCES),
            Heading(heading::ADDRESSES),
            // AllowServiceExternalIPs changes the addresses shown.
            Flag("feature_gates"),
            // --watch: how often the snapshot is printed again, and its servers.
            Flag("min_sync_period"),
            Flag("sync_period"),
            Heading(heading::SERVERS),
            Heading(heading::LOGGING),
        ],
    ),
    ("render", RULE_COMMANDS),
    ("explain", RULE_COMMANDS),
    (
        "dns",
        &[
            Heading(heading::SOURCES),
            Heading(heading::SERVERS),
            Heading(heading::DNS),
            Heading(heading::LOGGING),
        ],
    ),
    ("cleanup", &[Flag("config"), Heading(heading::LOGGING)]),
];

/// Said under each subcommand's flags.
const OTHER_FLAGS: &str = "Every other flag of 'svcproxy --help' is accepted and checked as the \
     daemon checks it (a DaemonSet's command line runs unchanged), but does not change what this \
     command does.";

/// `cmd` (the binary's parser) with the data planes' flags under their modes'
/// headings and each subcommand's help cut down to the flags it uses.
pub fn shape(cmd: Command) -> Command {
    let mut modes: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
    for b in svcproxy_dataplane::BACKENDS {
        for arg in crate::config::mode_flags::backend_flags(b).get_arguments() {
            modes
                .entry(arg.get_id().to_string())
                .or_default()
                .push(b.mode);
        }
    }
    let titles: BTreeMap<String, &'static str> = modes
        .into_iter()
        .map(|(id, owners)| {
            let title = match owners.as_slice() {
                [one] => format!("{one} mode"),
                [init @ .., last] => format!("{} and {last} modes", init.join(", ")),
                [] => unreachable!("an entry has its first owner"),
            };
            (id, leak(title))
        })
        .collect();
    // In place (`mut_arg` would move the flag to the end, and its heading with it).
    let place = |a: clap::Arg| {
        let a = match titles.get(a.get_id().as_str()) {
            Some(title) => a.help_heading(*title),
            None => a,
        };
        brief(a)
    };
    let mut cmd = cmd
        .mut_args(place)
        .mut_subcommands(|sc| sc.mut_args(place))
        .mut_subcommand("cleanup", |sc| sc.long_about(cleanup_about()));
    for (name, shown) in SUBCOMMANDS {
        cmd = cmd.mut_subcommand(name, |sc| {
            sc.mut_args(|a| {
                let id = a.get_id().as_str();
                let keep = a.is_hide_set()
                    || a.get_help_heading().is_none()
                    || shown.iter().any(|s| match s {
                        Heading(h) => a.get_help_heading() == Some(*h),
                        Flag(f) => *f == id,
                    });
                if keep {
                    a
                } else {
                    a.hide(true)
                }
            })
            .after_help(OTHER_FLAGS)
        });
    }
    cmd
}

/// `svcproxy cleanup --help`: every kind of object the modes write, from the
/// registry, so that a new mode's objects are named without an edit here.
fn cleanup_about() -> String {
    let mut kinds = Vec::new();
    for b in svcproxy_dataplane::BACKENDS {
        if !kinds.contains(&b.objects) {
            kinds.push(b.objects);
        }
    }
    let kinds: Vec<&str> = kinds.into_iter().map(|k| k.describe()).collect();
    let text = format!(
        "Remove everything svcproxy created in the kernel, and exit.\n\n\
         Every mode's objects, where the flags say they are, and nothing else: {}.",
        kinds.join("; ")
    );
    text
}

/// `-h` shows each flag's first sentence, `--help` all of it (clap adds "see more
/// with '--help'" when they differ).
fn brief(a: clap::Arg) -> clap::Arg {
    if a.get_long_help().is_some() {
        return a;
    }
    let Some(full) = a.get_help().map(|h| h.to_string()) else {
        return a;
    };
    match first_sentence(&full) {
        Some(first) => a.long_help(full.clone()).help(first.to_string()),
        None => a,
    }
}

/// The text up to its first full stop followed by a space, if there is more after
/// it ("e.g. " and "i.e. " are not full stops).
fn first_sentence(text: &str) -> Option<&str> {
    let mut from = 0;
    while let Some(i) = text[from..].find(". ") {
        let end = from + i;
        let before = &text[..end];
        if before.ends_with("e.g") || before.ends_with("i.e") || before.ends_with("etc") {
            from = end + 2;
            continue;
        }
        return Some(&text[..end]);
    }
    None
}

/// A heading made once per process (a few short strings).
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn cli() -> Command {
        shape(crate::cli::Cli::command())
    }

    fn visible(cmd: &Command) -> Vec<(String, Option<String>)> {
        cmd.get_arguments()
            .filter(|a| !a.is_hide_set())
            .map(|a| {
                (
                    a.get_id().to_string(),
                    a.get_help_heading().map(str::to_string),
                )
            })
            .collect()
    }

    #[test]
    fn every_flag_of_the_daemon_has_a_heading() {
        let cmd = cli();
        let loose: Vec<String> = visible(&cmd)
            .into_iter()
            .filter(|(id, h)| h.is_none() && id != "help" && id != "version")
            .map(|(id, _)| id)
            .collect();
        assert!(loose.is_empty(), "flags without a heading: {loose:?}");
    }

    #[test]
    fn each_heading_a_subcommand_names_exists_and_every_flag_it_names_too() {
        let cmd = cli();
        let headings: Vec<String> = cmd
            .get_arguments()
            .filter_map(|a| a.get_help_heading().map(str::to_string))
            .collect();
        for (name, shown) in SUBCOMMANDS {
            assert!(cmd.find_subcommand(name).is_some(), "no subcommand {name}");
            for s in *shown {
                match s {
                    Heading(h) => assert!(headings.iter().any(|x| x == h), "{name}: {h}"),
                    Flag(f) => assert!(
                        cmd.get_arguments().any(|a| a.get_id() == f),
                        "{name}: no flag {f}"
                    ),
                }
            }
        }
        // And no subcommand is left to show everything.
        for sc in cmd.get_subcommands() {
            assert!(
                SUBCOMMANDS.iter().any(|(n, _)| *n == sc.get_name()),
                "{} has no entry in SUBCOMMANDS",
                sc.get_name()
            );
        }
    }

    #[test]
    fn a_mode_s_flags_are_under_its_heading_and_only_in_the_daemon_s_help() {
        let cmd = cli();
        for b in svcproxy_dataplane::BACKENDS {
            for arg in crate::config::mode_flags::backend_flags(b).get_arguments() {
                let id = arg.get_id().as_str();
                let h = cmd
                    .get_arguments()
                    .find(|a| a.get_id() == id)
                    .and_then(|a| a.get_help_heading())
                    .expect("a mode flag has a heading");
                assert!(h.contains(b.mode), "--{id} is under {h:?}");
                for sc in cmd.get_subcommands() {
                    assert!(
                        !visible(sc).iter().any(|(v, _)| v == id),
                        "{} shows --{id}",
                        sc.get_name()
                    );
                }
            }
        }
    }

    #[test]
    fn the_ignored_flags_come_last() {
        let cmd = cli();
        let mut order: Vec<&str> = Vec::new();
        for a in cmd.get_arguments() {
            if let Some(h) = a.get_help_heading() {
                if !order.contains(&h) {
                    order.push(h);
                }
            }
        }
        assert_eq!(order.last(), Some(&heading::IGNORED), "{order:?}");
        assert_eq!(order.first(), Some(&heading::SOURCES), "{order:?}");
    }
}
