//! The data-plane crate's rooms and the one way its imports run.
//!
//! Each top-level module of `src/` is a room: the seam (`seam`: the trait and its
//! reports), the registry (`registry`), the error type (`error`), the kernel's
//! shared plumbing (`kernel`), and one folder per mode (`nftables`, `iptables`,
//! `userspace`, `ebpf`). This reads every source file (code only: comments and
//! `#[cfg(test)]` modules cut) for the paths it names and checks:
//!
//! - a mode uses only itself, the seam, the error and the kernel's plumbing,
//!   never another mode nor the registry (the registry composes modes);
//! - the plumbing uses only itself and the error; the seam only the error and
//!   the plumbing;
//! - no two files use each other, directly or around a circle (a module's face,
//!   its `mod` and `pub use` lines, is not a use).
//!
//! A new mode is a new room, guarded without an edit here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SHARED: &[&str] = &["seam", "registry", "error", "kernel", "lib"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A file's module path under `src/` (`kernel/nft/mod.rs` → `["kernel", "nft"]`).
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// The room of a module path: its first part (`lib` for the crate root).
fn room(module: &[String]) -> String {
    module.first().cloned().unwrap_or_else(|| "lib".into())
}

/// A file's code: comments cut, nothing from `#[cfg(test)]` on, and neither its
/// `mod` declarations nor its `pub use` re-exports (a module's face).
fn code(text: &str) -> String {
    let mut out = String::new();
    let mut face = false;
    for line in text.lines() {
        let t = line.trim();
        if t == "#[cfg(test)]" {
            break;
        }
        let code = match line.find("//") {
            Some(i) if !line[..i].ends_with(':') => &line[..i],
            _ => line,
        };
        let t = code.trim();
        if t.starts_with("pub use ") || t.starts_with("pub(crate) use ") {
            face = !t.ends_with(';');
            continue;
        }
        if face {
            face = !t.ends_with(';');
            continue;
        }
        if (t.starts_with("mod ") || t.starts_with("pub mod ")) && t.ends_with(';') {
            continue;
        }
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// The module paths `code` (in module `at`) names: `crate::a::b…` and `super::…`,
/// grouped imports (`crate::a::{b, c::d}`) spread, each cut to the module part
/// that exists as a file.
fn named_modules(
    code: &str,
    at: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    let bytes: Vec<char> = code.chars().collect();
    let text: String = bytes.iter().collect();
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = text[from..].find(start) {
            let begin = from + i;
            from = begin + start.len();
            // Not part of a longer identifier (`my_crate::`).
            if begin > 0 {
                let prev = text[..begin].chars().last().unwrap();
                if prev.is_alphanumeric() || prev == '_' {
                    continue;
                }
            }
            let mut base: Vec<String> = Vec::new();
            let mut rest = &text[begin..];
            loop {
                if let Some(r) = rest.strip_prefix("crate::") {
                    base.clear();
                    rest = r;
                } else if let Some(r) = rest.strip_prefix("super::") {
                    if base.is_empty() {
                        base = at.to_vec();
                    }
                    base.pop();
                    rest = r;
                } else {
                    break;
                }
            }
            for path in expand(rest) {
                let mut full = base.clone();
                full.extend(path);
                // The longest prefix that is a module of its own.
                while !full.is_empty() && !modules.contains(&full) {
                    full.pop();
                }
                out.insert(full);
            }
        }
    }
    out
}

/// The paths a use tree names: `a::b::{c, d::e}` → `[a,b,c]`, `[a,b,d,e]`.
fn expand(rest: &str) -> Vec<Vec<String>> {
    let mut path = Vec::new();
    let mut s = rest;
    loop {
        let end = s
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(s.len());
        if end == 0 {
            break;
        }
        path.push(s[..end].to_string());
        s = &s[end..];
        if let Some(r) = s.strip_prefix("::") {
            s = r;
            if let Some(group) = s.strip_prefix('{') {
                let mut depth = 1;
                let mut close = group.len();
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                close = i;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                let inner = &group[..close];
                let mut items = Vec::new();
                let (mut depth, mut last) = (0, 0);
                for (i, c) in inner.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            items.push(&inner[last..i]);
                            last = i + 1;
                        }
                        _ => {}
                    }
                }
                items.push(&inner[last..]);
                let mut out = Vec::new();
                for item in items {
                    for tail in expand(item.trim()) {
                        let mut p = path.clone();
                        p.extend(tail);
                        out.push(p);
                    }
                }
                return if out.is_empty() { vec![path] } else { out };
            }
        } else {
            break;
        }
    }
    vec![path]
}

/// Every file's module and the modules it uses.
fn graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(f)).collect();
    let mut uses = BTreeMap::new();
    for f in &files {
        let at = module_of(f);
        let text = std::fs::read_to_string(f).unwrap();
        let mut named = named_modules(&code(&text), &at, &modules);
        named.remove(&at);
        uses.insert(at, named);
    }
    uses
}

fn allowed(from: &str, to: &str) -> bool {
    if from == to || from == "registry" || from == "lib" {
        return true;
    }
    match from {
        "error" => false,
        "kernel" => to == "error",
        "seam" => matches!(to, "error" | "kernel"),
        // A mode.
        _ => matches!(to, "seam" | "error" | "kernel"),
    }
}

#[test]
fn every_room_s_imports_run_one_way() {
    let g = graph();
    let modes: BTreeSet<String> = g
        .keys()
        .map(|m| room(m))
        .filter(|r| !SHARED.contains(&r.as_str()))
        .collect();
    for m in ["nftables", "iptables", "userspace", "ebpf"] {
        assert!(
            modes.contains(m),
            "the mode folder {m} is missing: {modes:?}"
        );
    }
    let mut wrong = Vec::new();
    for (from, tos) in &g {
        for to in tos {
            let (a, b) = (room(from), room(to));
            if !allowed(&a, &b) {
                wrong.push(format!("{} uses {}", from.join("::"), to.join("::")));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the rooms' direction (a mode uses the seam, the error and \
         the kernel's plumbing only; the plumbing only itself and the error):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_file_uses_another_that_uses_it_back() {
    let g = graph();
    // Tarjan's strongly connected components: any of more than one file is a circle.
    struct T<'a> {
        g: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on: BTreeSet<&'a Vec<String>>,
        next: usize,
        circles: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a Vec<String>) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let Some((w, _)) = t.g.get_key_value(w) else {
                continue;
            };
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low[v];
                t.low.insert(v, lv.min(lw));
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low[v];
                t.low.insert(v, lv.min(iw));
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.join("::"));
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                t.circles.push(comp);
            }
        }
    }
    let mut t = T {
        g: &g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        circles: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    assert!(
        t.circles.is_empty(),
        "files that use each other (around a circle): {:?}",
        t.circles
    );
}

#[test]
fn the_guard_reads_paths_as_the_compiler_does() {
    let modules: BTreeSet<Vec<String>> = [
        vec![],
        vec!["kernel".to_string()],
        vec!["kernel".to_string(), "nft".to_string()],
        vec!["nftables".to_string()],
        vec!["nftables".to_string(), "plane".to_string()],
    ]
    .into_iter()
    .collect();
    let at = vec!["nftables".to_string(), "plane".to_string()];
    let named = named_modules(
        "use crate::kernel::nft::{BatchBuilder, NftCommand};\nuse super::NftWriter;\nlet x = crate::kernel::listing::f();",
        &at,
        &modules,
    );
    let want: BTreeSet<Vec<String>> = [
        vec!["kernel".to_string(), "nft".to_string()],
        vec!["nftables".to_string()],
        vec!["kernel".to_string()],
    ]
    .into_iter()
    .collect();
    assert_eq!(named, want);
    // A mode naming another, or the registry: caught.
    assert!(!allowed("userspace", "nftables"));
    assert!(!allowed("ebpf", "registry"));
    assert!(!allowed("kernel", "ebpf"));
    assert!(!allowed("kernel", "seam"));
    assert!(allowed("registry", "ebpf"));
    // A re-export is the module's face, not a use.
    assert_eq!(
        code("pub use plane::NftDataPlane;\nmod plane;\nfn f() {}"),
        "fn f() {}\n"
    );
}
