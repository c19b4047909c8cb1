//! Percentiles and the rows the harness prints (JSON lines or a table).

use serde_json::{json, Map, Value};

/// Nearest-rank percentile of samples in milliseconds.
pub fn pct(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

pub fn round(x: f64) -> Value {
    if x.is_finite() {
        json!((x * 1000.0).round() / 1000.0)
    } else {
        Value::Null
    }
}

/// A latency row: grove next to its floor.
pub fn latency(name: &str, grove: &[f64], floor: &[f64]) -> Map<String, Value> {
    let (g50, g99, f50, f99) = (
        pct(grove, 50.0),
        pct(grove, 99.0),
        pct(floor, 50.0),
        pct(floor, 99.0),
    );
    let mut m = Map::new();
    m.insert("name".into(), json!(name));
    m.insert("n".into(), json!(grove.len()));
    m.insert("grove_p50_ms".into(), round(g50));
    m.insert("grove_p99_ms".into(), round(g99));
    m.insert("floor_p50_ms".into(), round(f50));
    m.insert("floor_p99_ms".into(), round(f99));
    m.insert("ratio".into(), round(g50 / f50));
    m
}

pub fn skipped(name: &str, reason: impl Into<String>) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("name".into(), json!(name));
    m.insert("skipped".into(), json!(reason.into()));
    m
}

const COLS: [&str; 7] = [
    "n",
    "grove_p50_ms",
    "grove_p99_ms",
    "floor_p50_ms",
    "floor_p99_ms",
    "ratio",
    "name",
];

fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

/// A Markdown table of every row; keys beyond the standard ones go in `extra`.
pub fn table(rows: &[Map<String, Value>]) -> String {
    let mut out = String::from(
        "| case | n | grove p50 ms | grove p99 ms | floor p50 ms | floor p99 ms | ratio | extra |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let name = cell(r.get("name"));
        if let Some(reason) = r.get("skipped") {
            out.push_str(&format!(
                "| {name} | - | - | - | - | - | - | skipped: {} |\n",
                cell(Some(reason))
            ));
            continue;
        }
        let extra: Vec<String> = r
            .iter()
            .filter(|(k, _)| !COLS.contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={}", cell(Some(v))))
            .collect();
        out.push_str(&format!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} |\n",
            cell(r.get("n")),
            cell(r.get("grove_p50_ms")),
            cell(r.get("grove_p99_ms")),
            cell(r.get("floor_p50_ms")),
            cell(r.get("floor_p99_ms")),
            cell(r.get("ratio")),
            extra.join(" ")
        ));
    }
    out
}
