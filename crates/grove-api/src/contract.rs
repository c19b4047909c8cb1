//! The document as a contract: every response described, the statuses every route
//! shares declared once (a malformed `{id}`, an oversized or non-JSON body), and each
//! server-sent event stream described frame by frame ([`describe_event_streams`]).
//!
//! Applied last of the document's modifiers, so it sees every operation, including
//! those merged in from other modules.

use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::schema::Ref;
use utoipa::openapi::{Content, OpenApi, RefOr, Response};
use utoipa::{Modify, ToSchema};

/// The kinds an error body names (`error.kind`).
#[derive(Debug, Clone, Copy, serde::Serialize, ToSchema)]
#[schema(as = ErrorKind)]
#[allow(dead_code)] // a schema only: bodies carry the kind as text
#[serde(rename_all = "snake_case")]
pub enum ErrorKindName {
    Unauthorized,
    InvalidInput,
    NotFound,
    Conflict,
    Rejected,
    AuthFailed,
    ResourceLimit,
    Unavailable,
    WorkerLost,
    Internal,
}

/// Every kind an error body can name, as it is written on the wire.
pub const ERROR_KINDS: &[&str] = &[
    "unauthorized",
    "invalid_input",
    "not_found",
    "conflict",
    "rejected",
    "auth_failed",
    "resource_limit",
    "unavailable",
    "worker_lost",
    "internal",
];

/// The description a response gets when its route gives none.
fn default_description(status: &str) -> &'static str {
    match status {
        "200" => "Success",
        "400" => "Invalid input (`invalid_input`): a malformed id, query or body",
        "401" => "Missing or unknown bearer token (`unauthorized`)",
        "403" => "The git remote refused the credentials (`auth_failed`)",
        "404" => "Not found, or not visible to the caller (`not_found`)",
        "409" => "Conflict with the current state (`conflict`)",
        "413" => "The body is over the size limit (`invalid_input`)",
        "415" => "The body is not `application/json` (`invalid_input`)",
        "422" => "Well-formed, but refused (`invalid_input` or `rejected`)",
        "429" => "A resource limit was hit (`resource_limit`)",
        "500" => "Internal error (`internal`, `worker_lost`)",
        "503" => "No worker took the job, or the runtime is unavailable (`unavailable`)",
        _ => "See the error body",
    }
}

fn error_response(status: &str) -> RefOr<Response> {
    let mut response = Response::new(default_description(status));
    response.content.insert(
        "application/json".into(),
        RefOr::T(Content::new(Some(Ref::from_schema_name("ErrorResponse")))),
    );
    RefOr::T(response)
}

/// Fills in what the route annotations leave out.
pub struct Contract;

impl Modify for Contract {
    fn modify(&self, openapi: &mut OpenApi) {
        for (path, item) in openapi.paths.paths.iter_mut() {
            let has_id = path.contains("{id}");
            for op in [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ]
            .into_iter()
            .flatten()
            {
                complete(op, has_id);
            }
        }
    }
}

fn complete(op: &mut Operation, has_id: bool) {
    let responses = &mut op.responses.responses;
    let mut shared = vec![];
    let has_query = op.parameters.iter().flatten().any(|p| match p {
        RefOr::T(p) => matches!(p.parameter_in, ParameterIn::Query),
        RefOr::Ref(_) => false,
    });
    if has_id || has_query {
        shared.push("400");
    }
    if op.request_body.is_some() {
        shared.extend(["400", "413", "415", "422"]);
    }
    for status in shared {
        responses
            .entry(status.to_string())
            .or_insert_with(|| error_response(status));
    }
    for (status, response) in responses.iter_mut() {
        if let RefOr::T(r) = response {
            if r.description.is_empty() {
                r.description = default_description(status).to_string();
            }
        }
    }
}

/// Describes each `text/event-stream` response as its frames: an object with the SSE
/// `id`, `event` and `data` fields, `data` a JSON text (`contentMediaType`) whose
/// `contentSchema` is the schema the route names, as OpenAPI tools read event streams.
/// Done on the JSON document because utoipa's schema model has no `contentSchema`.
pub fn describe_event_streams(doc: &mut serde_json::Value) {
    let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) else {
        return;
    };
    let responses = paths
        .values_mut()
        .filter_map(|item| item.as_object_mut())
        .flat_map(|item| item.values_mut())
        .filter_map(|op| op.get_mut("responses").and_then(|r| r.as_object_mut()))
        .flat_map(|r| r.values_mut());
    for response in responses {
        let Some(stream) = response.pointer_mut("/content/text~1event-stream") else {
            continue;
        };
        let Some(data) = stream.get("schema").cloned() else {
            continue;
        };
        stream["schema"] = serde_json::json!({
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "event": {"type": "string"},
                "retry": {"type": "integer"},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": data
                }
            },
            "required": ["data"]
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use grove_core::error::ErrorKind;
    use utoipa::PartialSchema;

    #[test]
    fn the_documented_kinds_are_the_kinds_bodies_name() {
        let schema = serde_json::to_value(ErrorKindName::schema()).unwrap();
        let documented: Vec<&str> = schema["enum"]
            .as_array()
            .expect("an enum")
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(documented, ERROR_KINDS);
        for kind in [
            ErrorKind::InvalidInput,
            ErrorKind::NotFound,
            ErrorKind::Conflict,
            ErrorKind::WorkerLost,
            ErrorKind::AuthFailed,
            ErrorKind::ResourceLimit,
            ErrorKind::Unavailable,
            ErrorKind::Rejected,
            ErrorKind::Internal,
        ] {
            assert!(ERROR_KINDS.contains(&kind.as_str()), "{kind:?}");
        }
    }
}
