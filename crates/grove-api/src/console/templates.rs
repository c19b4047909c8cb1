//! The console's templates (minijinja, HTML auto-escaping), compiled once, shipped
//! inside the binary (`include_str!`), and the filters they share.

use std::sync::OnceLock;

use minijinja::Environment;

const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("templates/base.html")),
    ("login.html", include_str!("templates/login.html")),
    ("error.html", include_str!("templates/error.html")),
    ("fleet.html", include_str!("templates/fleet.html")),
    ("workspaces.html", include_str!("templates/workspaces.html")),
    ("workspace.html", include_str!("templates/workspace.html")),
    ("timeline.html", include_str!("templates/timeline.html")),
    ("events.html", include_str!("templates/events.html")),
    (
        "point_actions.html",
        include_str!("templates/point_actions.html"),
    ),
    ("point_diff.html", include_str!("templates/point_diff.html")),
    ("confirm.html", include_str!("templates/confirm.html")),
    ("done.html", include_str!("templates/done.html")),
];

fn env() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        // Every template ends in .html: auto-escaping is on for all of them.
        for (name, source) in TEMPLATES {
            env.add_template(name, source)
                .expect("the console's templates parse");
        }
        env.add_filter("bytes", human_bytes);
        env.add_filter("when", when);
        env
    })
}

/// Renders template `name` with `ctx`.
pub fn render(name: &str, ctx: minijinja::Value) -> Result<String, minijinja::Error> {
    env().get_template(name)?.render(ctx)
}

/// 1536 -> "1.5 KiB".
fn human_bytes(n: i64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v.abs() >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

/// An RFC 3339 timestamp as `YYYY-MM-DD HH:MM:SS` (UTC); other text unchanged.
fn when(s: Option<String>) -> String {
    match s.as_deref().map(chrono::DateTime::parse_from_rfc3339) {
        Some(Ok(t)) => t
            .with_timezone(&chrono::Utc)
            .format("%Y-%m-%d %H:%M:%S")
            .to_string(),
        _ => s.unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_parses_and_data_is_escaped() {
        let html = render(
            "error.html",
            minijinja::context! { status => 404, message => "<script>alert(1)</script>" },
        )
        .unwrap();
        assert!(!html.contains("<script>alert(1)"), "{html}");
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;"),
            "{html}"
        );
        for (name, _) in TEMPLATES {
            env().get_template(name).unwrap();
        }
    }

    #[test]
    fn sizes_and_times_read_as_people_write_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(
            when(Some("2027-01-02T03:04:05.123Z".into())),
            "2027-01-02 03:04:05"
        );
        assert_eq!(when(None), "");
    }
}
