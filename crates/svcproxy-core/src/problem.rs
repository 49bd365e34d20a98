//! Problems found in input objects: what was wrong, with which object, and what
//! svcproxy did about it. Conversion collects them; the state logs and counts them.

use std::fmt;

use crate::objects::ObjectKey;

/// What svcproxy did with a bad object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// The whole object was skipped (it is not proxied / contributes nothing).
    Rejected,
    /// One field or list entry was ignored; the rest of the object is used.
    Ignored,
    /// Valid but surprising input; used as documented.
    Warning,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Rejected => "rejected",
            Severity::Ignored => "ignored",
            Severity::Warning => "warning",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub object: ObjectKey,
    /// Where the object came from (a manifest file path, "api"), when known.
    pub origin: Option<String>,
    pub severity: Severity,
    /// The field path the problem is about, e.g. `spec.ports[1].nodePort`.
    pub field: String,
    pub message: String,
}

impl Problem {
    pub fn new(
        object: &ObjectKey,
        severity: Severity,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Problem {
            object: object.clone(),
            origin: None,
            severity,
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.object)?;
        if let Some(origin) = &self.origin {
            write!(f, " (from {})", quote_path(origin))?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {} [{}]", self.message, self.severity.as_str())
    }
}

/// Input a source could not turn into objects at all (a document that is not
/// YAML, an unreadable file, a definition passed over for another): where, and
/// why. Its objects, if any, are not proxied (a file that stops parsing keeps the
/// objects it last yielded: the message says so).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputProblem {
    /// The file (or other place) the input came from.
    pub origin: String,
    pub message: String,
}

impl fmt::Display for InputProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} [unreadable]",
            quote_path(&self.origin),
            self.message
        )
    }
}

/// Quotes a user-supplied value for a message: bounded in length and with control
/// characters escaped, so a hostile value cannot forge log lines.
pub fn quote(value: &str) -> String {
    const MAX: usize = 80;
    let mut out = String::with_capacity(value.len().min(MAX) + 2);
    out.push('"');
    for (i, c) in value.chars().enumerate() {
        if i == MAX {
            out.push('…');
            break;
        }
        out.extend(c.escape_debug());
    }
    out.push('"');
    out
}

/// A path for a message: as is when it is printable, else quoted and bounded.
fn quote_path(path: &str) -> String {
    if path.len() <= 4096 && !path.chars().any(char::is_control) {
        path.to_string()
    } else {
        quote(path)
    }
}
