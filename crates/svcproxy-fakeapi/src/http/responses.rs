//! The responses that are not objects: JSON bodies, and the `Status` errors
//! the API server gives (not found, bad request, invalid, gone, too large).
//!
//! Entry points: [`status_object`], [`status_response`] and one function per
//! error.

use super::*;

pub(super) fn json_bytes_response(code: StatusCode, body: Vec<u8>) -> Response {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("a valid response")
}

pub(super) fn json_response(code: StatusCode, v: &Value) -> Response {
    json_bytes_response(code, serde_json::to_vec(v).expect("JSON"))
}

/// A `Status` object (as JSON value).
pub(crate) fn status_object(
    code: u16,
    reason: &str,
    message: &str,
    details: Option<Value>,
) -> Value {
    let mut s = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    if let Some(d) = details {
        s["details"] = d;
    }
    s
}

pub(super) fn status_response(
    code: StatusCode,
    reason: &str,
    message: &str,
    details: Option<Value>,
) -> Response {
    // As the API server's responsewriters: a Status asking to be retried after some
    // seconds says so in a Retry-After header too, which clients act on.
    let retry_after = details
        .as_ref()
        .and_then(|d| d.get("retryAfterSeconds"))
        .and_then(Value::as_u64)
        .filter(|s| *s > 0);
    let mut resp = json_response(
        code,
        &status_object(code.as_u16(), reason, message, details),
    );
    if let Some(secs) = retry_after {
        resp.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(secs),
        );
    }
    resp
}

pub(super) fn not_found_path() -> Response {
    status_response(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource",
        Some(json!({})),
    )
}

pub(super) fn bad_request(message: &str) -> Response {
    status_response(StatusCode::BAD_REQUEST, "BadRequest", message, None)
}

pub(super) fn invalid(kind: &str, message: &str) -> Response {
    status_response(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        &format!("{kind} is invalid: {message}"),
        Some(
            json!({"group": "meta.k8s.io", "kind": kind, "causes": [{"reason": "FieldValueInvalid", "message": message}]}),
        ),
    )
}

pub(super) fn method_not_allowed() -> Response {
    status_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
        Some(json!({})),
    )
}

pub(super) fn object_not_found(group: &str, plural: &str, name: &str) -> Response {
    let qualified = if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    };
    let mut details = json!({"name": name, "kind": plural});
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    status_response(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{qualified} \"{name}\" not found"),
        Some(details),
    )
}

pub(super) fn rv_error_response(e: RvError, what: &str, requested: u64) -> Response {
    match e {
        RvError::Expired { compacted } => status_response(
            StatusCode::GONE,
            "Expired",
            &format!("The resourceVersion for the provided {what} is too old ({requested} < {compacted})."),
            None,
        ),
        RvError::TooLarge { current } => too_large(requested, current),
    }
}

pub(super) fn too_large(requested: u64, current: u64) -> Response {
    status_response(
        StatusCode::GATEWAY_TIMEOUT,
        "Timeout",
        &format!("Too large resource version: {requested}, current: {current}"),
        Some(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1
        })),
    )
}
