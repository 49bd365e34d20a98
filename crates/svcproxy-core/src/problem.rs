//! Problems found in input objects: what was wrong, with which object, and what
//! svcproxy did about it. Conversion collects them; the state logs and counts them.

use std::fmt;

use crate::objects::ObjectKey;
use crate::quote::quote_path;

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

pub use crate::objects::InputProblem;
pub use crate::quote::quote;
