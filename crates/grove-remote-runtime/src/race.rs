//! Convergence after a create race: two grove workers that find no sandbox for one
//! (user, project) at the same moment both create one. Each, after its create, lists
//! the sandboxes carrying the key's labels and keeps the [`survivor`]: the oldest, by
//! creation time then id, so every racer picks the same one. A racer whose sandbox is
//! not the survivor deletes its own (new and empty: no workspace was placed in it yet)
//! and uses the survivor; it never deletes a sandbox another racer created.

/// A sandbox as listed: its id and its creation time as the provider writes it (an
/// RFC 3339 timestamp; `None` when the provider gave none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<'a> {
    pub id: &'a str,
    pub created: Option<&'a str>,
}

/// The sandbox every racer keeps: the oldest (a missing time counts as newest), ties
/// broken by id. `None` for an empty list.
///
/// RFC 3339 timestamps of one provider share a format and zone (`Z`), so they order
/// as strings; fractional seconds of differing length are padded before comparing.
pub fn survivor<'a>(candidates: &[Candidate<'a>]) -> Option<&'a str> {
    candidates
        .iter()
        .min_by(|a, b| {
            let key = |c: &Candidate<'_>| (c.created.is_none(), c.created.map(normalize));
            key(a).cmp(&key(b)).then_with(|| a.id.cmp(b.id))
        })
        .map(|c| c.id)
}

/// The item of `listed` every racer keeps ([`survivor`] of their ids and creation
/// times); `None` for an empty list.
pub fn keep_oldest<T>(
    listed: Vec<T>,
    id: impl Fn(&T) -> &str,
    created: impl Fn(&T) -> Option<&str>,
) -> Option<T> {
    let candidates: Vec<Candidate<'_>> = listed
        .iter()
        .map(|t| Candidate {
            id: id(t),
            created: created(t),
        })
        .collect();
    let keep = survivor(&candidates)?.to_string();
    listed.into_iter().find(|t| id(t) == keep)
}

/// `2026-01-02T03:04:05.1Z` and `2026-01-02T03:04:05.123456Z` made comparable: the
/// fraction padded to nine digits.
fn normalize(ts: &str) -> String {
    let (main, zone) = match ts
        .find(['Z', '+'])
        .or_else(|| ts.rfind('-').filter(|i| *i > 10))
    {
        Some(i) => ts.split_at(i),
        None => (ts, ""),
    };
    let (secs, frac) = main.split_once('.').unwrap_or((main, ""));
    format!("{secs}.{frac:0<9}{zone}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c<'a>(id: &'a str, created: Option<&'a str>) -> Candidate<'a> {
        Candidate { id, created }
    }

    #[test]
    fn every_racer_keeps_the_oldest_and_ties_go_to_the_smallest_id() {
        let list = [
            c("b", Some("2026-01-02T03:04:05.2Z")),
            c("a", Some("2026-01-02T03:04:05.123Z")),
            c("c", None),
        ];
        assert_eq!(survivor(&list), Some("a"));
        let mut reversed = list;
        reversed.reverse();
        assert_eq!(survivor(&reversed), Some("a"), "order does not matter");
        assert_eq!(
            survivor(&[
                c("y", Some("2026-01-01T00:00:00Z")),
                c("x", Some("2026-01-01T00:00:00Z"))
            ]),
            Some("x")
        );
        assert_eq!(survivor(&[c("n", None), c("m", None)]), Some("m"));
        assert_eq!(survivor(&[]), None);
    }
}
