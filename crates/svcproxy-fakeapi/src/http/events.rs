//! Events (events.k8s.io/v1 and core v1): stored, not watchable. They can be
//! created, patched, replaced, read, listed and deleted.
//!
//! Entry point: [`Ctx::events`].

use super::*;

impl Ctx<'_> {
    pub(super) fn events(&self, api: EventsApi, ns: Option<&str>, name: Option<&str>) -> Response {
        let (api_version, group): (&'static str, &str) = match api {
            EventsApi::EventsV1 => ("events.k8s.io/v1", "events.k8s.io"),
            EventsApi::CoreV1 => ("v1", ""),
        };
        match (self.method.clone(), ns, name) {
            (Method::GET, _, None) => {
                let store = self.shared.store();
                let items: Vec<&Value> = store
                    .events
                    .iter()
                    .filter(|((av, ens, _), _)| *av == api_version && ns.is_none_or(|n| n == ens))
                    .map(|(_, v)| v)
                    .collect();
                json_response(
                    StatusCode::OK,
                    &json!({"kind": "EventList", "apiVersion": api_version,
                            "metadata": {"resourceVersion": store.rv.to_string()}, "items": items}),
                )
            }
            (Method::POST, Some(ns), None) => self.create_event(api_version, group, ns),
            (Method::GET, Some(ns), Some(name)) => {
                let key = (api_version, ns.to_string(), name.to_string());
                match self.shared.store().events.get(&key) {
                    Some(ev) => json_response(StatusCode::OK, ev),
                    None => object_not_found(group, "events", name),
                }
            }
            (Method::PATCH, Some(ns), Some(name)) => self.patch_event(api_version, group, ns, name),
            (Method::PUT, Some(ns), Some(name)) => self.put_event(api_version, group, ns, name),
            (Method::DELETE, Some(ns), Some(name)) => {
                let key = (api_version, ns.to_string(), name.to_string());
                let mut store = self.shared.store();
                if store.events.remove(&key).is_none() {
                    return object_not_found(group, "events", name);
                }
                store.next_rv();
                json_response(
                    StatusCode::OK,
                    &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                            "details": {"name": name, "group": group, "kind": "events"}}),
                )
            }
            _ => method_not_allowed(),
        }
    }

    fn body_object(&self) -> Result<Value, Response> {
        let v: Value = serde_json::from_slice(self.body).map_err(|e| {
            bad_request(&format!(
                "the body of the request was in an unknown format: {e}"
            ))
        })?;
        if !v.is_object() {
            return Err(bad_request("the body of the request is not a JSON object"));
        }
        Ok(v)
    }

    fn create_event(&self, api_version: &'static str, group: &str, ns: &str) -> Response {
        let mut ev = match self.body_object() {
            Ok(v) => v,
            Err(r) => return r,
        };
        if !ev.get("metadata").is_some_and(Value::is_object) {
            ev["metadata"] = json!({});
        }
        let body_ns = ev["metadata"]
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !body_ns.is_empty() && body_ns != ns {
            return bad_request("the namespace of the provided object does not match the namespace sent on the request");
        }
        let name = match ev["metadata"].get("name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match ev["metadata"].get("generateName").and_then(Value::as_str) {
                Some(g) if !g.is_empty() => format!("{g}{}", util::suffix(util::random_u64(), 5)),
                _ => {
                    return invalid(
                        "Event",
                        "metadata.name: Required value: name or generateName is required",
                    )
                }
            },
        };
        let key = (api_version, ns.to_string(), name.clone());
        let mut store = self.shared.store();
        if store.events.contains_key(&key) {
            let qualified = if group.is_empty() {
                "events".to_string()
            } else {
                format!("events.{group}")
            };
            return status_response(
                StatusCode::CONFLICT,
                "AlreadyExists",
                &format!("{qualified} \"{name}\" already exists"),
                Some(json!({"name": name, "group": group, "kind": "events"})),
            );
        }
        let rv = store.next_rv();
        stamp_event(
            &mut ev,
            api_version,
            ns,
            &name,
            Some(json!(util::new_uid())),
            Some(json!(util::now_rfc3339())),
            rv,
        );
        store.events.insert(key.clone(), ev.clone());
        store.event_order.push(key);
        json_response(StatusCode::CREATED, &ev)
    }

    fn patch_event(
        &self,
        api_version: &'static str,
        group: &str,
        ns: &str,
        name: &str,
    ) -> Response {
        let ct = self
            .content_type
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim();
        let apply = match ct {
            "application/merge-patch+json" | "application/strategic-merge-patch+json" => false,
            "application/apply-patch+yaml" | "application/apply-patch+json" => true,
            _ => {
                return status_response(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UnsupportedMediaType",
                    &format!("the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {ct:?})"),
                    None,
                )
            }
        };
        let patch = match self.body_object() {
            Ok(v) => v,
            Err(r) => return r,
        };
        let key = (api_version, ns.to_string(), name.to_string());
        let mut store = self.shared.store();
        let (mut ev, created) = match store.events.get(&key) {
            Some(ev) => (ev.clone(), false),
            None if apply => (
                json!({"metadata": {"uid": util::new_uid(), "creationTimestamp": util::now_rfc3339()}}),
                true,
            ),
            None => return object_not_found(group, "events", name),
        };
        let keep = |ev: &Value, f: &str| ev["metadata"].get(f).cloned();
        let (uid, created_at) = (keep(&ev, "uid"), keep(&ev, "creationTimestamp"));
        util::merge_patch(&mut ev, &patch);
        let rv = store.next_rv();
        stamp_event(&mut ev, api_version, ns, name, uid, created_at, rv);
        store.events.insert(key.clone(), ev.clone());
        if created {
            store.event_order.push(key);
            return json_response(StatusCode::CREATED, &ev);
        }
        json_response(StatusCode::OK, &ev)
    }

    fn put_event(&self, api_version: &'static str, group: &str, ns: &str, name: &str) -> Response {
        let mut ev = match self.body_object() {
            Ok(v) => v,
            Err(r) => return r,
        };
        let key = (api_version, ns.to_string(), name.to_string());
        let mut store = self.shared.store();
        let Some(old) = store.events.get(&key).cloned() else {
            return object_not_found(group, "events", name);
        };
        if ev["metadata"]
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| n != name)
        {
            return bad_request("the name of the object does not match the name on the URL");
        }
        let rv = store.next_rv();
        let keep = |f: &str| Some(old["metadata"][f].clone());
        stamp_event(
            &mut ev,
            api_version,
            ns,
            name,
            keep("uid"),
            keep("creationTimestamp"),
            rv,
        );
        store.events.insert(key, ev.clone());
        json_response(StatusCode::OK, &ev)
    }
}

/// Sets the fields of an Event the server owns: its type, identity, and (when given)
/// uid and creation time, and the new resourceVersion.
fn stamp_event(
    ev: &mut Value,
    api_version: &str,
    ns: &str,
    name: &str,
    uid: Option<Value>,
    created: Option<Value>,
    rv: u64,
) {
    ev["kind"] = json!("Event");
    ev["apiVersion"] = json!(api_version);
    if !ev.get("metadata").is_some_and(Value::is_object) {
        ev["metadata"] = json!({});
    }
    let meta = ev["metadata"].as_object_mut().expect("object");
    meta.insert("name".into(), json!(name));
    meta.insert("namespace".into(), json!(ns));
    if let Some(uid) = uid {
        meta.insert("uid".into(), uid);
    }
    if let Some(ts) = created {
        meta.insert("creationTimestamp".into(), ts);
    }
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
}
