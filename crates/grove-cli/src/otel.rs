//! OpenTelemetry export of grove's trace spans over OTLP/HTTP (ADR 30), on only when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set. The
//! exporter reads the standard `OTEL_*` variables itself (protocol `http/protobuf` by
//! default or `http/json`, headers, timeout); spans are batched and flushed at exit.
//! Installs `grove_postgres::trace_context`'s hooks, which carry a command's context
//! across the queue.

use std::collections::HashMap;
use std::time::SystemTime;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Span as _, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::Layer;

/// The exporter, kept to flush it at exit.
pub struct Otel {
    provider: SdkTracerProvider,
}

/// Whether the environment asks for traces.
pub fn wanted() -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()))
}

/// The layer exporting grove's trace spans, when [`wanted`]. Must run before any
/// async runtime exists (the blocking HTTP client makes one of its own).
pub fn layer<S>() -> Result<Option<(impl Layer<S>, Otel)>, opentelemetry_otlp::ExporterBuildError>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    if !wanted() {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name("grove").build())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    let tracer = provider.tracer("grove");
    grove_postgres::trace_context::install(grove_postgres::trace_context::Hooks {
        current,
        adopt,
        record,
    });
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(
            Targets::new()
                .with_target(grove_postgres::trace_context::TARGET, tracing::Level::TRACE),
        );
    Ok(Some((layer, Otel { provider })))
}

impl Otel {
    /// Exports what is still batched; call outside the async runtime.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("grove: flushing traces failed: {e}");
        }
    }
}

fn current() -> Option<String> {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove("traceparent")
}

fn remote(traceparent: &str) -> Context {
    let carrier = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    TraceContextPropagator::new().extract(&carrier)
}

fn adopt(span: &tracing::Span, traceparent: &str) {
    let _ = span.set_parent(remote(traceparent));
}

fn record(
    traceparent: &str,
    name: &'static str,
    start: SystemTime,
    end: SystemTime,
    attributes: &[(&'static str, String)],
) {
    let tracer = opentelemetry::global::tracer("grove");
    let mut span = tracer
        .span_builder(name)
        .with_start_time(start)
        .with_attributes(
            attributes
                .iter()
                .map(|(k, v)| KeyValue::new(*k, v.clone()))
                .collect::<Vec<_>>(),
        )
        .start_with_context(&tracer, &remote(traceparent));
    span.end_with_timestamp(end);
}
