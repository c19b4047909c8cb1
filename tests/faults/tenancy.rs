//! Scenario `tenancy`: a second user's token tries every route of the served OpenAPI
//! document (so a new route is covered the day it is added) against the first user's
//! ids, and must get 404 each time; without a token every route but the document and
//! the health check answers 401. Nothing may run or change for the intruder.

use reqwest::{Method, StatusCode};
use serde_json::{json, Map, Value};

use crate::server::{Server, ALICE, BOB};
use crate::{env_or_skip, replay_ok, scale, Figures};

/// Routes that are open by design.
const PUBLIC: &[&str] = &["/openapi.json", "/healthz"];

/// A value that fits `schema` (resolved against the document), for request bodies.
fn sample(doc: &Value, schema: &Value, depth: usize) -> Value {
    if depth > 8 {
        return Value::Null;
    }
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.rsplit('/').next().unwrap_or_default();
        return sample(doc, &doc["components"]["schemas"][name], depth + 1);
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(first) = schema
            .get(key)
            .and_then(Value::as_array)
            .and_then(|a| a.first())
        {
            return sample(doc, first, depth + 1);
        }
    }
    if let Some(e) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
    {
        return e.clone();
    }
    let ty = match schema.get("type") {
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null")
            .to_string(),
        Some(Value::String(t)) => t.clone(),
        _ => "object".to_string(),
    };
    match ty.as_str() {
        "string" => match schema.get("format").and_then(Value::as_str) {
            Some("uuid") => json!(uuid::Uuid::new_v4()),
            Some("date-time") => json!("2030-01-01T00:00:00Z"),
            _ => json!("x"),
        },
        "integer" | "number" => json!(1),
        "boolean" => json!(false),
        "array" => json!([sample(doc, &schema["items"], depth + 1)]),
        "object" => {
            let mut out = Map::new();
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (name, prop) in props {
                    if required.contains(&name.as_str()) {
                        out.insert(name.clone(), sample(doc, prop, depth + 1));
                    }
                }
            }
            Value::Object(out)
        }
        _ => Value::Null,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_user_gets_404_on_every_documented_route_for_the_first_users_ids() {
    let env =
        env_or_skip!("a_second_user_gets_404_on_every_documented_route_for_the_first_users_ids");
    let url = env.fixture_repo("fixture", &[("README.md", "alice's\n")]);
    let server = Server::start(&env, &[], &[]).await;
    let mut figures = Figures::default();

    // Alice's things: sessions (= workspaces) and an exec in each, as many as the
    // scale asks.
    let mut alice_ids = Vec::new();
    let mut first_ws = None;
    for n in 0..scale() {
        let (status, body) = server
            .call(
                Method::POST,
                "/v1/sessions",
                Some(ALICE),
                Some(
                    &json!({"project_id": "p1", "repo_name": "o/fixture", "repo_url": url,
                         "base_ref": "main", "mode": "edit", "conversation_id": format!("c{n}")}),
                ),
            )
            .await
            .expect("acquire");
        assert_eq!(status, StatusCode::OK, "{body}");
        let session: Value = serde_json::from_str(&body).unwrap();
        let ws = session["session_id"].as_str().unwrap().to_string();
        let (status, body) = server
            .call(
                Method::POST,
                &format!("/v1/workspaces/{ws}/exec"),
                Some(ALICE),
                Some(&json!({"argv": ["true"]})),
            )
            .await
            .expect("exec");
        assert_eq!(status, StatusCode::OK, "{body}");
        let exec_id = serde_json::from_str::<Value>(&body).unwrap()["exec_id"]
            .as_str()
            .unwrap()
            .to_string();
        alice_ids.push(ws.clone());
        alice_ids.push(exec_id);
        first_ws.get_or_insert(ws);
    }
    let ws = first_ws.expect("a session");
    let commands_before: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT command_id FROM grove.commands")
            .fetch_all(&env.pool)
            .await
            .unwrap();

    let (status, doc) = server
        .call(Method::GET, "/openapi.json", None, None)
        .await
        .expect("openapi");
    assert_eq!(status, StatusCode::OK);
    let doc: Value = serde_json::from_str(&doc).unwrap();
    let paths = doc["paths"].as_object().expect("paths");
    assert!(
        paths.len() >= 10,
        "the document lists the routes: {paths:?}"
    );
    let mut routes = 0;
    for (template, ops) in paths {
        for (method, op) in ops.as_object().unwrap() {
            let Ok(method) = method.to_uppercase().parse::<Method>() else {
                continue;
            };
            routes += 1;
            let body = op
                .pointer("/requestBody/content/application~1json/schema")
                .map(|s| sample(&doc, s, 0));
            let query_flags: Vec<String> = op
                .get("parameters")
                .and_then(Value::as_array)
                .map(|ps| {
                    ps.iter()
                        .filter(|p| p["in"] == "query")
                        .map(|p| {
                            let name = p["name"].as_str().unwrap_or_default();
                            let value = match p["schema"]["type"].as_str() {
                                Some("boolean") => "true",
                                Some("integer") => "1",
                                _ => "alice",
                            };
                            format!("{name}={value}")
                        })
                        .collect()
                })
                .unwrap_or_default();
            let mut variants = vec![String::new()];
            if !query_flags.is_empty() {
                variants.push(format!("?{}", query_flags.join("&")));
            }
            let with_id = template.contains('{');
            let targets: Vec<String> = if with_id {
                alice_ids
                    .iter()
                    .map(|id| {
                        let mut p = template.clone();
                        while let (Some(a), Some(b)) = (p.find('{'), p.find('}')) {
                            p.replace_range(a..=b, id);
                        }
                        p
                    })
                    .collect()
            } else {
                vec![template.clone()]
            };
            for target in &targets {
                for q in &variants {
                    let path = format!("{target}{q}");
                    // Without a token: 401, except on the public routes.
                    figures.trials += 1;
                    let (status, answer) = server
                        .call(method.clone(), &path, None, body.as_ref())
                        .await
                        .expect("an answer");
                    let public = PUBLIC.contains(&template.as_str());
                    if !public && status != StatusCode::UNAUTHORIZED {
                        figures.leaked += 1;
                        figures.note(format!("no token: {method} {path} -> {status} {answer}"));
                    }
                    if public {
                        continue;
                    }
                    figures.trials += 1;
                    let (status, answer) = server
                        .call(method.clone(), &path, Some(BOB), body.as_ref())
                        .await
                        .expect("an answer");
                    if with_id {
                        figures.injected += 1;
                        let kind = serde_json::from_str::<Value>(&answer)
                            .ok()
                            .and_then(|v| v["error"]["kind"].as_str().map(str::to_string));
                        if status != StatusCode::NOT_FOUND || kind.as_deref() != Some("not_found") {
                            figures.leaked += 1;
                            figures.note(format!("bob: {method} {path} -> {status} {answer}"));
                        }
                    } else if alice_ids.iter().any(|id| answer.contains(id.as_str())) {
                        // A route without an id (a list, a create) shows bob none of
                        // alice's things, whatever its status.
                        figures.leaked += 1;
                        figures.note(format!("bob: {method} {path} shows alice's ids: {answer}"));
                    }
                }
            }
        }
    }
    eprintln!("tenancy: {routes} documented operations tried");

    // Nothing ran or changed for bob: no command of his touched alice's workspace,
    // and alice still sees it as it was.
    let touched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM grove.commands
          WHERE NOT (command_id = ANY($1)) AND payload->>'workspace_id' = $2",
    )
    .bind(&commands_before)
    .bind(&ws)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    if touched > 0 {
        figures.lost += touched as u64;
        figures.note(format!(
            "{touched} commands on alice's workspace were enqueued for bob"
        ));
    }
    let (status, _) = server
        .call(
            Method::GET,
            &format!("/v1/workspaces/{ws}"),
            Some(ALICE),
            None,
        )
        .await
        .unwrap();
    if status != StatusCode::OK {
        figures.lost += 1;
        figures.note(format!(
            "alice's workspace answers {status} after bob's tries"
        ));
    }
    replay_ok(&env, &mut figures).await;
    figures.finish("tenancy");
}
