//! Label and field selectors, with the API server's grammar and semantics.

use serde_json::Value;

/// A parsed label selector: every requirement must hold (AND).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector {
    reqs: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq)]
struct Requirement {
    key: String,
    op: Op,
}

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Exists,
    DoesNotExist,
    Equals(String),
    NotEquals(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Bang,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    Open,
    Close,
    Comma,
}

fn tokenize(s: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '(' => {
                out.push(Tok::Open);
                i += 1;
            }
            ')' => {
                out.push(Tok::Close);
                i += 1;
            }
            ',' => {
                out.push(Tok::Comma);
                i += 1;
            }
            '!' => {
                if chars.get(i + 1) == Some(&'=') {
                    out.push(Tok::NotEq);
                    i += 2;
                } else {
                    out.push(Tok::Bang);
                    i += 1;
                }
            }
            '=' => {
                if chars.get(i + 1) == Some(&'=') {
                    out.push(Tok::DoubleEq);
                    i += 2;
                } else {
                    out.push(Tok::Eq);
                    i += 1;
                }
            }
            '>' => {
                out.push(Tok::Gt);
                i += 1;
            }
            '<' => {
                out.push(Tok::Lt);
                i += 1;
            }
            _ => {
                let start = i;
                while i < chars.len() && !chars[i].is_whitespace() && !"(),!=<>".contains(chars[i])
                {
                    i += 1;
                }
                out.push(Tok::Ident(chars[start..i].iter().collect()));
            }
        }
    }
    Ok(out)
}

fn is_name_part(s: &str, max: usize) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= max
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

fn validate_key(k: &str) -> Result<(), String> {
    let ok = match k.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_name_part(name, 63),
        None => is_name_part(k, 63),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("invalid label key {k:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"))
    }
}

fn validate_value(v: &str) -> Result<(), String> {
    if v.is_empty() || is_name_part(v, 63) {
        Ok(())
    } else {
        Err(format!("invalid label value: {v:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"))
    }
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub(crate) fn parse(s: &str) -> Result<LabelSelector, String> {
        let toks = tokenize(s)?;
        let mut reqs = Vec::new();
        let mut i = 0;
        if toks.is_empty() {
            return Ok(LabelSelector { reqs });
        }
        let err = |m: &str| Err(format!("unable to parse requirement: {m}"));
        loop {
            // One requirement.
            let req = match toks.get(i) {
                Some(Tok::Bang) => {
                    i += 1;
                    let Some(Tok::Ident(k)) = toks.get(i) else {
                        return err("found no key after '!'");
                    };
                    i += 1;
                    validate_key(k).map_err(|e| format!("unable to parse requirement: {e}"))?;
                    Requirement {
                        key: k.clone(),
                        op: Op::DoesNotExist,
                    }
                }
                Some(Tok::Ident(k)) => {
                    let key = k.clone();
                    validate_key(&key).map_err(|e| format!("unable to parse requirement: {e}"))?;
                    i += 1;
                    let op = match toks.get(i) {
                        None | Some(Tok::Comma) => Op::Exists,
                        Some(Tok::Eq | Tok::DoubleEq | Tok::NotEq) => {
                            let neg = toks[i] == Tok::NotEq;
                            i += 1;
                            let v = match toks.get(i) {
                                Some(Tok::Ident(v)) => {
                                    i += 1;
                                    v.clone()
                                }
                                None | Some(Tok::Comma) => String::new(),
                                Some(t) => {
                                    return err(&format!("found '{t:?}', expected: identifier"))
                                }
                            };
                            validate_value(&v)
                                .map_err(|e| format!("unable to parse requirement: {e}"))?;
                            if neg {
                                Op::NotEquals(v)
                            } else {
                                Op::Equals(v)
                            }
                        }
                        Some(Tok::Gt | Tok::Lt) => {
                            let gt = toks[i] == Tok::Gt;
                            i += 1;
                            let Some(Tok::Ident(v)) = toks.get(i) else {
                                return err("expected an integer after '>' or '<'");
                            };
                            i += 1;
                            let Ok(n) = v.parse::<i64>() else {
                                return err(&format!(
                                    "for 'Gt', 'Lt' operators, the value must be an integer: {v:?}"
                                ));
                            };
                            if gt {
                                Op::Gt(n)
                            } else {
                                Op::Lt(n)
                            }
                        }
                        Some(Tok::Ident(w)) if w == "in" || w == "notin" => {
                            let notin = w == "notin";
                            i += 1;
                            if toks.get(i) != Some(&Tok::Open) {
                                return err("found no '(' after 'in'/'notin'");
                            }
                            i += 1;
                            let mut values = Vec::new();
                            loop {
                                match toks.get(i) {
                                    Some(Tok::Ident(v)) => {
                                        validate_value(v).map_err(|e| {
                                            format!("unable to parse requirement: {e}")
                                        })?;
                                        values.push(v.clone());
                                        i += 1;
                                        match toks.get(i) {
                                            Some(Tok::Comma) => i += 1,
                                            Some(Tok::Close) => {
                                                i += 1;
                                                break;
                                            }
                                            _ => return err("expected ',' or ')' in a set"),
                                        }
                                    }
                                    Some(Tok::Comma) => {
                                        // An empty value in a set.
                                        values.push(String::new());
                                        i += 1;
                                    }
                                    Some(Tok::Close) => {
                                        i += 1;
                                        break;
                                    }
                                    _ => return err("unterminated set"),
                                }
                            }
                            if values.is_empty() {
                                return err(
                                    "for 'in', 'notin' operators, values set can't be empty",
                                );
                            }
                            if notin {
                                Op::NotIn(values)
                            } else {
                                Op::In(values)
                            }
                        }
                        Some(t) => {
                            return err(&format!(
                                "found '{t:?}', expected: in, notin, =, ==, !=, gt, lt"
                            ))
                        }
                    };
                    Requirement { key, op }
                }
                Some(t) => return err(&format!("found '{t:?}', expected: !, identifier")),
                None => return err("found '', expected: !, identifier"),
            };
            reqs.push(req);
            match toks.get(i) {
                None => break,
                Some(Tok::Comma) => {
                    i += 1;
                }
                Some(t) => return err(&format!("found '{t:?}', expected: ','")),
            }
        }
        Ok(LabelSelector { reqs })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let labels = obj.get("metadata").and_then(|m| m.get("labels"));
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|r| {
            let v = get(&r.key);
            match &r.op {
                Op::Exists => v.is_some(),
                Op::DoesNotExist => v.is_none(),
                Op::Equals(want) => v == Some(want.as_str()),
                Op::NotEquals(want) => v != Some(want.as_str()),
                Op::In(set) => v.is_some_and(|v| set.iter().any(|s| s == v)),
                Op::NotIn(set) => !v.is_some_and(|v| set.iter().any(|s| s == v)),
                Op::Gt(n) => v
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v > *n),
                Op::Lt(n) => v
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v < *n),
            }
        })
    }
}

/// A parsed field selector over `metadata.name` and `metadata.namespace`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector {
    terms: Vec<(Field, bool, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Field {
    Name,
    Namespace,
}

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter.
    pub(crate) fn parse(s: &str) -> Result<FieldSelector, String> {
        let mut terms = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector { terms });
        }
        for term in s.split(',') {
            let term = term.trim();
            let (field, neg, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, false, v)
            } else {
                return Err(format!(
                    "invalid selector: '{s}'; can't understand '{term}'"
                ));
            };
            let field = match field.trim() {
                "metadata.name" => Field::Name,
                "metadata.namespace" => Field::Namespace,
                other => return Err(format!("field label not supported: {other}")),
            };
            terms.push((field, neg, value.trim().to_string()));
        }
        Ok(FieldSelector { terms })
    }

    /// Adds `metadata.namespace=ns` (a namespaced request path).
    pub(crate) fn with_namespace(mut self, ns: &str) -> FieldSelector {
        self.terms.push((Field::Namespace, false, ns.to_string()));
        self
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let meta = obj.get("metadata");
        let get = |k: &str| {
            meta.and_then(|m| m.get(k))
                .and_then(Value::as_str)
                .unwrap_or("")
        };
        self.terms.iter().all(|(f, neg, v)| {
            let actual = match f {
                Field::Name => get("name"),
                Field::Namespace => get("namespace"),
            };
            (actual == v) != *neg
        })
    }
}

/// Both selectors of a request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
}

impl Filter {
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
    }

    fn m(sel: &str, labels: Value) -> bool {
        LabelSelector::parse(sel).unwrap().matches(&obj(labels))
    }

    #[test]
    fn label_selector_operators() {
        let l = json!({"app": "web", "tier": "front", "n": "5", "empty": ""});
        assert!(m("", l.clone()));
        assert!(m("app", l.clone()));
        assert!(!m("missing", l.clone()));
        assert!(m("!missing", l.clone()));
        assert!(!m("!app", l.clone()));
        assert!(m("app=web", l.clone()));
        assert!(m("app==web", l.clone()));
        assert!(!m("app=db", l.clone()));
        assert!(m("app!=db", l.clone()));
        assert!(
            m("missing!=db", l.clone()),
            "!= matches objects without the label"
        );
        assert!(m("app in (db, web)", l.clone()));
        assert!(!m("app in (db)", l.clone()));
        assert!(m("app notin (db)", l.clone()));
        assert!(m("missing notin (db)", l.clone()));
        assert!(!m("app notin (web,db)", l.clone()));
        assert!(m("app=web,tier=front", l.clone()));
        assert!(!m("app=web,tier=back", l.clone()));
        assert!(m("n>4,n<6", l.clone()));
        assert!(!m("n>5", l.clone()));
        assert!(m("empty=", l.clone()));
        assert!(m("empty=,app", l.clone()));
        assert!(m(
            "service.kubernetes.io/headless!=x,!service.kubernetes.io/service-proxy-name",
            l.clone()
        ));
        assert!(m("  app  =  web  ", l));
    }

    #[test]
    fn malformed_label_selectors() {
        for bad in [
            "app=",
            "=web",
            "app in",
            "app in (a",
            "app in ()",
            "app notin a",
            "!",
            "a,,b",
            "a=b=c",
            "-bad",
            "app=web)",
            "n>x",
            "app=we b",
            "a,",
        ] {
            if bad == "app=" {
                assert!(LabelSelector::parse(bad).is_ok());
                continue;
            }
            assert!(LabelSelector::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn field_selectors() {
        let o = obj(json!({}));
        let f = |s: &str| FieldSelector::parse(s).unwrap().matches(&o);
        assert!(f(""));
        assert!(f("metadata.name=a"));
        assert!(f("metadata.name==a"));
        assert!(!f("metadata.name!=a"));
        assert!(f("metadata.name!=b,metadata.namespace=ns"));
        assert!(!f("metadata.namespace=other"));
        assert!(FieldSelector::parse("spec.foo=a").is_err());
        assert!(FieldSelector::parse("metadata.name").is_err());
        let cluster = json!({"metadata": {"name": "n"}});
        assert!(FieldSelector::parse("metadata.namespace=")
            .unwrap()
            .matches(&cluster));
    }
}
