//! The house's size limits, for every crate of the workspace:
//!
//! - no production source file over 1,000 lines, counted before its first
//!   `#[cfg(test)]` (a file that only tests — `tests.rs`, or under a `tests/`
//!   folder — is not production);
//! - no BPF C function over 80 lines without a comment above it saying why.
//!
//! A file that outgrows its room is a set of concerns waiting for rooms of their
//! own.

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 1000;
const MAX_BPF_FUNCTION: usize = 80;

fn crates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn files(dir: &Path, ext: &[&str], out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, ext, out);
        } else if path
            .extension()
            .is_some_and(|e| ext.iter().any(|x| e == *x))
        {
            out.push(path);
        }
    }
}

/// Lines before the first `#[cfg(test)]`.
fn production_lines(text: &str) -> usize {
    text.lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .count()
}

#[test]
fn no_production_source_file_is_over_a_thousand_lines() {
    let mut long = Vec::new();
    let mut seen = 0;
    for entry in std::fs::read_dir(crates()).unwrap() {
        let src = entry.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        let mut rs = Vec::new();
        files(&src, &["rs"], &mut rs);
        for f in rs {
            let test_only = f.file_name().is_some_and(|n| n == "tests.rs")
                || f.components().any(|c| c.as_os_str() == "tests");
            if test_only {
                continue;
            }
            seen += 1;
            let n = production_lines(&std::fs::read_to_string(&f).unwrap());
            if n > MAX_LINES {
                long.push(format!("{}: {n} lines", f.display()));
            }
        }
    }
    assert!(
        seen > 100,
        "the workspace's sources were not found ({seen})"
    );
    assert!(
        long.is_empty(),
        "production files over {MAX_LINES} lines (before #[cfg(test)]):\n{}",
        long.join("\n")
    );
}

/// The C functions of `text` longer than [`MAX_BPF_FUNCTION`] lines with no
/// comment line right above their signature: `(name, lines)`.
fn long_functions_without_a_why(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        // A definition starts at column 0 with a name and `(`, not a statement or
        // a declaration ending in `;`, and its body opens on a line of `{`.
        let starts = !l.starts_with(|c: char| c.is_whitespace() || c == '#' || c == '/')
            && l.contains('(')
            && !l.trim_end().ends_with(';');
        if starts {
            let mut j = i;
            while j < lines.len() && lines[j] != "{" && !lines[j].trim_end().ends_with(';') {
                j += 1;
            }
            if j < lines.len() && lines[j] == "{" {
                let end = (j..lines.len()).find(|&k| lines[k] == "}").unwrap_or(j);
                let len = end - i + 1;
                let commented = i > 0 && lines[i - 1].trim_start().starts_with("//");
                if len > MAX_BPF_FUNCTION && !commented {
                    let name = l.split('(').next().unwrap_or(l).trim().to_string();
                    out.push((name, len));
                }
                i = end + 1;
                continue;
            }
        }
        i += 1;
    }
    out
}

#[test]
fn no_bpf_function_is_over_eighty_lines_without_saying_why() {
    let mut c = Vec::new();
    files(
        &crates().join("svcproxy-dataplane/bpf"),
        &["c", "h"],
        &mut c,
    );
    assert!(c.len() >= 4, "the BPF sources were not found: {c:?}");
    let mut long = Vec::new();
    for f in c {
        for (name, n) in long_functions_without_a_why(&std::fs::read_to_string(&f).unwrap()) {
            long.push(format!("{}: {name}: {n} lines", f.display()));
        }
    }
    assert!(
        long.is_empty(),
        "BPF functions over {MAX_BPF_FUNCTION} lines with no comment saying why:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_bpf_guard_finds_a_long_function_and_accepts_a_why() {
    let body = "\tx++;\n".repeat(90);
    let bare = format!("static int f(void)\n{{\n{body}}}\n");
    assert_eq!(
        long_functions_without_a_why(&bare),
        [("static int f".to_string(), 93)]
    );
    let why = format!("// Over 80 lines: one decision, kept whole for the verifier.\n{bare}");
    assert!(long_functions_without_a_why(&why).is_empty());
    let short = "static int g(int a,\n\t     int b)\n{\n\treturn a + b;\n}\n";
    assert!(long_functions_without_a_why(short).is_empty());
}
