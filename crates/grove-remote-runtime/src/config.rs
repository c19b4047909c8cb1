//! The part of a remote provider's configuration both adapters read the same way: an
//! API root and a key, set together or not at all.

/// Reads the API root `url_var` and the key `key_var` through `get` (blank counts as
/// unset): `Ok(None)` when neither is set, the pair when both are and the root is an
/// http(s) URL, otherwise a message naming the variables (never their values).
pub fn url_and_key(
    get: &impl Fn(&str) -> Option<String>,
    url_var: &str,
    key_var: &str,
) -> Result<Option<(String, String)>, String> {
    let var = |k: &str| get(k).filter(|v| !v.trim().is_empty());
    let (url, key) = match (var(url_var), var(key_var)) {
        (None, None) => return Ok(None),
        (Some(u), Some(k)) => (u, k),
        (Some(_), None) => return Err(format!("{url_var} is set but {key_var} is not")),
        (None, Some(_)) => return Err(format!("{key_var} is set but {url_var} is not")),
    };
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(format!("{url_var} must be an http(s) URL"));
    }
    Ok(Some((url, key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_or_neither_and_the_key_is_never_in_the_message() {
        let get = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
        };
        assert_eq!(url_and_key(&get(&[]), "U", "K"), Ok(None));
        let e = url_and_key(&get(&[("K", "secret")]), "U", "K").unwrap_err();
        assert!(!e.contains("secret"), "{e}");
        assert!(url_and_key(&get(&[("U", "ftp://x"), ("K", "k")]), "U", "K").is_err());
        assert_eq!(
            url_and_key(&get(&[("U", "https://x"), ("K", "k")]), "U", "K"),
            Ok(Some(("https://x".into(), "k".into())))
        );
    }
}
