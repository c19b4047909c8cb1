//! The spans of a claimed job (ADR 30): `grove.job` continues the trace its command was
//! enqueued under, and `grove.claim` records the claim that handed it over; the effect,
//! lock and commit spans nest inside `grove.job`. Without exported traces this reads
//! nothing and returns a disabled span.

use grove_postgres::queue::{self, ClaimedJob};
use grove_postgres::trace_context::{self, TARGET};
use sqlx::PgPool;
use tracing::Span;

/// The span a claimed job runs in.
pub(crate) async fn job_span(pool: &PgPool, job: &ClaimedJob) -> Span {
    if !trace_context::enabled() {
        return Span::none();
    }
    let span = tracing::trace_span!(target: TARGET, "grove.job", command_id = %job.command_id, kind = job.kind, queue = %job.queue);
    match queue::trace_parent(pool, job.command_id).await {
        Ok(Some(parent)) => {
            trace_context::adopt(&span, &parent);
            let (start, end) = job.claim_window;
            let attributes = [
                ("command_id", job.command_id.to_string()),
                ("queue", job.queue.clone()),
            ];
            trace_context::record(&parent, "grove.claim", start, end, &attributes);
        }
        Ok(None) => {}
        Err(e) => tracing::debug!(error = %e, "reading a command's trace context failed"),
    }
    span
}

/// The span of a job's effect (its handler, locks included).
pub(crate) fn effect_span(job: &ClaimedJob) -> Span {
    tracing::trace_span!(target: TARGET, "grove.effect", command_id = %job.command_id, kind = job.kind)
}
