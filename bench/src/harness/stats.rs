//! Percentiles (nearest rank, one rule for every figure), medians and ranges, and durations as the
//! tables show them.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

/// The index of the `p` percentile (0 < p ≤ 1) among `n` sorted values by the nearest-rank rule;
/// `None` when there are none.
pub fn nearest_rank(n: usize, p: f64) -> Option<usize> {
    (n > 0).then(|| ((p * n as f64).ceil() as usize).clamp(1, n) - 1)
}

/// Latency percentiles of a series of samples, in milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Percentiles {
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Percentiles {
    pub fn of(samples: &[f64]) -> Self {
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let at = |p: f64| nearest_rank(v.len(), p).map_or(0.0, |i| v[i]);
        Self {
            samples: v.len(),
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            max_ms: v.last().copied().unwrap_or(0.0),
        }
    }
}

/// Latencies pooled over several runs (every attempt of a cell): counts per microsecond value.
#[derive(Clone, Debug, Default)]
pub struct Pooled {
    counts: BTreeMap<u32, u64>,
    total: u64,
}

impl Pooled {
    /// Adds a run's latencies.
    pub fn add(&mut self, latencies: &[u32]) {
        for &l in latencies {
            *self.counts.entry(l).or_insert(0) += 1;
        }
        self.total += latencies.len() as u64;
    }

    /// Latencies pooled so far.
    pub fn len(&self) -> u64 {
        self.total
    }

    /// Whether nothing was pooled.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The `p` percentile (0 < p ≤ 1) of everything pooled, µs; the same rank rule as a run's.
    pub fn percentile(&self, p: f64) -> u64 {
        let Some(index) = nearest_rank(self.total as usize, p) else {
            return 0;
        };
        let mut seen = 0;
        for (&v, &n) in &self.counts {
            seen += n;
            if seen > index as u64 {
                return u64::from(v);
            }
        }
        self.counts.keys().next_back().map_or(0, |&v| u64::from(v))
    }
}

/// The median of `v` (of an even count, the upper middle value); 0 when empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The smallest and the largest of `v`.
pub fn range(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// The median of `v` and, of two or more values, their range in brackets.
pub fn median_and_range(v: &[f64], decimals: usize) -> String {
    let m = median(v.to_vec());
    if v.len() < 2 {
        return format!("{m:.decimals$}");
    }
    let (lo, hi) = range(v);
    format!("{m:.decimals$} ({lo:.decimals$}–{hi:.decimals$})")
}

/// `amount` per second of `secs`; 0 without time.
pub fn per_second(amount: f64, secs: f64) -> f64 {
    if secs > 0.0 { amount / secs } else { 0.0 }
}

/// Milliseconds, fractional.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Whole milliseconds.
pub fn whole_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&v);
        assert_eq!(
            (p.samples, p.p50_ms, p.p99_ms, p.max_ms),
            (100, 50.0, 99.0, 100.0)
        );
        let p = Percentiles::of(&[3.0, 1.0, 2.0]);
        assert_eq!((p.p50_ms, p.p99_ms, p.max_ms), (2.0, 3.0, 3.0));
        assert_eq!(Percentiles::of(&[]).max_ms, 0.0);
        assert_eq!(nearest_rank(0, 0.5), None);
        assert_eq!(nearest_rank(1000, 0.999), Some(998));
    }

    #[test]
    fn pooled_percentiles_rank_like_a_single_run() {
        let mut p = Pooled::default();
        assert_eq!(p.percentile(0.99), 0);
        p.add(&(1..=50).collect::<Vec<u32>>());
        p.add(&(51..=100).collect::<Vec<u32>>());
        assert_eq!(p.len(), 100);
        assert_eq!(p.percentile(0.5), 50);
        assert_eq!(p.percentile(0.99), 99);
        assert_eq!(p.percentile(1.0), 100);
        p.add(&[5000]);
        assert_eq!(p.percentile(1.0), 5000);
    }

    #[test]
    fn medians_and_ranges() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0, 4.0]), 3.0);
        assert_eq!(median_and_range(&[2.0], 1), "2.0");
        assert_eq!(median_and_range(&[3.0, 1.0, 2.0], 0), "2 (1–3)");
        assert_eq!(per_second(10.0, 0.0), 0.0);
    }
}
