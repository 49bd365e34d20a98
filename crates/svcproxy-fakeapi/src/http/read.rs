//! Reads that are not watches: a single object's GET, and lists, with
//! `resourceVersion`/`resourceVersionMatch`, selectors and pages (`limit` and
//! continue tokens, consistent across pages).
//!
//! Entry points: [`Ctx::get`], [`Ctx::list`].

use super::*;

impl Ctx<'_> {
    pub(super) fn get(&self, kind: usize, ns: &str, name: &str) -> Response {
        let info = &KINDS[kind];
        let meta = match parse_accept(self.accept) {
            Some(Want::Full) => false,
            Some(Want::Meta) => true,
            Some(Want::MetaList) | None => return not_acceptable(),
        };
        let obj = self
            .shared
            .store()
            .get(kind, &(ns.to_string(), name.to_string()));
        match obj {
            None => object_not_found(info.group, info.plural, name),
            Some(obj) => {
                let mut out = Vec::new();
                write_object(&mut out, &obj, meta);
                json_bytes_response(StatusCode::OK, out)
            }
        }
    }

    pub(super) fn list(&self, kind: usize, ns: Option<&str>) -> Response {
        let info = &KINDS[kind];
        let meta = match parse_accept(self.accept) {
            Some(Want::Full) => false,
            Some(Want::MetaList) => true,
            Some(Want::Meta) | None => return not_acceptable(),
        };
        let filter = match self.filter(ns) {
            Ok(f) => f,
            Err(r) => return r,
        };
        let limit = match self.param("limit").filter(|s| !s.is_empty()) {
            None => None,
            Some(l) => match l.parse::<i64>() {
                Ok(n) if n > 0 => Some(n as usize),
                Ok(_) => None,
                Err(_) => return bad_request(&format!("invalid limit {l:?}")),
            },
        };
        let rv_param = self.param("resourceVersion").unwrap_or("");
        let rv_match = self.param("resourceVersionMatch").unwrap_or("");
        let cont = self.param("continue").unwrap_or("");
        let store = self.shared.store();
        let (at_rv, after) = if !cont.is_empty() {
            if !rv_param.is_empty() && rv_param != "0" {
                return invalid("ListOptions", "resourceVersion: Forbidden: specifying resource version is not allowed when using continue");
            }
            if !rv_match.is_empty() {
                return invalid("ListOptions", "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided");
            }
            let Some((rv, key)) = decode_continue(cont) else {
                return bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)");
            };
            if rv < store.compacted {
                return status_response(
                    StatusCode::GONE,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                    None,
                );
            }
            (rv, Some(key))
        } else if rv_param.is_empty() {
            if !rv_match.is_empty() {
                return invalid("ListOptions", "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided");
            }
            (store.rv, None)
        } else {
            let Ok(rv) = rv_param.parse::<u64>() else {
                return bad_request(&format!("invalid resource version: {rv_param:?}"));
            };
            match rv_match {
                "Exact" => {
                    if rv == 0 {
                        return invalid("ListOptions", "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"");
                    }
                    (rv, None)
                }
                "" | "NotOlderThan" => {
                    if rv > store.rv {
                        return too_large(rv, store.rv);
                    }
                    (store.rv, None)
                }
                other => {
                    return invalid(
                        "ListOptions",
                        &format!("resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""),
                    )
                }
            }
        };
        let page = match store.list(kind, at_rv, after.as_ref(), limit, &filter) {
            Ok(p) => p,
            Err(e) => return rv_error_response(e, "list", at_rv),
        };
        drop(store);
        let (list_kind, api_version) = if meta {
            ("PartialObjectMetadataList", META_API_VERSION)
        } else {
            (info.list_kind, info.api_version)
        };
        let mut list_meta = Map::new();
        list_meta.insert("resourceVersion".into(), json!(at_rv.to_string()));
        if let Some(next) = &page.next {
            list_meta.insert("continue".into(), json!(encode_continue(at_rv, next)));
            if let Some(n) = page.remaining {
                list_meta.insert("remainingItemCount".into(), json!(n));
            }
        }
        let mut out = Vec::with_capacity(1024 + page.items.len() * 512);
        out.extend_from_slice(
            format!(
                "{{\"kind\":\"{list_kind}\",\"apiVersion\":\"{api_version}\",\"metadata\":{},\"items\":[",
                Value::Object(list_meta)
            )
            .as_bytes(),
        );
        for (i, item) in page.items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_object(&mut out, item, meta);
        }
        out.extend_from_slice(b"]}");
        json_bytes_response(StatusCode::OK, out)
    }
}

// Continue tokens: base64url of {"v":"meta.k8s.io/v1","rv":N,"start":"ns/name"}

fn encode_continue(rv: u64, key: &store::Key) -> String {
    let token = json!({"v": META_API_VERSION, "rv": rv, "start": format!("{}/{}", key.0, key.1)});
    util::base64url_encode(token.to_string().as_bytes())
}

fn decode_continue(token: &str) -> Option<(u64, store::Key)> {
    let raw = util::base64url_decode(token)?;
    let v: Value = serde_json::from_slice(&raw).ok()?;
    if v.get("v")?.as_str()? != META_API_VERSION {
        return None;
    }
    let rv = v.get("rv")?.as_u64().filter(|rv| *rv > 0)?;
    let (ns, name) = v.get("start")?.as_str()?.split_once('/')?;
    Some((rv, (ns.to_string(), name.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let key = ("ns".to_string(), "a-b".to_string());
        let t = encode_continue(42, &key);
        assert_eq!(decode_continue(&t), Some((42, key)));
        let cluster = (String::new(), "node-1".to_string());
        assert_eq!(
            decode_continue(&encode_continue(7, &cluster)),
            Some((7, cluster))
        );
        assert_eq!(decode_continue("garbage!"), None);
        assert_eq!(
            decode_continue(&util::base64url_encode(b"{\"rv\":1}")),
            None
        );
    }
}
