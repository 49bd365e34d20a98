//! User-supplied values made safe for messages: bounded, control characters
//! escaped. A leaf: every module that writes such a message uses it.

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
pub(crate) fn quote_path(path: &str) -> String {
    if path.len() <= 4096 && !path.chars().any(char::is_control) {
        path.to_string()
    } else {
        quote(path)
    }
}
