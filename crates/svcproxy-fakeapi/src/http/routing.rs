//! Routing: a request's path and method to the handler of the kind it names
//! (or of Events), with its query parameters and selectors.
//!
//! Entry point: [`Ctx::route`].

use super::*;

impl Ctx<'_> {
    pub(super) fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn bool_param(&self, name: &str) -> Result<Option<bool>, Response> {
        match self.param(name) {
            None | Some("") => Ok(None),
            Some(v) => util::parse_bool(v)
                .map(Some)
                .ok_or_else(|| bad_request(&format!("invalid boolean for {name}: {v:?}"))),
        }
    }

    pub(super) fn route(&self) -> Response {
        let segs: Vec<&str> = self
            .path
            .trim_matches('/')
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        let (group, version, rest) = match segs.as_slice() {
            ["version"] => {
                return json_response(
                    StatusCode::OK,
                    &json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0-svcproxy-fakeapi",
                            "platform": "linux/amd64"}),
                )
            }
            ["healthz" | "livez" | "readyz"] => {
                return Response::builder()
                    .status(StatusCode::OK)
                    .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
                    .body(Body::from("ok"))
                    .expect("a valid response")
            }
            ["api", "v1", rest @ ..] => ("", "v1", rest),
            ["apis", g, v, rest @ ..] => (*g, *v, rest),
            _ => return not_found_path(),
        };
        let (ns, plural, name) = match rest {
            [plural] => (None, *plural, None),
            [plural, name] => (None, *plural, Some(*name)),
            ["namespaces", ns, plural] => (Some(*ns), *plural, None),
            ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name)),
            _ => return not_found_path(),
        };
        if plural == "events" {
            match (group, version) {
                ("events.k8s.io", "v1") => return self.events(EventsApi::EventsV1, ns, name),
                ("", "v1") => return self.events(EventsApi::CoreV1, ns, name),
                _ => {}
            }
        }
        let Some(kind) = KINDS
            .iter()
            .position(|k| k.group == group && k.version == version && k.plural == plural)
        else {
            return not_found_path();
        };
        let info = &KINDS[kind];
        if self.shared.store().unserved[kind] {
            return not_found_path();
        }
        if ns.is_some() && !info.namespaced {
            return not_found_path();
        }
        match name {
            Some(name) => {
                if info.namespaced && ns.is_none() {
                    return not_found_path();
                }
                if self.method != Method::GET {
                    return method_not_allowed();
                }
                self.get(kind, ns.unwrap_or(""), name)
            }
            None => {
                if self.method != Method::GET {
                    return method_not_allowed();
                }
                match self.bool_param("watch") {
                    Err(r) => r,
                    Ok(Some(true)) => self.watch(kind, ns),
                    Ok(_) => self.list(kind, ns),
                }
            }
        }
    }

    pub(super) fn filter(&self, ns: Option<&str>) -> Result<Filter, Response> {
        let labels = LabelSelector::parse(self.param("labelSelector").unwrap_or(""))
            .map_err(|e| bad_request(&e))?;
        let mut fields = FieldSelector::parse(self.param("fieldSelector").unwrap_or(""))
            .map_err(|e| bad_request(&e))?;
        if let Some(ns) = ns {
            fields = fields.with_namespace(ns);
        }
        Ok(Filter { labels, fields })
    }
}
