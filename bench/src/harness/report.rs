//! Writing BENCHMARKS.md: the document's head, the words and units its tables use, and the file.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;

/// The title and the line saying how and when the run wrote the document.
pub fn head(quick: bool, took: Duration) -> String {
    format!(
        "# Benchmarks\n\n\
         Written by `make bench` ({}) on {}; the whole run took {:.0} s. Loopback only. Every figure and \
         verdict below comes from this run.\n\n",
        if quick { "quick mode" } else { "full run" },
        time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        took.as_secs_f64()
    )
}

/// Writes `text` to `path`.
pub fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// A goal's verdict in a "Met" column.
pub fn yes_no(met: bool) -> &'static str {
    if met { "yes" } else { "**no**" }
}

/// A goal's verdict from an interval of the figure (the range over the repeated runs, or of a ratio of
/// two figures' ranges): met when all of it meets the goal, missed when none of it does, undetermined
/// when it straddles the goal (the runs do not decide it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Met,
    Missed,
    Undetermined,
}

impl Outcome {
    /// The outcome of `[low, high]` against `meets` (monotone in the figure); `None` when either end is
    /// not a number (not measured).
    pub fn of(low: f64, high: f64, meets: impl Fn(f64) -> bool) -> Option<Self> {
        if low.is_nan() || high.is_nan() {
            return None;
        }
        Some(match (meets(low), meets(high)) {
            (true, true) => Outcome::Met,
            (false, false) => Outcome::Missed,
            _ => Outcome::Undetermined,
        })
    }

    /// For a "Met" column.
    pub fn text(self) -> &'static str {
        match self {
            Outcome::Met => "yes",
            Outcome::Missed => "**no**",
            Outcome::Undetermined => "undetermined (the runs' range straddles the goal)",
        }
    }
}

/// A goal's verdict in a "goal" column.
pub fn met(met: bool) -> &'static str {
    if met { "met" } else { "missed" }
}

/// A goal's verdict in a "Verdict" column, a miss in bold.
pub fn met_bold(met: bool) -> &'static str {
    if met { "met" } else { "**missed**" }
}

/// Bytes in a MiB.
pub const MIB: u64 = 1024 * 1024;

/// KiB as MiB.
pub fn kib_to_mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Bytes as `x.y MiB`.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}

/// The values, comma-separated.
pub fn list(v: &[impl std::fmt::Display]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Milliseconds with one decimal, comma-separated.
pub fn list_ms(v: &[f64]) -> String {
    list(&v.iter().map(|m| format!("{m:.1}")).collect::<Vec<_>>())
}

#[cfg(test)]
mod outcome_tests {
    use super::Outcome;

    #[test]
    fn an_interval_meets_misses_or_straddles_the_goal() {
        let at_least_3 = |x: f64| x >= 3.0;
        assert_eq!(Outcome::of(3.1, 4.0, at_least_3), Some(Outcome::Met));
        assert_eq!(Outcome::of(1.0, 2.9, at_least_3), Some(Outcome::Missed));
        assert_eq!(
            Outcome::of(2.5, 3.5, at_least_3),
            Some(Outcome::Undetermined)
        );
        assert_eq!(Outcome::of(f64::NAN, 3.5, at_least_3), None);
    }
}
