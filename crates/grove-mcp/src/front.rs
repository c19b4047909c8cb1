//! What grove answers itself before a message reaches the MCP server, on every
//! transport where it sees raw lines (stdio, and the thin client of `grove mcp`): a line
//! that is not JSON gets -32700 (a parse error, id null) instead of being dropped, and a
//! `tools/call` without a tool name -32602 (invalid params) instead of rmcp's -32601.

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// The JSON-RPC error answering `line` here, or `None` when the server should see it.
pub fn early_answer(line: &str) -> Option<Value> {
    let message: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return Some(rpc_error(Value::Null, -32700, &format!("parse error: {e}"))),
    };
    let unnamed_call = message.get("method").and_then(Value::as_str) == Some("tools/call")
        && message
            .pointer("/params/name")
            .and_then(Value::as_str)
            .is_none();
    let id = message.get("id").cloned();
    match (unnamed_call, id) {
        (true, Some(id)) => Some(rpc_error(
            id,
            -32602,
            "tools/call needs params.name, the tool to call",
        )),
        _ => None,
    }
}

/// A JSON-RPC error response.
pub fn rpc_error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// Relays `input`'s lines to the server's side (`to_server`) and the server's lines
/// (`from_server`) to `output`, answering [`early_answer`]'s cases itself. Ends when
/// both directions have ended.
pub async fn relay(
    input: impl AsyncRead + Unpin + Send + 'static,
    output: impl AsyncWrite + Unpin + Send + 'static,
    mut to_server: impl AsyncWrite + Unpin + Send + 'static,
    from_server: impl AsyncRead + Unpin + Send + 'static,
) -> std::io::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let answers = tx.clone();
    let inbound = tokio::spawn(async move {
        let mut lines = BufReader::new(input).lines();
        while let Some(line) = lines.next_line().await? {
            if line.trim().is_empty() {
                continue;
            }
            match early_answer(&line) {
                Some(answer) => {
                    let _ = answers.send(answer.to_string());
                }
                None => to_server.write_all(format!("{line}\n").as_bytes()).await?,
            }
        }
        to_server.shutdown().await
    });
    let outbound = tokio::spawn(async move {
        let mut lines = BufReader::new(from_server).lines();
        while let Some(line) = lines.next_line().await? {
            let _ = tx.send(line);
        }
        Ok::<_, std::io::Error>(())
    });
    let mut output = output;
    while let Some(line) = rx.recv().await {
        output.write_all(format!("{line}\n").as_bytes()).await?;
        output.flush().await?;
    }
    inbound.await.map_err(std::io::Error::other)??;
    outbound.await.map_err(std::io::Error::other)??;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_and_unnamed_calls_are_answered_here_and_the_rest_passes() {
        let e = early_answer("not json").unwrap();
        assert_eq!(
            (e["id"].clone(), e["error"]["code"].clone()),
            (Value::Null, json!(-32700))
        );
        let unnamed = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"arguments":{}}}"#;
        let e = early_answer(unnamed).unwrap();
        assert_eq!(
            (e["id"].clone(), e["error"]["code"].clone()),
            (json!(7), json!(-32602))
        );
        for fine in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"view"}}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        ] {
            assert_eq!(early_answer(fine), None, "{fine}");
        }
    }

    #[tokio::test]
    async fn the_relay_answers_early_cases_and_passes_both_directions() {
        let (client_in, mut feed) = tokio::io::duplex(4096);
        let (mut read_out, client_out) = tokio::io::duplex(4096);
        let (server_side, relay_side) = tokio::io::duplex(4096);
        let (relay_read, relay_write) = tokio::io::split(relay_side);
        let (server_read, mut server_write) = tokio::io::split(server_side);
        let relay = tokio::spawn(relay(client_in, client_out, relay_write, relay_read));
        feed.write_all(b"garbage\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n")
            .await
            .unwrap();
        drop(feed);
        let mut seen = String::new();
        let mut server_lines = BufReader::new(server_read).lines();
        seen.push_str(&server_lines.next_line().await.unwrap().unwrap());
        assert!(seen.contains("ping"), "{seen}");
        server_write
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n")
            .await
            .unwrap();
        drop(server_write);
        drop(server_lines);
        relay.await.unwrap().unwrap();
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut read_out, &mut out)
            .await
            .unwrap();
        assert!(
            out.contains("-32700") && out.contains("\"result\""),
            "{out}"
        );
    }
}
