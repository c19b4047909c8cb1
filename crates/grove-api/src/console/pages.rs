//! The console's pages: Fleet, Workspaces, a workspace (with its live timeline) and
//! Events. Each reads through `grove_postgres::console` and renders one template.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use chrono::{DateTime, Utc};
use grove_postgres::console::{self, EventFilter, NodeDisk};
use grove_postgres::console_actions;
use grove_postgres::rows;
use minijinja::context;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::session::{check_origin, CsrfForm, Viewer};
use super::{templates, timeline, ConsoleError};
use crate::AppState;

type St = State<Arc<AppState>>;

/// Rows per page of the Workspaces and Events pages.
const PAGE: i64 = 50;
/// Timeline items a workspace page starts with (the newest).
const TIMELINE: i64 = 200;

/// A serializable value for a template context.
pub(super) fn v(value: &impl Serialize) -> minijinja::Value {
    minijinja::Value::from(minijinja::value::Serde(value))
}

pub(super) fn page(
    viewer: &Viewer,
    name: &str,
    ctx: minijinja::Value,
) -> Result<Html<String>, ConsoleError> {
    let me = context! {
        user => viewer.caller.user_id.clone(),
        operator => viewer.caller.operator,
        csrf => viewer.csrf.clone(),
    };
    Ok(Html(templates::render(name, context! { me, ..ctx })?))
}

/// `/ui`: operators start on Fleet, users on their workspaces.
pub async fn home(viewer: Viewer) -> Redirect {
    Redirect::to(if viewer.caller.operator {
        "/ui/fleet"
    } else {
        "/ui/workspaces"
    })
}

/// Workers, queues and failures (operators).
pub async fn fleet(State(state): St, viewer: Viewer) -> Result<Html<String>, ConsoleError> {
    viewer.require_operator()?;
    let fleet = console::fleet(&state.pool).await?;
    page(
        &viewer,
        "fleet.html",
        context! { nav => "fleet", fleet => v(&fleet) },
    )
}

#[derive(Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    q: Option<String>,
    #[serde(default)]
    page: Option<i64>,
}

/// One node's bar of the disk chart, in percent of the chart's width.
#[derive(Serialize)]
struct DiskBar {
    node: String,
    used_bytes: i64,
    used_pct: f64,
    high_pct: Option<f64>,
    low_pct: Option<f64>,
    budget_bytes: Option<u64>,
    over_high: bool,
    y: usize,
}

fn disk_bars(nodes: Vec<NodeDisk>) -> Vec<DiskBar> {
    nodes
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            let budget = n.marks.map(|m| m.budget_bytes as f64);
            let scale = budget.unwrap_or(0.0).max(n.used_bytes as f64).max(1.0);
            let pct = |b: f64| (b / scale * 100.0).clamp(0.0, 100.0);
            DiskBar {
                used_pct: pct(n.used_bytes as f64),
                high_pct: n.marks.map(|m| pct(m.high_water_bytes as f64)),
                low_pct: n.marks.map(|m| pct(m.low_water_bytes as f64)),
                budget_bytes: n.marks.map(|m| m.budget_bytes),
                over_high: n
                    .marks
                    .is_some_and(|m| n.used_bytes as u64 > m.high_water_bytes),
                used_bytes: n.used_bytes,
                node: n.node,
                y: i * 28,
            }
        })
        .collect()
}

/// The searchable, paged list of workspaces (a user's own; an operator's: all, with
/// the disk chart).
pub async fn workspaces(
    State(state): St,
    viewer: Viewer,
    Query(q): Query<ListQuery>,
) -> Result<Html<String>, ConsoleError> {
    let search = q.q.filter(|s| !s.trim().is_empty());
    let page_no = q.page.unwrap_or(1).max(1);
    let user = (!viewer.caller.operator).then_some(viewer.caller.user_id.as_str());
    let list = console::workspace_page(
        &state.pool,
        user,
        search.as_deref(),
        (page_no - 1) * PAGE,
        PAGE,
    )
    .await?;
    let disk = if viewer.caller.operator {
        disk_bars(console::disk_per_node(&state.pool).await?)
    } else {
        Vec::new()
    };
    let pages = (list.total + PAGE - 1) / PAGE;
    page(
        &viewer,
        "workspaces.html",
        context! {
            nav => "workspaces", list => v(&list), chart_height => disk.len() * 28 + 4,
            disk => v(&disk), search, page => page_no, pages,
        },
    )
}

pub(super) fn parse_workspace_id(raw: &str) -> Result<Uuid, ConsoleError> {
    Uuid::parse_str(raw).map_err(|_| ConsoleError::NotFound)
}

pub(super) async fn visible(
    state: &AppState,
    viewer: &Viewer,
    id: Uuid,
) -> Result<grove_core::model::WorkspaceRow, ConsoleError> {
    let mut conn = state.pool.acquire().await?;
    match rows::workspace(&mut conn, id).await? {
        Some(ws) if viewer.caller.can_see(&ws.user_id) => Ok(ws),
        _ => Err(ConsoleError::NotFound),
    }
}

async fn story(
    state: &AppState,
    id: Uuid,
    after: i64,
) -> Result<(Vec<timeline::Item>, i64, Option<i64>), ConsoleError> {
    let events = console::workspace_timeline(&state.pool, id, after, TIMELINE).await?;
    let kept = console::kept_execs(&state.pool, &timeline::exec_ids(&events)).await?;
    let history = {
        let mut conn = state.pool.acquire().await?;
        grove_postgres::history::history_events(&mut conn, id).await?
    };
    let requesters =
        console_actions::requesters(&state.pool, &timeline::action_ids(&events)).await?;
    let cx = timeline::Context {
        kept: &kept,
        points: &timeline::Points::of(&history),
        requesters: &requesters,
    };
    let last_version = events.last().map_or(after, |e| e.stream_version);
    let last_position = events.iter().map(|e| e.position).max();
    Ok((timeline::items(&events, &cx), last_version, last_position))
}

/// A workspace: its record, capabilities, runtimes and timeline, followed live.
pub async fn workspace(
    State(state): St,
    viewer: Viewer,
    Path(raw): Path<String>,
) -> Result<Html<String>, ConsoleError> {
    let id = parse_workspace_id(&raw)?;
    let ws = visible(&state, &viewer, id).await?;
    let runtimes = console::runtimes(&state.pool, id).await?;
    let (items, last_version, last_position) = story(&state, id, 0).await?;
    page(
        &viewer,
        "workspace.html",
        context! {
            nav => "workspaces", ws => v(&ws), runtimes => v(&runtimes),
            items => v(&items), last_version, workspace => id.to_string(),
            last_position => last_position.unwrap_or(0),
        },
    )
}

#[derive(Deserialize)]
pub struct AfterQuery {
    #[serde(default)]
    after: Option<i64>,
}

/// The timeline items after a stream version (what live follow appends).
pub async fn timeline_fragment(
    State(state): St,
    viewer: Viewer,
    Path(raw): Path<String>,
    Query(q): Query<AfterQuery>,
) -> Result<Html<String>, ConsoleError> {
    let id = parse_workspace_id(&raw)?;
    visible(&state, &viewer, id).await?;
    let (items, last_version, _) = story(&state, id, q.after.unwrap_or(0).max(0)).await?;
    page(
        &viewer,
        "timeline.html",
        context! { items => v(&items), last_version, fragment => true, workspace => id.to_string() },
    )
}

/// The workspace's events as server-sent events (positions after `after`): the page's
/// script fetches the new timeline items when one arrives.
pub async fn follow(
    State(state): St,
    viewer: Viewer,
    Path(raw): Path<String>,
    Query(q): Query<AfterQuery>,
) -> Result<Response, ConsoleError> {
    let id = parse_workspace_id(&raw)?;
    visible(&state, &viewer, id).await?;
    Ok(crate::stream::follow_events(state, id, q.after).into_response())
}

#[derive(Deserialize, Serialize, Default)]
pub struct EventsQuery {
    #[serde(default)]
    stream: Option<String>,
    #[serde(default, rename = "type")]
    event_type: Option<String>,
    #[serde(default)]
    user: Option<String>,
    /// `YYYY-MM-DDTHH:MM` (UTC, as a datetime-local input sends it) or RFC 3339.
    #[serde(default)]
    until: Option<String>,
    #[serde(default)]
    before: Option<i64>,
}

fn parse_until(raw: &str) -> Result<DateTime<Utc>, ConsoleError> {
    DateTime::parse_from_rfc3339(raw)
        .map(|t| t.with_timezone(&Utc))
        .or_else(|_| {
            chrono::NaiveDateTime::parse_from_str(raw, "%Y-%m-%dT%H:%M").map(|t| t.and_utc())
        })
        .map_err(|_| ConsoleError::BadRequest("until: expected YYYY-MM-DDTHH:MM (UTC)".into()))
}

fn nonempty(s: &Option<String>) -> Option<String> {
    s.as_ref()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// One row of the Events page.
#[derive(Serialize)]
struct EventRow {
    position: i64,
    stream_id: String,
    stream_version: i64,
    event_type: String,
    recorded_at: String,
    user: Option<String>,
    payload: String,
}

/// The global log, filtered, newest first; `replay --verify`'s last run (operators).
pub async fn events(
    State(state): St,
    viewer: Viewer,
    Query(q): Query<EventsQuery>,
) -> Result<Html<String>, ConsoleError> {
    viewer.require_operator()?;
    let filter = EventFilter {
        stream: nonempty(&q.stream),
        event_type: nonempty(&q.event_type),
        user: nonempty(&q.user),
        until: nonempty(&q.until).as_deref().map(parse_until).transpose()?,
        before: q.before,
    };
    let events = console::events_page(&state.pool, &filter, PAGE).await?;
    let next_before = (events.len() as i64 == PAGE)
        .then(|| events.last().map(|e| e.position))
        .flatten();
    let rows: Vec<EventRow> = events
        .iter()
        .map(|e| {
            let mut payload = serde_json::to_string(&e.event.to_stored().1).unwrap_or_default();
            if payload.len() > 400 {
                let cut = (0..=400)
                    .rev()
                    .find(|i| payload.is_char_boundary(*i))
                    .unwrap_or(0);
                payload.truncate(cut);
                payload.push('…');
            }
            EventRow {
                position: e.position,
                stream_id: e.stream_id.clone(),
                stream_version: e.stream_version,
                event_type: e.event_type.clone(),
                recorded_at: e.recorded_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                user: e.metadata.correlation.user_id.clone(),
                payload,
            }
        })
        .collect();
    let verification = console::last_verification(&state.pool).await?;
    page(
        &viewer,
        "events.html",
        context! {
            nav => "events", rows => v(&rows), q => v(&q), next_before,
            verification => v(&verification),
        },
    )
}

/// Runs `replay --verify` in the background (operators; CSRF-checked).
pub async fn verify(
    State(state): St,
    viewer: Viewer,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Result<Redirect, ConsoleError> {
    check_origin(&headers)?;
    viewer.check_csrf(&form.csrf)?;
    viewer.require_operator()?;
    // One run at a time: a run started in the last ten minutes and not finished is
    // still going (a server that stopped mid-run leaves it unfinished; ten minutes on,
    // the next click runs again).
    if let Some(last) = console::last_verification(&state.pool).await? {
        let running = last.finished_at.is_none()
            && Utc::now() - last.started_at < chrono::Duration::minutes(10);
        if running {
            return Ok(Redirect::to("/ui/events"));
        }
    }
    let pool = state.pool.clone();
    let who = viewer.caller.user_id.clone();
    tokio::spawn(async move {
        if let Err(e) = console::run_verification(&pool, &who).await {
            tracing::error!(error = %e, "console replay --verify failed");
        }
    });
    Ok(Redirect::to("/ui/events"))
}
