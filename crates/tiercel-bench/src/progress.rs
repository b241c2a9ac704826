//! The progress bar of `tiercel bench` and `tiercel explain`, on standard error when it is a terminal,
//! and the printing of tables around it.

use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

static BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

fn with_bar(f: impl FnOnce(&ProgressBar)) {
    if let Some(bar) = BAR.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        f(bar);
    }
}

/// Shows a bar of `len` steps.
pub fn start(len: u64) {
    let bar = ProgressBar::new(len);
    let style = ProgressStyle::with_template("{elapsed:>4} [{bar:30}] {pos}/{len} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(200));
    *BAR.lock().unwrap_or_else(|e| e.into_inner()) = Some(bar);
}

/// Says what is being measured now.
pub fn doing(what: &str) {
    let what = what.to_string();
    with_bar(move |b| b.set_message(what));
}

/// One step done.
pub fn step() {
    with_bar(|b| b.inc(1));
}

/// Removes the bar.
pub fn finish() {
    if let Some(bar) = BAR.lock().unwrap_or_else(|e| e.into_inner()).take() {
        bar.finish_and_clear();
    }
}

/// Prints a line of output without tearing the bar.
pub fn print(line: std::fmt::Arguments<'_>) {
    let guard = BAR.lock().unwrap_or_else(|e| e.into_inner());
    match guard.as_ref() {
        Some(bar) => bar.suspend(|| println!("{line}")),
        None => println!("{line}"),
    }
}

/// `println!` for the measuring commands: prints around the progress bar.
macro_rules! outln {
    () => { $crate::progress::print(format_args!("")) };
    ($($t:tt)*) => { $crate::progress::print(format_args!($($t)*)) };
}
pub(crate) use outln;
