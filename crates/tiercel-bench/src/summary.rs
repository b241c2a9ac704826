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

    pub fn p99_us(&self) -> f64 {
        self.histogram.value_at_quantile(0.99) as f64 / 1e3
    }
}

/// The median of `rates` (slices' calls per second): the upper one of an even count; 0 if none.
pub(crate) fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied().unwrap_or(0.0)
}
