//! An on-path UDP relay, for the tests of secure bindings across network namespaces: the datagrams
//! of each client arriving at `--listen` go on to `--to` from a socket of the client's own, and
//! the answers come back the same way; every datagram is looked at as it passes, a bit of every
//! `--flip-every`th one (each way) is flipped, and every `--replay-every`th one from a client is
//! sent twice. After `--seconds` (or, with `--until-stdin-closes`, once its standard input closes,
//! if sooner) it prints what it saw on one line and ends:
//! `relayed up=U down=D marker=M flipped=F replayed=R` (`marker`: datagrams that held the marker's
//! bytes in the clear).

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Options of the relay.
#[derive(clap::Args)]
pub struct Args {
    /// Where clients send.
    #[arg(long)]
    listen: SocketAddr,
    /// The server the datagrams go on to.
    #[arg(long)]
    to: SocketAddr,
    /// Bytes to look for in every datagram.
    #[arg(long)]
    marker: String,
    /// Flip one bit of every Nth datagram each way (0: none).
    #[arg(long, default_value_t = 0)]
    flip_every: u64,
    /// Send every Nth datagram from a client twice (0: none).
    #[arg(long, default_value_t = 0)]
    replay_every: u64,
    /// How long to relay at most.
    #[arg(long)]
    seconds: u64,
    /// End sooner, once standard input closes (so that a test ends the relay when its calls are
    /// done, however long a loaded machine made them take, rather than guessing a time).
    #[arg(long)]
    until_stdin_closes: bool,
}

/// What the relay saw.
#[derive(Default)]
struct Seen {
    up: AtomicU64,
    down: AtomicU64,
    marker: AtomicU64,
    flipped: AtomicU64,
    replayed: AtomicU64,
}

impl Seen {
    /// Looks at datagram `d`, the `n`th its way, and flips one of its bits if it is its turn.
    fn pass(&self, d: &mut [u8], n: u64, flip_every: u64, marker: &[u8]) {
        if !marker.is_empty() && d.windows(marker.len()).any(|w| w == marker) {
            self.marker.fetch_add(1, Ordering::Relaxed);
        }
        if flip_every > 0 && n.is_multiple_of(flip_every) && !d.is_empty() {
            // A bit anywhere in the datagram, spread over the datagrams (Knuth's multiplier).
            let bit = (n.wrapping_mul(2_654_435_761) % (d.len() as u64 * 8)) as usize;
            d[bit / 8] ^= 1 << (bit % 8);
            self.flipped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Runs the relay.
pub fn run(args: Args) -> crate::Result<()> {
    let front = Arc::new(UdpSocket::bind(args.listen)?);
    let tick = Duration::from_millis(20);
    front.set_read_timeout(Some(tick))?;
    let seen = Arc::new(Seen::default());
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let closed = Arc::new(AtomicBool::new(false));
    if args.until_stdin_closes {
        let closed = closed.clone();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            closed.store(true, Ordering::Relaxed);
        });
    }
    let going = move || Instant::now() < until && !closed.load(Ordering::Relaxed);
    let marker = args.marker.into_bytes();
    let mut backs: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
    let mut threads = Vec::new();
    let mut buf = vec![0u8; 70_000];
    while going() {
        let Ok((n, from)) = front.recv_from(&mut buf) else { continue };
        let back = match backs.get(&from) {
            Some(back) => back.clone(),
            None => {
                let unspecified = match args.to {
                    SocketAddr::V4(_) => SocketAddr::from(([0u8; 4], 0)),
                    SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
                };
                let back = Arc::new(UdpSocket::bind(unspecified)?);
                back.connect(args.to)?;
                back.set_read_timeout(Some(tick))?;
                backs.insert(from, back.clone());
                let (b, f, s, m, flip) = (back.clone(), front.clone(), seen.clone(), marker.clone(), args.flip_every);
                let going = going.clone();
                threads.push(std::thread::spawn(move || {
                    let mut buf = vec![0u8; 70_000];
                    while going() {
                        let Ok(n) = b.recv(&mut buf) else { continue };
                        let count = s.down.fetch_add(1, Ordering::Relaxed) + 1;
                        s.pass(&mut buf[..n], count, flip, &m);
                        let _ = f.send_to(&buf[..n], from);
                    }
                }));
                back
            }
        };
        let count = seen.up.fetch_add(1, Ordering::Relaxed) + 1;
        let d = &mut buf[..n];
        seen.pass(d, count, args.flip_every, &marker);
        let _ = back.send(d);
        if args.replay_every > 0 && count.is_multiple_of(args.replay_every) {
            let _ = back.send(d);
            seen.replayed.fetch_add(1, Ordering::Relaxed);
        }
    }
    for t in threads {
        let _ = t.join();
    }
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "relayed up={} down={} marker={} flipped={} replayed={}",
        get(&seen.up),
        get(&seen.down),
        get(&seen.marker),
        get(&seen.flipped),
        get(&seen.replayed)
    );
    Ok(())
}
