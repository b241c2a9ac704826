//! Latency summaries: medians and 99th percentiles, never a best run.

use std::time::Duration;

use hdrhistogram::Histogram;

/// A latency histogram with nanosecond resolution up to 60 s.
pub struct Summary {
    histogram: Histogram<u64>,
}

impl Default for Summary {
    fn default() -> Summary {
        Summary::new()
    }
}

impl Summary {
    /// An empty summary.
    pub fn new() -> Summary {
        // Three significant digits from 1 ns to 60 s: the bounds are valid, so creation cannot fail.
        let histogram = Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap_or_else(|_| unreachable!());
        Summary { histogram }
    }

    /// Records one duration.
    pub fn record(&mut self, d: Duration) {
        let _ = self.histogram.record((d.as_nanos() as u64).clamp(1, 60_000_000_000));
    }

    /// Adds every sample of `other`.
    pub fn add(&mut self, other: &Summary) {
        let _ = self.histogram.add(&other.histogram);
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.histogram.len()
    }

    pub fn median_us(&self) -> f64 {
        self.histogram.value_at_quantile(0.5) as f64 / 1e3
    }

    pub fn mean_us(&self) -> f64 {
        self.histogram.mean() / 1e3
    }

    /// Points of the cumulative distribution, (µs, fraction of calls at or below), up to the 99th
    /// percentile (the p99 is in the tables; beyond it one outlier sets the scale of the plot).
    pub fn cdf(&self) -> Vec<(f64, f64)> {
        (0..=200)
            .map(|i| {
                let q = 0.99 * i as f64 / 200.0;
                (self.histogram.value_at_quantile(q) as f64 / 1e3, q)
            })
            .collect()
    }

    /// The mean of the middle half of the samples (those ranked between the 25th and the 75th
    /// percentile), µs: as robust to outliers as the median, and finer than the clock's step. The tick
    /// counter of our development VM (an AMD EPYC) moves in steps of 26 ticks, 10 ns, so the median of
    /// calls of 60–80 ns lands on one of a few steps, while the middle half's mean weighs the steps.
    pub fn middle_mean_us(&self) -> f64 {
        let n = self.histogram.len();
        if n == 0 {
            return 0.0;
        }
        let (from, to) = (n / 4, n - n / 4);
        let (mut rank, mut sum, mut taken) = (0u64, 0.0, 0u64);
        for v in self.histogram.iter_recorded() {
            let count = v.count_at_value();
            // The samples of this value whose ranks fall in [from, to).
            let inside = (rank + count).min(to).saturating_sub(rank.max(from));
            sum += inside as f64 * self.histogram.median_equivalent(v.value_iterated_to()) as f64;
            taken += inside;
            rank += count;
            if rank >= to {
                break;
            }
        }
        if taken == 0 {
            return self.median_us();
        }
        sum / taken as f64 / 1e3
    }

    pub fn p99_us(&self) -> f64 {
        self.histogram.value_at_quantile(0.99) as f64 / 1e3
    }
}

/// The median of `rates` (slices' calls per second): the upper one of an even count; 0 if none.
pub(crate) fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_middle_mean_weighs_the_steps_of_the_middle_half_and_ignores_the_tails() {
        let mut s = Summary::new();
        // 100 samples: 25 of 10 ns below, then 20 of 60, 30 of 70, and 25 of 1 ms above.
        for (ns, count) in [(10, 25), (60, 20), (70, 30), (1_000_000, 25)] {
            for _ in 0..count {
                s.record(Duration::from_nanos(ns));
            }
        }
        // The middle half: ranks 25 to 74, 20 samples of 60 ns and 30 of 70.
        assert!((s.middle_mean_us() - 0.066).abs() < 1e-9, "{}", s.middle_mean_us());
        assert_eq!(s.median_us(), 0.07);
        assert_eq!(Summary::new().middle_mean_us(), 0.0);
    }
}
