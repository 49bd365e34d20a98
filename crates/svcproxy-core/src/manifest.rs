//! Kubernetes manifests as text: one YAML stream (or one JSON document) in, the objects
//! svcproxy reads out, each with where in the text it came from.
//!
//! Entry point: [`parse`]. The standalone `--manifests` source reads files with it, and
//! the tests load their scenario files with it, so there is one loader in the workspace.
//!
//! Text is read as a person editing it would expect: a syntax error anywhere fails the
//! whole text (what follows it is unknown), while one bad object skips that object only
//! and says why. `kind: List` and typed lists (`ServiceList`) are expanded; kinds other
//! than Service, EndpointSlice, Node, ServiceCIDR and Endpoints are ignored; Endpoints
//! objects are mirrored to EndpointSlices as the EndpointSlice mirroring controller does.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::mirror::endpoints_to_slices;
use crate::objects::{KubeObject, ObjectKey};
use crate::problem::quote;

/// Documents plus list items per text; past it the text is treated as unreadable.
pub const MAX_OBJECTS_PER_FILE: usize = 100_000;

/// How the text is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A YAML stream: any number of `---`-separated documents.
    Yaml,
    /// One JSON document.
    Json,
}

/// One object the text yielded, with where in the text it came from.
#[derive(Clone, Debug)]
pub struct ManifestObject {
    pub key: ObjectKey,
    pub object: Arc<KubeObject>,
    /// `document 2` or `document 2, items[3]`.
    pub at: String,
    /// For slices mirrored from an Endpoints object: that object, for messages.
    pub mirrored_from: Option<ObjectKey>,
}

impl ManifestObject {
    /// The object's key, and the Endpoints object it was mirrored from if any.
    pub fn describe(&self) -> String {
        match &self.mirrored_from {
            Some(ep) => format!("{} (mirrored from {ep})", self.key),
            None => self.key.to_string(),
        }
    }
}

/// What one readable text yields: its objects, in document order, and the problems
/// with single objects (each message starts with where the object is).
#[derive(Debug, Default)]
pub struct Manifest {
    pub objects: Vec<ManifestObject>,
    pub errors: Vec<String>,
}

/// Why a text as a whole is unusable: none of its objects are read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// A JSON file that does not parse.
    #[error("invalid JSON: {0}")]
    Json(String),
    /// A YAML syntax error, in the given document (counted from 1).
    #[error("invalid YAML in document {document}: {message}")]
    Yaml { document: usize, message: String },
    /// More documents than [`MAX_OBJECTS_PER_FILE`].
    #[error("more than {MAX_OBJECTS_PER_FILE} documents; skipped")]
    TooManyDocuments,
    /// More documents and list items together than [`MAX_OBJECTS_PER_FILE`].
    #[error("more than {MAX_OBJECTS_PER_FILE} documents and list items; skipped")]
    TooManyObjects,
    /// Flow collections nested deeper than [`MAX_FLOW_NESTING`], first at `line`.
    #[error("line {line}: flow collections nested more than {MAX_FLOW_NESTING} deep; skipped")]
    TooDeep { line: usize },
}

/// Parses `text`. `Err` means the text as a whole is unusable (a syntax error, too many
/// documents); `origin` (a file name) only labels debug logs of ignored documents.
pub fn parse(text: &str, format: Format, origin: &str) -> Result<Manifest, ManifestError> {
    let mut objects = Vec::new();
    let errors = parse_each(text, format, origin, &mut |o| objects.push(o))?;
    Ok(Manifest { objects, errors })
}

/// [`parse`], handing each object to `emit` as soon as its document is read
/// (nothing of a document is kept once its objects are handed on); returns the
/// documents' and objects' errors. On `Err` the objects handed on so far are not
/// the text's: the text as a whole is unusable (the caller takes them back).
pub fn parse_each(
    text: &str,
    format: Format,
    origin: &str,
    emit: &mut dyn FnMut(ManifestObject),
) -> Result<Vec<String>, ManifestError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut unconverted = Vec::new();
    let mut errors = Vec::new();
    let mut out = Out {
        emit,
        errors: &mut errors,
    };
    match format {
        Format::Json => parse_documents(
            origin,
            parse_json(text)?.into_iter().map(|v| Ok(Some(v))),
            &mut out,
        )?,
        Format::Yaml => match json_document(text) {
            Some(value) => parse_documents(origin, std::iter::once(Ok(Some(value))), &mut out)?,
            None => parse_documents(origin, parse_yaml(text, &mut unconverted)?, &mut out)?,
        },
    }
    // Documents that did not convert come first: they are whole documents.
    errors.splice(0..0, unconverted);
    Ok(errors)
}

/// Where [`parse_documents`] puts what it reads.
struct Out<'a> {
    emit: &'a mut dyn FnMut(ManifestObject),
    errors: &'a mut Vec<String>,
}

/// YAML text that is one JSON document (`kubectl get -o json` saved as
/// `.yaml`), read by the JSON parser: twice as fast as the YAML parser on the
/// same text. `None` for anything else, a key given twice included: the YAML
/// parser then reads it, with its own messages.
fn json_document(text: &str) -> Option<Value> {
    if !text.trim_start().starts_with('{') {
        return None;
    }
    serde_json::from_str::<Strict>(text).ok().map(|s| s.0)
}

/// A JSON value that refuses a key given twice in an object (the YAML parser's
/// rule; serde_json's own tree keeps the last). A YAML document is read straight
/// into it, with no YAML tree between (that tree was a third of the parser's time
/// at 10k Services): a custom tag (`!foo x`) becomes `{"!foo": x}`, as the YAML
/// parser's own tree turns into JSON, and a key that is a YAML number or boolean its
/// text (`80: x` is `"80": x`, as sigs.k8s.io/yaml reads it for kubectl).
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    /// An empty YAML document.
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(Strict(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_enum<A: serde::de::EnumAccess<'de>>(self, data: A) -> Result<Value, A::Error> {
        use serde::de::VariantAccess;
        let (tag, contents) = data.variant::<String>()?;
        let Strict(value) = contents.newtype_variant()?;
        let tag = if tag.starts_with('!') {
            tag
        } else {
            format!("!{tag}")
        };
        Ok(Value::Object(Map::from_iter([(tag, value)])))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "duplicate entry with key {key:?}"
                )));
            }
            let Strict(value) = map.next_value()?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

fn parse_json(text: &str) -> Result<Vec<Value>, ManifestError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_str(text)
        .map(|v| vec![v])
        .map_err(|e| ManifestError::Json(e.to_string()))
}

/// Parses every document, each turned into its object tree before the next is
/// read (a file's documents are never all held as trees at once). A syntax error
/// anywhere fails the file: the parser stops there, so what follows it is unknown,
/// and a half-saved file must not delete the objects it held. A document that is
/// valid YAML but no valid object tree (a number out of range, a key given twice, a
/// key that is a list or a map) is that document's error alone (in `errors`): it is
/// `None`, and the others count. Told apart when a document fails: the whole text is then read
/// once for syntax alone (at most once per text), and a syntax error anywhere is
/// the file's (`Some(Err)`, the last item).
fn parse_yaml<'t>(
    text: &'t str,
    errors: &'t mut Vec<String>,
) -> Result<impl Iterator<Item = Result<Option<Value>, ManifestError>> + 't, ManifestError> {
    check_flow_nesting(text)?;
    let mut syntax_checked = false;
    let mut failed = false;
    Ok(yaml_serde::Deserializer::from_str(text)
        .enumerate()
        .map_while(move |(i, document)| {
            if failed {
                return None;
            }
            if i == MAX_OBJECTS_PER_FILE {
                failed = true;
                return Some(Err(ManifestError::TooManyDocuments));
            }
            let value = Strict::deserialize(document)
                .map_err(|e| crate::go_syntax::plain_serde_message(&e.to_string()));
            match value {
                Ok(Strict(v)) => Some(Ok(Some(v))),
                Err(e) => {
                    if !syntax_checked {
                        syntax_checked = true;
                        if let Err(fatal) = check_syntax(text) {
                            failed = true;
                            return Some(Err(fatal));
                        }
                    }
                    errors.push(format!("document {}: {e}; skipped", i + 1));
                    Some(Ok(None))
                }
            }
        }))
}

/// Reads every document of `text` for syntax alone: the first syntax error, as the
/// file's error.
fn check_syntax(text: &str) -> Result<(), ManifestError> {
    for (i, document) in yaml_serde::Deserializer::from_str(text).enumerate() {
        if i == MAX_OBJECTS_PER_FILE {
            return Err(ManifestError::TooManyDocuments);
        }
        serde::de::IgnoredAny::deserialize(document).map_err(|e| ManifestError::Yaml {
            document: i + 1,
            message: crate::go_syntax::plain_serde_message(&e.to_string()),
        })?;
    }
    Ok(())
}

/// Flow collections (`[...]`, `{...}`) nested deeper than this fail the file before
/// it is parsed. The YAML parser would fail them anyway (its recursion limit is 128),
/// but only after reading every event of the document into memory: seconds for a few
/// MiB of `[[[[`. Twice the parser's limit, so that brackets in plain or block
/// scalars, which this scan cannot tell apart, never reject a file the parser takes.
pub const MAX_FLOW_NESTING: usize = 256;

/// Rejects text whose flow collections nest deeper than [`MAX_FLOW_NESTING`], in one
/// pass over the bytes that stops at the first offending bracket. Brackets inside
/// quoted strings and comments are not counted; an apostrophe inside a plain scalar
/// (`don't`) is taken as a quote, which can only make the count lower.
fn check_flow_nesting(text: &str) -> Result<(), ManifestError> {
    #[derive(PartialEq)]
    enum In {
        Plain,
        Single,
        Double,
        Comment,
    }
    let mut state = In::Plain;
    let mut depth = 0usize;
    let mut line = 1usize;
    let mut previous = b'\n';
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b == b'\n' {
            line += 1;
        }
        match state {
            In::Plain => match b {
                b'[' | b'{' => {
                    depth += 1;
                    if depth > MAX_FLOW_NESTING {
                        return Err(ManifestError::TooDeep { line });
                    }
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                b'\'' => state = In::Single,
                b'"' => state = In::Double,
                b'#' if previous.is_ascii_whitespace() => state = In::Comment,
                _ => {}
            },
            // `''` inside a single-quoted string is a quote: leaving and entering again
            // comes to the same.
            In::Single if b == b'\'' => state = In::Plain,
            In::Double => match (b, b == b'\\' && bytes.next() == Some(b'\n')) {
                // An escape: the next byte is taken with it.
                (_, true) => line += 1,
                (b'"', _) => state = In::Plain,
                _ => {}
            },
            In::Comment if b == b'\n' => state = In::Plain,
            _ => {}
        }
        previous = b;
    }
    Ok(())
}

/// A value still to be looked at: a document or a list item.
struct Pending {
    value: Value,
    at: String,
    /// Inside a typed list (`ServiceList`): the apiVersion and kind its items lack.
    defaults: Option<(Option<String>, String)>,
    in_list: bool,
}

/// The objects of `documents` (`None`: a document that did not convert; `Err`:
/// the text is unusable), one document (and its list items) after the other.
fn parse_documents(
    origin: &str,
    documents: impl Iterator<Item = Result<Option<Value>, ManifestError>>,
    parsed: &mut Out<'_>,
) -> Result<(), ManifestError> {
    let mut seen = 0usize;
    for (i, value) in documents.enumerate() {
        let Some(value) = value? else { continue };
        let stack = vec![Pending {
            value,
            at: format!("document {}", i + 1),
            defaults: None,
            in_list: false,
        }];
        parse_document(origin, stack, parsed, &mut seen)?;
    }
    Ok(())
}

/// One document's objects, list items included, into `parsed`; `seen` counts the
/// file's documents and items so far.
fn parse_document(
    origin: &str,
    mut stack: Vec<Pending>,
    parsed: &mut Out<'_>,
    seen: &mut usize,
) -> Result<(), ManifestError> {
    while let Some(pending) = stack.pop() {
        *seen += 1;
        if *seen > MAX_OBJECTS_PER_FILE {
            return Err(ManifestError::TooManyObjects);
        }
        let Some(mut doc) = kind_of(origin, pending, parsed) else {
            continue;
        };
        if doc.kind.ends_with("List") && (doc.kind == "List" || doc.map.contains_key("items")) {
            stack.extend(list_items(&mut doc, parsed));
        } else {
            emit_object(origin, doc, parsed);
        }
    }
    Ok(())
}

/// An object tree with its kind and apiVersion (given, or its list's).
struct Typed {
    map: Map<String, Value>,
    at: String,
    api_version: Option<String>,
    kind: String,
}

/// `pending` as an object with a kind; `None` when it is none (an error said, or
/// not a Kubernetes object at all).
fn kind_of(origin: &str, pending: Pending, parsed: &mut Out<'_>) -> Option<Typed> {
    let Pending {
        value,
        at,
        defaults,
        in_list,
    } = pending;
    let map = match value {
        Value::Object(map) => map,
        // An empty document (`---` twice, a comment-only file).
        Value::Null if !in_list => return None,
        other => {
            parsed.errors.push(format!(
                "{at}: is {}, not an object; skipped",
                json_type(&other)
            ));
            return None;
        }
    };
    let (default_version, default_kind) = match defaults {
        Some((v, k)) => (v, Some(k)),
        None => (None, None),
    };
    let api_version = str_field(&map, "apiVersion").or(default_version);
    let Some(kind) = str_field(&map, "kind").or(default_kind) else {
        if in_list {
            parsed
                .errors
                .push(format!("{at}: list item has no kind; skipped"));
        } else if map.contains_key("metadata") {
            // Shaped like an object (a `metadata`), so a forgotten `kind`, not
            // some other YAML (a Helm Chart.yaml, a config file).
            parsed.errors.push(format!(
                "{at}: {} has metadata but no kind; skipped",
                object_name(&map)
            ));
        } else {
            tracing::debug!(origin, "{at}: no kind; not a Kubernetes object, ignored");
        }
        return None;
    };
    Some(Typed {
        map,
        at,
        api_version,
        kind,
    })
}

/// A list's items, still to be looked at (in order when popped), each with the
/// apiVersion and kind a typed list (`ServiceList`) gives it.
fn list_items(list: &mut Typed, parsed: &mut Out<'_>) -> Vec<Pending> {
    let Typed {
        map,
        at,
        api_version,
        kind,
    } = list;
    let items = match map.remove("items") {
        Some(Value::Array(items)) => items,
        None | Some(Value::Null) => Vec::new(),
        Some(other) => {
            parsed.errors.push(format!(
                "{at}: {kind} items is {}, not a list; skipped",
                json_type(&other)
            ));
            return Vec::new();
        }
    };
    let item_defaults = match kind.strip_suffix("List") {
        Some(item_kind) if !item_kind.is_empty() => {
            Some((api_version.clone(), item_kind.to_string()))
        }
        _ => None,
    };
    items
        .into_iter()
        .enumerate()
        .rev()
        .map(|(i, value)| Pending {
            value,
            at: format!("{at}, items[{i}]"),
            defaults: item_defaults.clone(),
            in_list: true,
        })
        .collect()
}

/// One object handed on, if it is of a kind svcproxy reads and reads as one (an
/// Endpoints object as the slices it mirrors to); else its error said.
fn emit_object(origin: &str, doc: Typed, parsed: &mut Out<'_>) {
    let Typed {
        map,
        at,
        api_version,
        kind,
    } = doc;
    let target = match target(api_version.as_deref(), &kind) {
        Ok(Some(t)) => t,
        Ok(None) => {
            tracing::debug!(
                origin,
                "{at}: {} {kind} is not used by svcproxy; ignored",
                api_version.as_deref().unwrap_or("")
            );
            return;
        }
        Err(reason) => {
            parsed.errors.push(format!(
                "{at}: {kind} {}: {reason}; skipped",
                object_name(&map)
            ));
            return;
        }
    };
    let name = object_name(&map);
    let object = match deserialize(target, map) {
        Ok(o) => o,
        Err(reason) => {
            parsed
                .errors
                .push(format!("{at}: {kind} {name}: {reason}; skipped"));
            return;
        }
    };
    let key = object.key();
    if key.name.is_empty() {
        parsed
            .errors
            .push(format!("{at}: {kind} has no metadata.name; skipped"));
        return;
    }
    if let KubeObject::Endpoints(ep) = &object {
        let mirrored = endpoints_to_slices(ep);
        for problem in mirrored.problems {
            parsed.errors.push(format!("{at}: {key}: {problem}"));
        }
        for slice in mirrored.slices {
            let object = KubeObject::EndpointSlice(slice);
            (parsed.emit)(ManifestObject {
                key: object.key(),
                object: Arc::new(object),
                at: at.clone(),
                mirrored_from: Some(key.clone()),
            });
        }
        return;
    }
    (parsed.emit)(ManifestObject {
        key,
        object: Arc::new(object),
        at,
        mirrored_from: None,
    });
}

#[derive(Clone, Copy, Debug)]
enum Target {
    Service,
    EndpointSlice,
    Node,
    ServiceCidr,
    Endpoints,
    Pod,
}

/// Which of our types `apiVersion`/`kind` names. `Ok(None)` for other kinds, including
/// another group's kind of the same name (a Knative `Service`); `Err` for a version
/// of one of our groups that we do not read, which would otherwise vanish silently.
fn target(api_version: Option<&str>, kind: &str) -> Result<Option<Target>, String> {
    let (target, group, versions): (Target, &str, &[&str]) = match kind {
        "Service" => (Target::Service, "", &["v1"]),
        "Node" => (Target::Node, "", &["v1"]),
        "Endpoints" => (Target::Endpoints, "", &["v1"]),
        // For the cluster DNS (a client's node); the proxy ignores them.
        "Pod" => (Target::Pod, "", &["v1"]),
        "EndpointSlice" => (Target::EndpointSlice, "discovery.k8s.io", &["v1"]),
        // v1beta1 has the same shape as v1.
        "ServiceCIDR" => (Target::ServiceCidr, "networking.k8s.io", &["v1", "v1beta1"]),
        _ => return Ok(None),
    };
    let wanted = |v: &str| {
        if group.is_empty() {
            v.to_string()
        } else {
            format!("{group}/{v}")
        }
    };
    let Some(api_version) = api_version else {
        return Err(format!("no apiVersion (want {})", wanted(versions[0])));
    };
    let (have_group, have_version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    if have_group != group {
        return Ok(None);
    }
    if versions.contains(&have_version) {
        Ok(Some(target))
    } else {
        Err(format!(
            "apiVersion {} is not supported (want {})",
            quote(api_version),
            wanted(versions[0])
        ))
    }
}

fn deserialize(target: Target, mut map: Map<String, Value>) -> Result<KubeObject, String> {
    /// The error names the field (`spec.ports[0].port: ...`) in the author's words.
    fn de<T: DeserializeOwned>(map: Map<String, Value>) -> Result<T, String> {
        serde_path_to_error::deserialize(Value::Object(map)).map_err(|e| {
            let msg = crate::go_syntax::plain_serde_message(&e.inner().to_string());
            match e.path().to_string() {
                p if p.is_empty() || p == "." => msg,
                p => format!("{p}: {msg}"),
            }
        })
    }
    Ok(match target {
        Target::Service => KubeObject::Service(de::<Service>(map)?),
        Target::EndpointSlice => KubeObject::EndpointSlice(de::<EndpointSlice>(map)?),
        Target::Node => KubeObject::Node(Box::new(de::<Node>(map)?)),
        Target::Endpoints => KubeObject::Endpoints(de::<Endpoints>(map)?),
        Target::Pod => KubeObject::Pod(Box::new(de::<Pod>(map)?)),
        Target::ServiceCidr => {
            // The v1 type checks apiVersion, and v1beta1 is the same shape.
            map.insert(
                "apiVersion".to_string(),
                Value::String("networking.k8s.io/v1".to_string()),
            );
            KubeObject::ServiceCidr(de::<ServiceCIDR>(map)?)
        }
    })
}

fn str_field(map: &Map<String, Value>, field: &str) -> Option<String> {
    map.get(field)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// `"ns/name"`, `"name"` or `(no name)`, quoted for a message.
fn object_name(map: &Map<String, Value>) -> String {
    let meta = map.get("metadata");
    let field = |f: &str| meta.and_then(|m| m.get(f)).and_then(Value::as_str);
    match (field("namespace"), field("name")) {
        (_, None) | (_, Some("")) => "(no name)".to_string(),
        (Some(ns), Some(name)) if !ns.is_empty() => quote(&format!("{ns}/{name}")),
        (_, Some(name)) => quote(name),
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A YAML file holding one JSON document is read by the JSON parser, to the
    /// same objects; what the JSON parser refuses (a key given twice, YAML's own
    /// flow syntax, a second document) the YAML parser reads as before.
    #[test]
    fn a_json_document_in_yaml_text_reads_as_its_yaml_twin() {
        let json = r#"{"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": "web", "namespace": "default"},
             "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80, "protocol": "TCP"}]}},
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}]}"#;
        let yaml = "apiVersion: v1\nkind: List\nitems:\n\
            - apiVersion: v1\n  kind: Service\n  metadata: {name: web, namespace: default}\n  \
              spec: {clusterIP: 10.96.0.10, ports: [{port: 80, protocol: TCP}]}\n\
            - {apiVersion: v1, kind: Node, metadata: {name: n1}}\n";
        let from_json = parse(json, Format::Yaml, "t").unwrap();
        let from_yaml = parse(yaml, Format::Yaml, "t").unwrap();
        assert!(json_document(json).is_some(), "the fast path was taken");
        assert_eq!(from_json.objects.len(), 2);
        for (a, b) in from_json.objects.iter().zip(&from_yaml.objects) {
            assert_eq!((&a.key, &a.at, &a.object), (&b.key, &b.at, &b.object));
        }

        let twice =
            r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "name": "n2"}}"#;
        assert!(json_document(twice).is_none());
        let m = parse(twice, Format::Yaml, "t").unwrap();
        assert!(m.objects.is_empty());
        assert!(
            m.errors[0].starts_with("document 1:") && m.errors[0].contains("duplicate"),
            "{:?}",
            m.errors
        );

        for yaml_only in [
            "{apiVersion: v1, kind: Node, metadata: {name: n1}}",
            "{\"apiVersion\": \"v1\", \"kind\": \"Node\", \"metadata\": {\"name\": \"n1\"}}\n---\n{\"apiVersion\": \"v1\", \"kind\": \"Node\", \"metadata\": {\"name\": \"n2\"}}",
        ] {
            assert!(json_document(yaml_only).is_none(), "{yaml_only}");
            assert!(!parse(yaml_only, Format::Yaml, "t").unwrap().objects.is_empty());
        }
    }

    /// One pass over the text: a document error is the document's, unless a
    /// syntax error anywhere (before or after it) makes the text unusable.
    #[test]
    fn a_syntax_error_anywhere_fails_the_text_and_a_document_error_only_its_document() {
        let good = "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n";
        let twice = "apiVersion: v1\nkind: Node\nmetadata: {name: n2}\nkind: Node\n";
        let broken = "apiVersion: v1\nkind: [Node\n";
        let m = parse(&format!("{good}---\n{twice}---\n{good}"), Format::Yaml, "t").unwrap();
        assert_eq!(m.objects.len(), 2);
        assert_eq!(m.errors.len(), 1, "{:?}", m.errors);
        assert!(m.errors[0].starts_with("document 2:"), "{:?}", m.errors);
        for (text, at) in [
            (format!("{good}---\n{twice}---\n{broken}"), 3),
            (format!("{good}---\n{broken}---\n{twice}"), 2),
            (format!("{good}---\n{good}---\n{broken}"), 3),
        ] {
            let err = parse(&text, Format::Yaml, "t").unwrap_err();
            assert!(
                matches!(err, ManifestError::Yaml { document, .. } if document == at),
                "{err}"
            );
        }
    }

    #[test]
    fn deep_flow_nesting_is_refused_before_parsing_whatever_the_size() {
        for open in ["[", "{a: ", "[{b: "] {
            let text = format!(
                "apiVersion: v1\nkind: Service\nspec: {}",
                open.repeat(4 << 20)
            );
            let start = Instant::now();
            let err = parse(&text, Format::Yaml, "deep.yaml").unwrap_err();
            assert!(
                start.elapsed() < Duration::from_millis(500),
                "{open}: {:?}",
                start.elapsed()
            );
            assert_eq!(err, ManifestError::TooDeep { line: 3 }, "{err}");
            assert!(
                err.to_string()
                    .contains("line 3: flow collections nested more than 256"),
                "{err}"
            );
        }
    }

    #[test]
    fn brackets_in_strings_and_comments_are_not_nesting() {
        let deep = "[".repeat(MAX_FLOW_NESTING + 10);
        let text = format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: web # {deep}\n  \
             annotations: {{a: '{deep}', b: \"\\\"{deep}\", c: 'it''s {deep}'}}\n"
        );
        assert_eq!(check_flow_nesting(&text), Ok(()));
        let m = parse(&text, Format::Yaml, "ok.yaml").unwrap();
        assert_eq!(m.objects.len(), 1, "{:?}", m.errors);
        // Balanced nesting up to the limit passes the scan (the parser has its own).
        let ok = format!(
            "{}{}",
            "[".repeat(MAX_FLOW_NESTING),
            "]".repeat(MAX_FLOW_NESTING)
        );
        assert_eq!(check_flow_nesting(&ok), Ok(()));
        let wide = "[[]]".repeat(100_000);
        assert_eq!(check_flow_nesting(&wide), Ok(()));
    }

    /// A document read straight into the JSON tree is what the YAML parser's own
    /// tree turned into JSON was (the reader before): tags, keys that are numbers
    /// or booleans, anchors, special floats, big numbers, empty values; and what
    /// that tree refused, this refuses too (in words of its own).
    #[test]
    fn a_document_reads_as_the_yaml_tree_turned_into_json() {
        fn through_yaml_tree(text: &str) -> Result<Value, String> {
            let v = yaml_serde::Value::deserialize(yaml_serde::Deserializer::from_str(text))
                .map_err(|e| e.to_string())?;
            serde_json::to_value(v).map_err(|e| e.to_string())
        }
        fn straight(text: &str) -> Result<Value, String> {
            Strict::deserialize(yaml_serde::Deserializer::from_str(text))
                .map(|s| s.0)
                .map_err(|e| e.to_string())
        }
        for text in [
            "a: 1\nb: [x, 'y', \"z\"]\nc: {d: null, e: ~, f: true}\n",
            "port: !custom 80\n",
            "port: !!str 80\nn: !!int \"7\"\nf: !!float 1\nb: !!bool true\nz: !!null ''\n",
            "list: !tagged [1, 2]\nmap: !m {a: b}\n",
            "80: http\ntrue: yes\n1.5: x\n",
            "a: &anchor {x: 1}\nb: *anchor\n",
            "inf: .inf\nninf: -.inf\nnan: .nan\n",
            "big: 123456789012345678901234567890\nneg: -9223372036854775809\nmax: 18446744073709551615\n",
            "hex: 0x1F\noct: 0o17\nexp: 1e3\nplus: +5\n",
            "empty:\nquoted: ''\n",
            "",
            "- 1\n- two\n",
            "plain\n",
            "time: 12:30:00\nversion: 1.20\n",
        ] {
            match (straight(text), through_yaml_tree(text)) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{text:?}"),
                (Err(_), Err(_)) => {}
                (a, b) => panic!("{text:?}: {a:?} against {b:?}"),
            }
        }
        // Refused by both (the messages differ). One difference: a null key (`~: x`)
        // is its text, `"~"`, where the tree refused it; no field of an object svcproxy
        // reads has such a name, so it is ignored as any unknown field.
        assert_eq!(straight("~: x\n"), Ok(serde_json::json!({"~": "x"})));
        for text in ["a: 1\na: 2\n", "? [a, b]\n: c\n"] {
            assert!(straight(text).is_err(), "{text:?}: {:?}", straight(text));
            assert!(through_yaml_tree(text).is_err(), "{text:?}");
        }
    }
}
