//! One `grove migrate`: apalis' migrations, then grove's, each with its own history table.

use sqlx::migrate::Migrator;
use sqlx::PgPool;

use crate::StoreError;

/// Applies apalis-postgres' schema (history in `apalis._sqlx_migrations`, as its
/// `sqlx.toml` configures) and then grove's (history in `grove._sqlx_migrations`), so neither migrator
/// sees the other's versions. Safe to run concurrently and repeatedly: each migrator
/// takes Postgres' migration lock and skips what is applied.
pub async fn migrate(pool: &PgPool) -> Result<(), StoreError> {
    apalis_postgres::PostgresStorage::migrations()
        .run(pool)
        .await?;
    grove_migrator().run(pool).await?;
    Ok(())
}

fn grove_migrator() -> Migrator {
    let mut migrator = sqlx::migrate!("../../migrations");
    migrator.create_schema("grove");
    migrator.dangerous_set_table_name("grove._sqlx_migrations");
    migrator
}
