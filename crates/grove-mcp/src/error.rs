//! What can stop the MCP server. Failures of single tool calls are not errors here:
//! they are answered to the client as tool results with `isError: true`.

use grove_postgres::StoreError;
use uuid::Uuid;

/// The server could not start, or its transport failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpServeError {
    /// The workspace the server is bound to does not exist. Handling: exit 3.
    #[error("workspace {0} not found")]
    WorkspaceNotFound(Uuid),
    /// Postgres failed while reading the workspace. Handling: exit 1.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The MCP transport (stdio) failed, or the client broke the handshake.
    /// Handling: exit 1.
    #[error("MCP transport: {0}")]
    Transport(String),
}
