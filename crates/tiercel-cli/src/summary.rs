//! Latency summaries: medians and 99th percentiles, never a best run.

use std::time::Duration;

use hdrhistogram::Histogram;

/// A latency histogram with nanosecond resolution up to 60 s.
pub struct Summary {
    histogram: Histogram<u64>,
}

impl Summary {
    pub fn new() -> Summary {
        // Three significant digits from 1 ns to 60 s: the bounds are valid, so creation cannot fail.
        let histogram = Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap_or_else(|_| unreachable!());
        Summary { histogram }
    }

    pub fn record(&mut self, d: Duration) {
        let _ = self.histogram.record((d.as_nanos() as u64).clamp(1, 60_000_000_000));
    }

    pub fn len(&self) -> u64 {
        self.histogram.len()
    }

    pub fn median_us(&self) -> f64 {
        self.histogram.value_at_quantile(0.5) as f64 / 1e3
    }

    pub fn p99_us(&self) -> f64 {
        self.histogram.value_at_quantile(0.99) as f64 / 1e3
    }
}
