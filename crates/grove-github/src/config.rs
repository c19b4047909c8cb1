//! Where GitHub is: the REST API base URL and the web origin its repositories live on.
//!
//! `GROVE_GITHUB_API_URL` (default `https://api.github.com`; GitHub Enterprise Server:
//! `https://HOST/api/v3`) and `GROVE_GITHUB_WEB_URL` (default: `https://github.com` for
//! api.github.com, else the API URL's scheme, host and port). A workspace's repository
//! is on the platform only when its URL is `<web origin>/<owner>/<name>[.git]`.

use reqwest::Url;

/// A configuration that cannot be used. The message names the variable, never a secret
/// (URLs with credentials are refused, not echoed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// The default API base (github.com).
pub const DEFAULT_API_URL: &str = "https://api.github.com";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitHubConfig {
    api_base: String,
    web_origin: String,
}

fn parse(var: &str, raw: &str) -> Result<Url, ConfigError> {
    let bad = |why: &str| ConfigError(format!("{var}: {why}"));
    let url = Url::parse(raw).map_err(|_| bad("not a URL"))?;
    if !matches!(url.scheme(), "https" | "http") {
        return Err(bad("expected an http or https URL"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad("credentials in the URL are not allowed"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("a query or fragment is not allowed"));
    }
    Ok(url)
}

fn origin_of(url: &Url) -> String {
    let host = url.host_str().unwrap_or("");
    match url.port() {
        Some(port) => format!("{}://{host}:{port}", url.scheme()),
        None => format!("{}://{host}", url.scheme()),
    }
}

impl GitHubConfig {
    /// A configuration from an API base URL and, optionally, the web origin.
    pub fn new(api_url: &str, web_url: Option<&str>) -> Result<Self, ConfigError> {
        let api = parse("GROVE_GITHUB_API_URL", api_url)?;
        let web_origin = match web_url {
            Some(raw) => {
                let web = parse("GROVE_GITHUB_WEB_URL", raw)?;
                if web.path() != "/" && !web.path().is_empty() {
                    return Err(ConfigError(
                        "GROVE_GITHUB_WEB_URL: expected an origin (scheme, host, port) without a path".into(),
                    ));
                }
                origin_of(&web)
            }
            None if api.host_str() == Some("api.github.com") => "https://github.com".into(),
            None => origin_of(&api),
        };
        Ok(Self {
            api_base: api.as_str().trim_end_matches('/').to_string(),
            web_origin,
        })
    }

    /// github.com.
    pub fn github_com() -> Self {
        Self::new(DEFAULT_API_URL, None).expect("the default URL parses")
    }

    /// From `GROVE_GITHUB_API_URL` and `GROVE_GITHUB_WEB_URL` (unset or empty: defaults).
    pub fn from_env() -> Result<Self, ConfigError> {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        let api = var("GROVE_GITHUB_API_URL");
        let web = var("GROVE_GITHUB_WEB_URL");
        Self::new(api.as_deref().unwrap_or(DEFAULT_API_URL), web.as_deref())
    }

    /// The API base, without a trailing slash (`https://api.github.com`).
    pub fn api_base(&self) -> &str {
        &self.api_base
    }

    /// The web origin repositories must live on (`https://github.com`).
    pub fn web_origin(&self) -> &str {
        &self.web_origin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_web_origin_follows_the_api_url_unless_given() {
        let gh = GitHubConfig::github_com();
        assert_eq!(gh.api_base(), "https://api.github.com");
        assert_eq!(gh.web_origin(), "https://github.com");
        let ghe = GitHubConfig::new("https://ghe.example.com/api/v3/", None).unwrap();
        assert_eq!(ghe.api_base(), "https://ghe.example.com/api/v3");
        assert_eq!(ghe.web_origin(), "https://ghe.example.com");
        let local = GitHubConfig::new("http://127.0.0.1:4567/api/v3", None).unwrap();
        assert_eq!(local.web_origin(), "http://127.0.0.1:4567");
        let split = GitHubConfig::new(
            "https://api.ghe.example.com",
            Some("https://ghe.example.com"),
        )
        .unwrap();
        assert_eq!(split.web_origin(), "https://ghe.example.com");
    }

    #[test]
    fn urls_with_credentials_or_other_schemes_are_refused_without_echoing_them() {
        for bad in [
            "https://user:s3cret@ghe.example.com/api/v3",
            "ftp://ghe.example.com",
            "https://ghe.example.com/api?x=s3cret",
            "not a url",
        ] {
            let e = GitHubConfig::new(bad, None).expect_err(bad);
            assert!(!e.to_string().contains("s3cret"), "{e}");
        }
        assert!(GitHubConfig::new(DEFAULT_API_URL, Some("https://github.com/x")).is_err());
    }
}
