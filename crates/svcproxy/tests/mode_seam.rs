//! The binary knows no mode: the registry (`svcproxy_dataplane::BACKENDS`) is the
//! only code that does. This reads the binary's sources (tests excluded) for what
//! would break that: a backend module named in a path, a data plane type (any
//! `…DataPlane` but the trait), or a registered mode name or alias as a string,
//! which is how code branches on a mode. Mode names and backend modules come from
//! the registry and the data plane crate, so a new mode is guarded without an edit
//! here. (It lives with the binary, not beside `svcproxy-plan`'s layering test,
//! because it reads the registry, which the plan crate cannot depend on.)

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
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

/// The lines of `text` that are code: comments cut, and nothing from a
/// `#[cfg(test)]` on (test modules close their files here).
fn code_lines(text: &str) -> impl Iterator<Item = (usize, String)> + '_ {
    text.lines()
        .enumerate()
        .take_while(|(_, l)| l.trim() != "#[cfg(test)]")
        .map(|(n, l)| {
            let code = match l.find("//") {
                // `://` is a URL inside a string, not a comment.
                Some(i) if !l[..i].ends_with(':') => &l[..i],
                _ => l,
            };
            (n + 1, code.to_string())
        })
}

/// The data plane crate's modules that implement a data plane (backend modules):
/// the folders (or files) some file of which implements [`DataPlane`].
fn backend_modules() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../svcproxy-dataplane/src");
    let mut modules = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let (name, files) = if path.is_dir() {
            let mut files = Vec::new();
            rust_files(&path, &mut files);
            (path.file_name().unwrap().to_owned(), files)
        } else {
            (path.file_stem().unwrap().to_owned(), vec![path.clone()])
        };
        let implements = files.iter().any(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            text.contains("impl DataPlane for") || text.contains("DataPlane for ")
        });
        if implements {
            modules.push(name.to_string_lossy().into_owned());
        }
    }
    modules
}

/// The backend module a grouped import (`svcproxy_dataplane::{a, b::C}`, which
/// rustfmt may spread over lines) names, if any: `code` is a whole file's code.
fn grouped_import(code: &str, modules: &[String]) -> Option<String> {
    let mut rest = code;
    while let Some(i) = rest.find("svcproxy_dataplane::{") {
        let group = &rest[i + "svcproxy_dataplane::{".len()..];
        let group = &group[..group.find('}').unwrap_or(group.len())];
        for item in group.split(',') {
            let first = item.trim().split("::").next().unwrap_or("").trim();
            if modules.iter().any(|m| m == first) {
                return Some(format!("imports from the backend module `{first}`"));
            }
        }
        rest = &rest[i + 1..];
    }
    None
}

/// Why `code` breaks the seam, if it does.
fn violation(code: &str, modules: &[String], names: &[&str]) -> Option<String> {
    if let Some(why) = grouped_import(code, modules) {
        return Some(why);
    }
    for m in modules {
        if code.contains(&format!("svcproxy_dataplane::{m}::"))
            || code.contains(&format!("svcproxy_dataplane::{m};"))
        {
            return Some(format!("names the backend module `{m}`"));
        }
    }
    let bytes = code.as_bytes();
    let mut at = 0;
    while let Some(i) = code[at..].find("DataPlane") {
        let start = at + i;
        let end = start + "DataPlane".len();
        let ident_start = code[..start]
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |p| p + 1);
        let ends_ident = bytes
            .get(end)
            .is_none_or(|b| !(b.is_ascii_alphanumeric() || *b == b'_'));
        if ends_ident && ident_start < start {
            return Some(format!(
                "names the data plane type `{}`",
                &code[ident_start..end]
            ));
        }
        at = end;
    }
    for name in names {
        if code.contains(&format!("\"{name}\"")) {
            return Some(format!("branches on (or names) the mode {name:?}"));
        }
    }
    None
}

fn registered_names() -> Vec<&'static str> {
    svcproxy_dataplane::BACKENDS
        .iter()
        .flat_map(|b| std::iter::once(b.mode).chain(b.aliases.iter().map(|a| a.name)))
        .collect()
}

#[test]
fn the_binary_names_no_backend_and_branches_on_no_mode() {
    let modules = backend_modules();
    for m in ["nftables", "iptables", "userspace", "ebpf"] {
        assert!(
            modules.iter().any(|x| x == m),
            "{m} not found among {modules:?}"
        );
    }
    let names = registered_names();
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(files.len() > 10, "the binary's sources: {files:?}");
    let mut found = Vec::new();
    for path in files {
        if path.file_name().is_some_and(|n| n == "tests.rs")
            || path.components().any(|c| c.as_os_str() == "tests")
        {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let whole: String = code_lines(&text).map(|(_, l)| l + "\n").collect();
        if let Some(why) = grouped_import(&whole, &modules) {
            found.push(format!("{}: {why}", path.display()));
        }
        for (n, code) in code_lines(&text) {
            if let Some(why) = violation(&code, &modules, &names) {
                found.push(format!(
                    "{}:{n}: {why}\n    {}",
                    path.display(),
                    code.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "mode knowledge in the binary; it belongs to the mode's entry in the registry \
         (svcproxy_dataplane::BACKENDS):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_guard_sees_what_it_looks_for() {
    let modules = backend_modules();
    let names = registered_names();
    for bad in [
        r#"    if settings.proxy_mode.mode == "userspace" {"#,
        r#"        "iptables" => NodePortAddresses::All,"#,
        "use svcproxy_dataplane::userspace::Stats;",
        "use svcproxy_dataplane::{Backend, nftables};",
        "use svcproxy_dataplane::{\n    iptables::INFO,\n    DataPlane,\n};",
        "    let p = NftDataPlane::new();",
        "fn f(x: Box<UserspaceDataPlane>) {}",
    ] {
        assert!(
            violation(bad, &modules, &names).is_some(),
            "not caught: {bad}"
        );
    }
    for fine in [
        "use svcproxy_dataplane::{Backend, DataPlane};",
        "    live: Option<Box<dyn DataPlane>>,",
        r#"    tracing::info!(mode = backend.mode, "synced");"#,
        r#"    let url = "http://nftables.example";"#,
    ] {
        assert_eq!(violation(fine, &modules, &names), None, "{fine}");
    }
}
