//! Lifecycle states are a closed set: the database refuses a state outside it, and the
//! store's reader refuses one it finds (a row written by another release) as corrupt
//! instead of letting it through as a string no code decides on.

use grove_e2e::acquire_args;
use grove_postgres::rows::{self, WORKSPACE_COLUMNS};
use grove_postgres::StoreError;
use sqlx::AssertSqlSafe;

use crate::env_or_skip;

#[tokio::test(flavor = "multi_thread")]
async fn a_state_outside_the_closed_set_is_refused_by_the_database_and_by_the_reader() {
    let mut env =
        env_or_skip!("a_state_outside_the_closed_set_is_refused_by_the_database_and_by_the_reader");
    env.spawn_worker().await;
    let url = env.fixture_repo("fixture", &[("f", "x\n")]);
    let ws = env
        .grove_json(&acquire_args(&url, "edit", &["--conversation", "c1"]))
        .await;
    let id: uuid::Uuid = ws["id"].as_str().unwrap().parse().unwrap();
    // An exec starts a runtime, so every table has a row to update.
    let out = env.grove(&["exec", &id.to_string(), "--", "true"]).await;
    assert!(out.status.success(), "{:?}", grove_e2e::text(&out));

    for (table, state) in [
        ("sandbox_workspaces", "creating"),
        ("sandbox_workspaces", "Ready"),
        ("sandbox_repo_caches", "fetching"),
        ("sandbox_runtimes", "starting"),
    ] {
        let err = sqlx::query(AssertSqlSafe(format!(
            "UPDATE grove.{table} SET state = $1"
        )))
        .bind(state)
        .execute(&env.pool)
        .await
        .expect_err(&format!("{table}.state = {state:?} must be refused"));
        let code = err.as_database_error().and_then(|e| e.code());
        assert_eq!(code.as_deref(), Some("23514"), "{table}: {err}");
    }
    let mut conn = env.pool.acquire().await.unwrap();
    let row = rows::workspace(&mut conn, id).await.unwrap().unwrap();
    assert_eq!(
        row.state,
        grove_core::state::WorkspaceState::Ready,
        "unchanged"
    );

    // A row as another release might have written it, read through the same reader.
    let columns = WORKSPACE_COLUMNS.replace(", state,", ", 'hibernating'::text AS state,");
    assert_ne!(columns, WORKSPACE_COLUMNS);
    let raw = sqlx::query(AssertSqlSafe(format!(
        "SELECT {columns} FROM grove.sandbox_workspaces WHERE id = $1"
    )))
    .bind(id)
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    match rows::workspace_from_row(&raw) {
        Err(StoreError::Corrupt(msg)) => {
            assert_eq!(msg, "unknown workspace state \"hibernating\"")
        }
        other => panic!("an unknown state must be corrupt, got {other:?}"),
    }
}
