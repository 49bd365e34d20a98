//! Encoding: which representation the client's `Accept` asks for (the object,
//! or `PartialObjectMetadata`), objects written as JSON, and the lines of a
//! watch stream (events, bookmarks, errors).
//!
//! Entry points: [`parse_accept`], [`write_object`], [`event_line`],
//! [`bookmark_line`], [`error_line`].

use super::*;

/// What the client asked for in `Accept`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Want {
    Full,
    /// `as=PartialObjectMetadata;g=meta.k8s.io;v=v1`
    Meta,
    /// `as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`
    MetaList,
}

/// The first media range we can serve, ignoring q-values (None: nothing acceptable).
pub(super) fn parse_accept(accept: Option<&str>) -> Option<Want> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Some(Want::Full);
    };
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let mime = parts.next().unwrap_or("").to_ascii_lowercase();
        if !matches!(mime.as_str(), "application/json" | "application/*" | "*/*") {
            continue;
        }
        let (mut as_, mut g, mut v) = ("", "", "");
        for p in parts {
            match p.split_once('=') {
                Some(("as", x)) => as_ = x,
                Some(("g", x)) => g = x,
                Some(("v", x)) => v = x,
                _ => {}
            }
        }
        let meta_group = g == "meta.k8s.io" && (v == "v1" || v == "v1beta1");
        match as_ {
            "" => return Some(Want::Full),
            "PartialObjectMetadata" if meta_group => return Some(Want::Meta),
            "PartialObjectMetadataList" if meta_group => return Some(Want::MetaList),
            _ => {}
        }
    }
    None
}

pub(super) fn not_acceptable() -> Response {
    status_response(
        StatusCode::NOT_ACCEPTABLE,
        "NotAcceptable",
        "only the following media types are accepted: application/json, application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
        None,
    )
}

#[derive(Serialize)]
struct Partial<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: &'a Value,
}

static EMPTY_META: Value = Value::Null;

pub(super) fn write_object(out: &mut Vec<u8>, obj: &Value, meta: bool) {
    if meta {
        let m = obj.get("metadata").unwrap_or(&EMPTY_META);
        let empty = json!({});
        let partial = Partial {
            kind: "PartialObjectMetadata",
            api_version: META_API_VERSION,
            metadata: if m.is_null() { &empty } else { m },
        };
        serde_json::to_writer(&mut *out, &partial).expect("JSON");
    } else {
        serde_json::to_writer(&mut *out, obj).expect("JSON");
    }
}

pub(super) fn event_line(ty: &str, obj: &Value, meta: bool) -> Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(ty.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    write_object(&mut out, obj, meta);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

pub(super) fn bookmark_line(info: &KindInfo, meta: bool, rv: u64, initial_end: bool) -> Bytes {
    let (kind, api_version) = if meta {
        ("PartialObjectMetadata", META_API_VERSION)
    } else {
        (info.kind, info.api_version)
    };
    let mut m = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        m["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let obj = json!({"kind": kind, "apiVersion": api_version, "metadata": m});
    let mut out = serde_json::to_vec(&json!({"type": "BOOKMARK", "object": obj})).expect("JSON");
    out.push(b'\n');
    Bytes::from(out)
}

pub(super) fn error_line(status: &Value) -> Bytes {
    let mut out = serde_json::to_vec(&json!({"type": "ERROR", "object": status})).expect("JSON");
    out.push(b'\n');
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_negotiation() {
        assert_eq!(parse_accept(None), Some(Want::Full));
        assert_eq!(parse_accept(Some("application/json")), Some(Want::Full));
        assert_eq!(parse_accept(Some("*/*")), Some(Want::Full));
        assert_eq!(
            parse_accept(Some(
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
            )),
            Some(Want::MetaList)
        );
        assert_eq!(
            parse_accept(Some(
                "application/json; as=PartialObjectMetadata; g=meta.k8s.io; v=v1, application/json"
            )),
            Some(Want::Meta)
        );
        assert_eq!(
            parse_accept(Some(
                "application/json;as=Table;g=meta.k8s.io;v=v1, application/json"
            )),
            Some(Want::Full)
        );
        assert_eq!(
            parse_accept(Some("application/vnd.kubernetes.protobuf")),
            None
        );
    }
}
