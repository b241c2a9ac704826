//! A fault-injecting layer under every UDP send, for soak tests (feature `fault-injection`).
//!
//! Installed from the `TIERCEL_FAULTS` environment variable (`loss=0.1,dup=0.05,reorder=0.05,
//! delay_us=500,corrupt=0.01,seed=7`, every key optional) or by [`install`]. Each datagram is, with the
//! given probabilities, dropped, corrupted (one byte flipped), duplicated, or held back for up to
//! `delay_us` so that later datagrams overtake it. Without the feature this module does not exist.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, IoSlice};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Fault probabilities.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FaultConfig {
    /// Probability that a datagram is dropped.
    pub loss: f64,
    /// Probability that a datagram is sent twice.
    pub dup: f64,
    /// Probability that a datagram is held back (and so overtaken by later ones).
    pub reorder: f64,
    /// Longest hold-back.
    pub delay: Duration,
    /// Probability that one byte of a datagram is flipped.
    pub corrupt: f64,
    /// Seed of the fault decisions.
    pub seed: u64,
}

impl FaultConfig {
    /// Parses `loss=0.1,dup=0.05,reorder=0.05,delay_us=500,corrupt=0.01,seed=7`.
    pub fn parse(s: &str) -> Result<FaultConfig, String> {
        let mut c = FaultConfig { delay: Duration::from_micros(500), seed: 1, ..FaultConfig::default() };
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item.split_once('=').ok_or_else(|| format!("{item:?} is not key=value"))?;
            let f = || v.parse::<f64>().map_err(|e| format!("{k}: {e}"));
            match k {
                "loss" => c.loss = f()?,
                "dup" => c.dup = f()?,
                "reorder" => c.reorder = f()?,
                "corrupt" => c.corrupt = f()?,
                "delay_us" => c.delay = Duration::from_micros(v.parse().map_err(|e| format!("{k}: {e}"))?),
                "seed" => c.seed = v.parse().map_err(|e| format!("{k}: {e}"))?,
                _ => return Err(format!("unknown fault {k:?}")),
            }
        }
        Ok(c)
    }
}

/// What the layer has done so far.
#[derive(Debug, Default)]
pub struct FaultCounts {
    /// Datagrams dropped.
    pub dropped: AtomicU64,
    /// Datagrams sent twice.
    pub duplicated: AtomicU64,
    /// Datagrams held back.
    pub delayed: AtomicU64,
    /// Datagrams with a byte flipped.
    pub corrupted: AtomicU64,
}

struct Delayed {
    due: Instant,
    order: u64,
    socket: UdpSocket,
    to: Option<SocketAddr>,
    bytes: Vec<u8>,
}

impl PartialEq for Delayed {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.order) == (o.due, o.order)
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Delayed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.due, self.order).cmp(&(o.due, o.order))
    }
}

struct Layer {
    config: FaultConfig,
    rng: Mutex<u64>,
    delayer: Mutex<Sender<Delayed>>,
    counts: FaultCounts,
    order: AtomicU64,
}

static LAYER: OnceLock<Option<Layer>> = OnceLock::new();

/// Installs the layer with `config` (before the first send; later calls have no effect). Returns
/// whether this call installed it.
pub fn install(config: FaultConfig) -> bool {
    let mut installed = false;
    LAYER.get_or_init(|| {
        installed = true;
        Some(Layer::new(config))
    });
    installed
}

fn layer() -> Option<&'static Layer> {
    LAYER
        .get_or_init(|| {
            let spec = std::env::var("TIERCEL_FAULTS").ok()?;
            match FaultConfig::parse(&spec) {
                Ok(c) => Some(Layer::new(c)),
                Err(e) => {
                    eprintln!("tiercel: ignoring TIERCEL_FAULTS: {e}");
                    None
                }
            }
        })
        .as_ref()
}

/// Counts of what the layer has done, if it is installed.
pub fn counts() -> Option<&'static FaultCounts> {
    layer().map(|l| &l.counts)
}

impl Layer {
    fn new(config: FaultConfig) -> Layer {
        let (tx, rx) = channel();
        std::thread::Builder::new()
            .name("tiercel-fault-delayer".into())
            .spawn(move || delayer(rx))
            .expect("spawn the fault-injection delayer thread");
        Layer {
            config,
            rng: Mutex::new(config.seed.max(1)),
            delayer: Mutex::new(tx),
            counts: FaultCounts::default(),
            order: AtomicU64::new(0),
        }
    }

    fn roll(&self) -> f64 {
        let mut s = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        // xorshift64*
        *s ^= *s >> 12;
        *s ^= *s << 25;
        *s ^= *s >> 27;
        (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn delayer(rx: Receiver<Delayed>) {
    let mut heap: BinaryHeap<Reverse<Delayed>> = BinaryHeap::new();
    loop {
        let wait = heap.peek().map(|Reverse(d)| d.due.saturating_duration_since(Instant::now()));
        match rx.recv_timeout(wait.unwrap_or(Duration::from_secs(3600))) {
            Ok(d) => heap.push(Reverse(d)),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        while heap.peek().is_some_and(|Reverse(d)| d.due <= Instant::now()) {
            if let Some(Reverse(d)) = heap.pop() {
                let _ = match d.to {
                    Some(to) => d.socket.send_to(&d.bytes, to),
                    None => d.socket.send(&d.bytes),
                };
            }
        }
    }
}

/// A segmented send ([`crate::udp::send_segments`]) through the layer: each segment is a datagram
/// that faults may hit on its own.
pub(crate) fn intercept_segments(
    socket: &UdpSocket,
    to: Option<&SocketAddr>,
    parts: &[IoSlice<'_>],
    segment: usize,
) -> Option<io::Result<usize>> {
    layer()?;
    let bytes: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    for piece in bytes.chunks(segment.max(1)) {
        if let Some(Err(e)) = intercept(socket, to, &[IoSlice::new(piece)]) {
            return Some(Err(e));
        }
    }
    Some(Ok(bytes.len()))
}

/// What the layer does to one datagram sent some other way than through a socket (an AF_XDP
/// station's): how many copies go out (0: dropped), and whether they are held back until the next
/// datagram has gone (overtaken by it). `None`: no layer installed. A corrupted datagram has had one
/// byte of `bytes` flipped.
#[cfg(feature = "xdp")]
pub(crate) fn judge(bytes: &mut [u8]) -> Option<(u8, bool)> {
    let l = layer()?;
    let c = &l.config;
    if l.roll() < c.loss {
        l.counts.dropped.fetch_add(1, Ordering::Relaxed);
        return Some((0, false));
    }
    if !bytes.is_empty() && l.roll() < c.corrupt {
        let i = (l.roll() * bytes.len() as f64) as usize % bytes.len();
        bytes[i] ^= 1 << ((l.roll() * 8.0) as u32 % 8);
        l.counts.corrupted.fetch_add(1, Ordering::Relaxed);
    }
    let copies = if l.roll() < c.dup {
        l.counts.duplicated.fetch_add(1, Ordering::Relaxed);
        2
    } else {
        1
    };
    let held = l.roll() < c.reorder;
    if held {
        l.counts.delayed.fetch_add(1, Ordering::Relaxed);
    }
    Some((copies, held))
}

/// Applies the faults to one datagram. `None`: no layer installed, send normally.
pub(crate) fn intercept(
    socket: &UdpSocket,
    to: Option<&SocketAddr>,
    parts: &[IoSlice<'_>],
) -> Option<io::Result<usize>> {
    let l = layer()?;
    let c = &l.config;
    let mut bytes: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    let len = bytes.len();
    if l.roll() < c.loss {
        l.counts.dropped.fetch_add(1, Ordering::Relaxed);
        return Some(Ok(len));
    }
    if !bytes.is_empty() && l.roll() < c.corrupt {
        let i = (l.roll() * bytes.len() as f64) as usize % bytes.len();
        bytes[i] ^= 1 << ((l.roll() * 8.0) as u32 % 8);
        l.counts.corrupted.fetch_add(1, Ordering::Relaxed);
    }
    let copies = if l.roll() < c.dup {
        l.counts.duplicated.fetch_add(1, Ordering::Relaxed);
        2
    } else {
        1
    };
    for _ in 0..copies {
        if l.roll() < c.reorder {
            l.counts.delayed.fetch_add(1, Ordering::Relaxed);
            let due = Instant::now() + c.delay.mul_f64(l.roll());
            let Ok(clone) = socket.try_clone() else { continue };
            let order = l.order.fetch_add(1, Ordering::Relaxed);
            let d = Delayed { due, order, socket: clone, to: to.copied(), bytes: bytes.clone() };
            let _ = l.delayer.lock().unwrap_or_else(|p| p.into_inner()).send(d);
        } else {
            let sent = match to {
                Some(to) => socket.send_to(&bytes, to),
                None => socket.send(&bytes),
            };
            if let Err(e) = sent {
                return Some(Err(e));
            }
        }
    }
    Some(Ok(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_key() {
        let c = FaultConfig::parse("loss=0.1, dup=0.05,reorder=0.2,delay_us=300,corrupt=0.01,seed=9").unwrap();
        assert_eq!(c.loss, 0.1);
        assert_eq!(c.delay, Duration::from_micros(300));
        assert_eq!(c.seed, 9);
        assert!(FaultConfig::parse("lose=1").is_err());
    }
}
