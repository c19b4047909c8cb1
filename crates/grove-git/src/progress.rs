//! Parsing of the git CLI's `--progress` output (stderr, `\r`-separated updates) into
//! [`TransferProgress`] snapshots. The text comes partly from the remote (`remote:`
//! lines), so nothing here trusts it beyond reading numbers out of it.

use grove_core::transfer::{TransferPhase, TransferProgress};

/// Folds git's progress lines into the current snapshot.
#[derive(Debug, Default)]
pub(crate) struct ProgressParser {
    current: TransferProgress,
}

impl ProgressParser {
    pub(crate) fn current(&self) -> &TransferProgress {
        &self.current
    }

    /// Reads one line (without its `\r` or `\n`); true when the snapshot changed.
    pub(crate) fn feed(&mut self, line: &str) -> bool {
        let line = line.trim_end_matches(|c: char| c.is_whitespace() || c == '\u{1b}');
        let line = line.strip_suffix("\u{1b}[K").unwrap_or(line).trim();
        let line = line.strip_prefix("remote:").map_or(line, str::trim_start);
        let Some((title, rest)) = line.split_once(':') else {
            return false;
        };
        let Some(phase) = phase_of(title) else {
            return false;
        };
        let before = self.current.clone();
        let counts = Counts::parse(rest);
        if counts == Counts::default() {
            return false;
        }
        self.apply(phase, &counts);
        self.current != before
    }

    fn apply(&mut self, phase: TransferPhase, counts: &Counts) {
        let p = &mut self.current;
        if phase != p.phase {
            p.percent = None;
            p.objects_done = 0;
            p.objects_total = 0;
        }
        p.phase = phase;
        p.percent = counts.percent.or(p.percent);
        if let Some(done) = counts.done {
            p.objects_done = done;
        }
        if let Some(total) = counts.total {
            p.objects_total = total;
        }
        match phase {
            TransferPhase::Receiving => {
                p.objects_received = p.objects_done;
                if let Some(bytes) = counts.bytes {
                    p.bytes_received = bytes;
                }
                if let Some(rate) = counts.rate {
                    p.bytes_per_sec = rate;
                }
            }
            TransferPhase::Resolving => {
                p.deltas_done = p.objects_done;
                p.deltas_total = p.objects_total;
            }
            _ => {}
        }
    }

    /// Marks the transfer finished.
    pub(crate) fn finish(&mut self) -> &TransferProgress {
        self.current.phase = TransferPhase::Done;
        self.current.percent = Some(100);
        &self.current
    }
}

fn phase_of(title: &str) -> Option<TransferPhase> {
    Some(match title.trim() {
        "Enumerating objects" | "Counting objects" | "Finding sources" => TransferPhase::Counting,
        "Compressing objects" => TransferPhase::Compressing,
        "Receiving objects" | "Unpacking objects" => TransferPhase::Receiving,
        "Resolving deltas" => TransferPhase::Resolving,
        "Checking connectivity" | "Checking objects" => TransferPhase::Checking,
        _ => return None,
    })
}

/// The numbers of one progress line: `45% (100/222), 10.50 MiB | 5.20 MiB/s`, or a
/// bare count `1234, done.`.
#[derive(Debug, Default, PartialEq)]
struct Counts {
    percent: Option<u8>,
    done: Option<u64>,
    total: Option<u64>,
    bytes: Option<u64>,
    rate: Option<u64>,
}

impl Counts {
    fn parse(rest: &str) -> Self {
        let mut c = Counts::default();
        let (counts, throughput) = match rest.split_once(',') {
            Some((a, b)) => (a.trim(), Some(b.trim())),
            None => (rest.trim(), None),
        };
        if let Some((pct, frac)) = counts.split_once('%') {
            c.percent = pct.trim().parse::<u8>().ok().map(|p| p.min(100));
            let frac = frac.trim().trim_start_matches('(').trim_end_matches(')');
            if let Some((done, total)) = frac.split_once('/') {
                c.done = done.trim().parse().ok();
                c.total = total.trim().parse().ok();
            }
        } else {
            c.done = counts.parse().ok();
        }
        if let Some(t) = throughput.filter(|t| *t != "done.") {
            let t = t.trim_end_matches(", done.");
            let (size, rate) = match t.split_once('|') {
                Some((s, r)) => (s, Some(r)),
                None => (t, None),
            };
            c.bytes = parse_size(size);
            c.rate = rate.and_then(|r| parse_size(r.trim().trim_end_matches("/s")));
        }
        c
    }
}

/// `10.50 MiB`, `512 bytes`, `1 byte`, `3.00 KiB` → bytes (git's humanised sizes).
fn parse_size(text: &str) -> Option<u64> {
    let (number, unit) = text.trim().split_once(' ')?;
    let mult: f64 = match unit.trim() {
        "byte" | "bytes" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let value: f64 = number.parse().ok()?;
    (value.is_finite() && value >= 0.0).then_some((value * mult) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fed(lines: &[&str]) -> TransferProgress {
        let mut p = ProgressParser::default();
        for l in lines {
            p.feed(l);
        }
        p.current().clone()
    }

    #[test]
    fn receiving_lines_give_objects_bytes_and_rate() {
        let p = fed(&["Receiving objects:  12% (28017/233478), 10.50 MiB | 5.20 MiB/s"]);
        assert_eq!(p.phase, TransferPhase::Receiving);
        assert_eq!((p.objects_done, p.objects_total), (28017, 233478));
        assert_eq!(p.objects_received, 28017);
        assert_eq!(p.percent, Some(12));
        assert_eq!(p.bytes_received, (10.5 * 1024.0 * 1024.0) as u64);
        assert_eq!(p.bytes_per_sec, (5.2 * 1024.0 * 1024.0) as u64);
    }

    #[test]
    fn remote_lines_and_later_phases_keep_what_was_received() {
        let p = fed(&[
            "remote: Enumerating objects: 233478, done.        ",
            "remote: Counting objects: 100% (40/40), done.\u{1b}[K",
            "remote: Compressing objects:  50% (10/20)",
            "Receiving objects: 100% (233478/233478), 106.20 MiB | 30.00 MiB/s, done.",
            "Resolving deltas:  40% (400/1000)",
        ]);
        assert_eq!(p.phase, TransferPhase::Resolving);
        assert_eq!(p.objects_received, 233478);
        assert_eq!((p.deltas_done, p.deltas_total), (400, 1000));
        assert_eq!(p.bytes_received, (106.2 * 1024.0 * 1024.0) as u64);
        assert_eq!(p.percent, Some(40));
    }

    #[test]
    fn counting_without_a_total_and_small_sizes_parse() {
        let p = fed(&["remote: Enumerating objects: 1234"]);
        assert_eq!((p.phase, p.objects_done), (TransferPhase::Counting, 1234));
        let p = fed(&["Unpacking objects: 100% (3/3), 512 bytes | 512.00 KiB/s, done."]);
        assert_eq!((p.bytes_received, p.bytes_per_sec), (512, 512 * 1024));
    }

    #[test]
    fn other_lines_change_nothing() {
        let mut p = ProgressParser::default();
        for l in [
            "From file:///tmp/x",
            " * [new branch]      main -> main",
            "remote: Total 3 (delta 0), reused 0 (delta 0), pack-reused 0",
            "remote: evil: 99% (1/1)",
            "Receiving objects: lots",
            "",
        ] {
            p.feed(l);
        }
        assert_eq!(p.current(), &TransferProgress::default());
    }
}
