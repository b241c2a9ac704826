//! A station: an AF_XDP socket on each receive queue of one interface, with tiercel's XDP program,
//! shared by every user of that interface in this process (a server's port, a client's endpoints),
//! each known by its UDP port.
//!
//! The program steers the datagrams addressed to the ports opened here ([`Station::open_port`]) to
//! the socket of the queue they arrived on; everything else goes on to the kernel. A datagram is
//! sent as a frame built in the memory of queue 0's socket (the headers, then the parts given, one
//! copy of each) to the hardware address the station learned from the peer's own frames, or else
//! the kernel's neighbor table's. A datagram read for another port than the reader's is left in
//! that port's mailbox, and its reader woken: one reader at a time polls the sockets' descriptors,
//! the others wait for it. A reader is a thread, waiting in `poll` ([`Station::wait`]), or a task,
//! waiting for a descriptor of the station's readiness in its runtime's reactor ([`Station::turn`]).
//!
//! Nothing here is unsafe: the rings and the memory are [`Xsk`]'s, the system calls `xdp.rs`'s.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::task::Waker;
use std::time::{Duration, Instant};

use super::frame::{self, Template};
use super::{Mode, Steering, Xsk};

/// Datagrams kept for a port whose reader is elsewhere; more are dropped (lost, to the protocol).
const MAILBOX: usize = 256;
/// Peers whose hardware addresses are remembered.
const NEIGHBORS: usize = 4096;
/// The longest UDP payload a UMEM frame holds (4 KiB, less the headroom and headers).
const FRAME_PAYLOAD: usize = 3584;
/// The most receive queues a station reads (a socket and a UMEM each, of 1 to 4 MiB beyond the
/// first: `super::receiving_frames`), as many as the program's map of sockets holds; an interface
/// with more has no station.
pub(crate) const MAX_QUEUES: u32 = 64;

/// What [`Station::sort`] did with a frame.
enum Sorted {
    /// The reader's datagram, copied into its buffer: its length and sender.
    Ours((usize, SocketAddrV4)),
    /// Left in another port's mailbox.
    Posted,
    /// Malformed, too long for the reader's buffer, or for a full mailbox: counted and dropped.
    Dropped,
}

/// One interface's AF_XDP sockets and XDP program, shared in this process.
pub struct Station {
    ifname: String,
    ip: Ipv4Addr,
    mac: [u8; 6],
    /// The longest UDP payload one frame carries (the MTU, less the IPv4 and UDP headers).
    max_payload: usize,
    mode: Mode,
    /// The sockets' descriptors, to poll.
    fds: Vec<i32>,
    /// The sockets' descriptors and the bell's: what a thread polls.
    polled: Vec<i32>,
    /// Rung when a datagram is left for the port of the thread that polls: the frame woke it, but
    /// another reader took it from the ring first.
    bell: std::os::fd::OwnedFd,
    io: Mutex<Io>,
    post: Mutex<Post>,
    /// Datagrams in mailboxes: a reader looks in its own only when there are some.
    letters: AtomicUsize,
    /// Threads waiting on `ready` (changed with `post` held): told only when there are some.
    sleepers: AtomicUsize,
    ready: Condvar,
    stats: Counters,
    /// Dropped after `io`: the program is detached once the socket is closed.
    steering: Mutex<Steering>,
}

/// What sending and receiving share.
struct Io {
    /// A socket on each receive queue; the first, queue 0's, sends.
    xsks: Vec<Xsk>,
    /// Hardware addresses learned from frames received (heard), or read from the kernel's
    /// neighbor table, by IPv4 address.
    neighbors: HashMap<u32, Neighbor, BuildIpHasher>,
    /// The headers of the last datagram sent, from its port to its peer at its hardware address:
    /// those of the next, most often (a caller's next call, a server's answer to the same peer).
    last: Option<(u16, SocketAddrV4, [u8; 6], Template)>,
    /// Frames the fault-injection layer held back, sent after the next (feature
    /// `fault-injection`).
    #[cfg(feature = "fault-injection")]
    held: Vec<Vec<u8>>,
}

/// A peer's hardware address, and whether the station heard it in the peer's own frames.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Neighbor {
    mac: [u8; 6],
    heard: bool,
}

/// A hasher for IPv4 addresses (one multiplication): the table is bounded, and its keys are the
/// peers' own addresses, not anything a peer picks to collide.
#[derive(Default, Clone, Copy)]
struct BuildIpHasher;

struct IpHasher(u64);

impl std::hash::BuildHasher for BuildIpHasher {
    type Hasher = IpHasher;
    fn build_hasher(&self) -> IpHasher {
        IpHasher(0)
    }
}

impl std::hash::Hasher for IpHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (u64::from(n) ^ 0x5851_f42d_4c95_7f2d).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Datagrams read for ports whose readers are elsewhere, and who polls.
#[derive(Default)]
struct Post {
    mailboxes: HashMap<u16, Mailbox>,
    /// A reader polls the sockets' descriptors (a thread or a task).
    polling: bool,
    /// The port of the thread that polls, when a thread does.
    thread_polls: Option<u16>,
    /// The bell was rung since that thread began to poll.
    rung: bool,
}

/// A port's datagrams read by another reader, and the task that waits for them.
#[derive(Default)]
struct Mailbox {
    letters: VecDeque<(SocketAddrV4, Vec<u8>)>,
    /// The task of the port's reader, while it waits ([`Station::turn`]).
    waker: Option<Waker>,
}

impl Post {
    /// Ends a poller's turn: the next reader to wait polls. The task returned (one that waits, if
    /// any) is to be woken to take the turn; the waiting threads are told by the caller.
    fn end_turn(&mut self) -> Option<Waker> {
        self.polling = false;
        self.mailboxes.values_mut().find_map(|m| m.waker.take())
    }

    /// [`Station::turn`].
    fn turn(&mut self, port: u16, task: &Waker, polling: bool) -> Turn {
        // A closed port has no mailbox, and nothing comes for it: the caller's look finds nothing.
        let Some(mailbox) = self.mailboxes.get_mut(&port) else { return Turn::Letter };
        if !mailbox.letters.is_empty() {
            return Turn::Letter;
        }
        match &mut mailbox.waker {
            Some(w) if w.will_wake(task) => {}
            other => *other = Some(task.clone()),
        }
        if polling {
            return Turn::Poll;
        }
        if !self.polling {
            self.polling = true;
            return Turn::Poll;
        }
        Turn::Wait
    }

    /// [`Station::done_waiting`]: the task to wake to take the turn, if it ended.
    fn done_waiting(&mut self, port: u16, polled: bool) -> Option<Waker> {
        if let Some(mailbox) = self.mailboxes.get_mut(&port) {
            mailbox.waker = None;
        }
        if polled {
            self.end_turn()
        } else {
            None
        }
    }
}

/// What an async reader of a port does next ([`Station::turn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// A datagram waits in the port's mailbox: read it.
    Letter,
    /// The reader polls: it waits for its descriptor of the station's readiness
    /// ([`Station::readiness`]), then reads, and ends its turn with [`Station::done_waiting`].
    Poll,
    /// Another reader polls: the task is woken when a datagram is left for the port, or when the
    /// turn to poll is free.
    Wait,
}

#[derive(Default)]
struct Counters {
    received: AtomicU64,
    sent: AtomicU64,
    malformed: AtomicU64,
    dropped: AtomicU64,
    unsent: AtomicU64,
}

/// A station's counters as they stood when read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StationStats {
    /// Datagrams received through the socket, for any port.
    pub received: u64,
    /// Datagrams sent through the socket.
    pub sent: u64,
    /// Frames the program steered that were no UDP datagram over IPv4 tiercel reads, or too long
    /// for the reader's buffer.
    pub malformed: u64,
    /// Datagrams for a port with no reader, or whose mailbox was full.
    pub dropped: u64,
    /// Datagrams not sent: no frame free, or no hardware address known for the peer.
    pub unsent: u64,
}

impl std::fmt::Debug for Station {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Station").field("ifname", &self.ifname).field("ip", &self.ip).field("mode", &self.mode).finish()
    }
}

thread_local! {
    /// Batches this thread has open ([`Station::batch`]), and whether a frame waits to be sent.
    static BATCH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    static KICK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Datagrams sent together ([`Station::batch`]): the kernel is told to send them when the last
/// batch of the thread is dropped.
pub struct Batch<'s> {
    station: &'s Station,
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        let depth = BATCH.get().saturating_sub(1);
        BATCH.set(depth);
        if depth == 0 && KICK.replace(false) {
            let _ = lock(&self.station.io).xsks[0].kick();
        }
    }
}

/// The stations open in this process, by interface.
static STATIONS: Mutex<Vec<(String, Weak<Station>)>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Station {
    /// The station of interface `ifname` (of this thread's network namespace): the one this process
    /// has open, or a new one (the program attached, a socket bound to each of its receive queues,
    /// 64 at most, `MAX_QUEUES`: an interface with more has none). Root, or `CAP_NET_ADMIN`,
    /// `CAP_NET_RAW` and `CAP_BPF`, is needed; another process's XDP program on the interface makes
    /// it fail. Stations are known by the interface's name: the threads of one
    /// process in different network namespaces must not use interfaces of the same name.
    pub fn on(ifname: &str) -> io::Result<Arc<Station>> {
        let mut open = lock(&STATIONS);
        open.retain(|(_, s)| s.strong_count() > 0);
        if let Some(station) = open.iter().find(|(name, _)| name == ifname).and_then(|(_, s)| s.upgrade()) {
            return Ok(station);
        }
        let ip = interface_ipv4(ifname)?;
        let mac = super::mac_of(ifname)?;
        let max_payload = super::mtu_of(ifname)?.saturating_sub(28).min(FRAME_PAYLOAD);
        let queues = super::rx_queues(ifname)?;
        if queues > MAX_QUEUES {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{ifname} has {queues} receive queues; a station reads at most {MAX_QUEUES}"),
            ));
        }
        let mut steering = Steering::attach(ifname)?;
        let mut xsks = Vec::with_capacity(queues as usize);
        for queue in 0..queues {
            let frames = if queue == 0 { super::FRAMES } else { super::receiving_frames(queues - 1) };
            xsks.push(Xsk::bind(&mut steering, queue, frames)?);
        }
        let fds: Vec<i32> = xsks.iter().map(AsRawFd::as_raw_fd).collect();
        let bell =
            rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)?;
        let polled = fds.iter().copied().chain([bell.as_raw_fd()]).collect();
        let station = Arc::new(Station {
            ifname: ifname.to_owned(),
            ip,
            mac,
            max_payload,
            mode: steering.mode(),
            fds,
            polled,
            bell,
            io: Mutex::new(Io {
                xsks,
                neighbors: HashMap::with_hasher(BuildIpHasher),
                last: None,
                #[cfg(feature = "fault-injection")]
                held: Vec::new(),
            }),
            post: Mutex::new(Post::default()),
            letters: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            ready: Condvar::new(),
            stats: Counters::default(),
            steering: Mutex::new(steering),
        });
        open.push((ifname.to_owned(), Arc::downgrade(&station)));
        Ok(station)
    }

    /// The station of the interface that holds the address `local`.
    pub fn holding(local: Ipv4Addr) -> io::Result<Arc<Station>> {
        match super::interface_of(local)? {
            Some(ifname) => Station::on(&ifname),
            None => Err(io::Error::new(io::ErrorKind::NotFound, format!("no interface holds {local}"))),
        }
    }

    /// The interface's name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The interface's IPv4 address (the first one it has).
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The longest UDP payload one frame carries: the interface's MTU less the IPv4 and UDP
    /// headers, at most what a UMEM frame holds.
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// Where the program runs.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The receive queues read, a socket on each.
    pub fn queues(&self) -> usize {
        self.fds.len()
    }

    /// The counters as they stand.
    pub fn stats(&self) -> StationStats {
        let c = &self.stats;
        StationStats {
            received: c.received.load(Ordering::Relaxed),
            sent: c.sent.load(Ordering::Relaxed),
            malformed: c.malformed.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            unsent: c.unsent.load(Ordering::Relaxed),
        }
    }

    /// Steers the datagrams addressed to `port` here; [`Station::recv`] of `port` reads them. The
    /// port should be held by a kernel socket of the caller's (so that no one else takes it), which
    /// then sees only what arrives on other interfaces.
    pub fn open_port(&self, port: u16) -> io::Result<()> {
        lock(&self.post).mailboxes.entry(port).or_default();
        let steered = lock(&self.steering).steer_port(port);
        if steered.is_err() {
            lock(&self.post).mailboxes.remove(&port);
        }
        steered
    }

    /// Gives `port`'s datagrams back to the kernel, and drops those kept for it.
    pub fn close_port(&self, port: u16) {
        let _ = lock(&self.steering).unsteer_port(port);
        if let Some(kept) = lock(&self.post).mailboxes.remove(&port) {
            self.letters.fetch_sub(kept.letters.len(), Ordering::Relaxed);
        }
    }

    /// Sends a datagram from `port` to `to` made of `parts`, one after another. Its frame goes to the
    /// hardware address learned for `to` from its frames; or, unless `heard_only`, to the kernel's
    /// neighbor table's for the next hop toward it (`to` on the link, else the gateway of its route
    /// out of this interface, [`super::next_hop`]). `NotFound` when there is none (no route, a hop
    /// the kernel has not resolved, or with `heard_only` a peer never heard here), and
    /// `InvalidInput` for a datagram longer than one frame carries ([`Station::max_payload`]), both
    /// before anything is sent: the caller may send it another way. `WouldBlock` when no frame is
    /// free (a lost datagram, to the protocol).
    pub fn send(&self, port: u16, to: SocketAddrV4, parts: &[&[u8]], heard_only: bool) -> io::Result<usize> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > self.max_payload {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a datagram longer than one frame carries"));
        }
        let mut io = lock(&self.io);
        let key = u32::from(*to.ip());
        let mac = match io.neighbors.get(&key) {
            Some(n) if n.heard || !heard_only => n.mac,
            Some(_) => return Err(io::Error::from(io::ErrorKind::NotFound)),
            None if heard_only => return Err(io::Error::from(io::ErrorKind::NotFound)),
            None => match self.resolve(*to.ip()) {
                Ok(mac) => {
                    if io.neighbors.len() < NEIGHBORS {
                        io.neighbors.insert(key, Neighbor { mac, heard: false });
                    }
                    mac
                }
                Err(e) => {
                    self.stats.unsent.fetch_add(1, Ordering::Relaxed);
                    return Err(e);
                }
            },
        };
        let template = match &io.last {
            Some((p, t, m, template)) if (*p, *t, *m) == (port, to, mac) => template,
            _ => {
                let template = Template::new(self.mac, SocketAddrV4::new(self.ip, port), mac, to);
                &io.last.insert((port, to, mac, template)).3
            }
        };
        let Some(headers) = template.headers(len) else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a datagram too long for IPv4"));
        };
        let mut all: [&[u8]; 16] = [&[]; 16];
        if parts.len() + 1 > all.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a datagram of too many parts"));
        }
        all[0] = &headers;
        all[1..=parts.len()].copy_from_slice(parts);
        #[cfg(feature = "fault-injection")]
        if let Some(sent) = faulty(&mut io, &all[..=parts.len()]) {
            return sent.map(|()| len);
        }
        let queued = if BATCH.get() > 0 {
            let queued = io.xsks[0].queue_parts(&all[..=parts.len()])?;
            KICK.set(KICK.get() || queued);
            queued
        } else {
            io.xsks[0].send_parts(&all[..=parts.len()])?
        };
        if queued {
            self.stats.sent.fetch_add(1, Ordering::Relaxed);
            Ok(len)
        } else {
            self.stats.unsent.fetch_add(1, Ordering::Relaxed);
            Err(io::Error::from(io::ErrorKind::WouldBlock))
        }
    }

    /// The hardware address of the next hop toward `ip` in the kernel's neighbor table: `NotFound`
    /// (saying why) when the kernel has no route to `ip` out of this interface, or has not resolved
    /// the hop.
    pub fn resolve(&self, ip: Ipv4Addr) -> io::Result<[u8; 6]> {
        let not_found = |why: String| io::Error::new(io::ErrorKind::NotFound, why);
        let hop = super::next_hop(&self.ifname, ip)
            .map_err(|e| not_found(format!("no route to {ip} out of {}: {e}", self.ifname)))?;
        match super::neighbor(&self.ifname, hop)? {
            Some(mac) => Ok(mac),
            None if hop == ip => Err(not_found(format!("no hardware address known for {ip} on {}", self.ifname))),
            None => Err(not_found(format!(
                "no hardware address known for {hop}, the router on {} on the way to {ip}",
                self.ifname
            ))),
        }
    }

    /// Sends the datagrams this thread sends through any station until the batch is dropped with
    /// one word to the kernel (a `sendto` for each 32 of them) rather than one each: for the
    /// fragments of a message, sent in a burst.
    pub fn batch(&self) -> Batch<'_> {
        BATCH.set(BATCH.get() + 1);
        Batch { station: self }
    }

    /// Reads the next datagram for `port` into `buf`, without waiting: its length and sender. The
    /// queues are read in turn, each until it is empty or holds the datagram; datagrams for other
    /// ports read on the way go to their mailboxes, and their readers are woken.
    pub fn recv(&self, port: u16, buf: &mut [u8]) -> Option<(usize, SocketAddrV4)> {
        if self.letters.load(Ordering::Relaxed) > 0 {
            if let Some(got) = self.take_letter(port, buf) {
                return Some(got);
            }
        }
        let mut io = lock(&self.io);
        let (mut posted, mut got) = (false, None);
        let Io { xsks, neighbors, .. } = &mut *io;
        for xsk in xsks.iter_mut() {
            while got.is_none() {
                let read = xsk.recv(|f| match self.sort(f, neighbors, port, buf) {
                    Sorted::Ours(datagram) => got = Some(datagram),
                    Sorted::Posted => posted = true,
                    Sorted::Dropped => {}
                });
                if read.is_none() {
                    break;
                }
            }
        }
        drop(io);
        if posted && self.sleepers.load(Ordering::Relaxed) > 0 {
            self.ready.notify_all();
        }
        got
    }

    /// Takes in a frame read by the reader of `port`: learns its sender's hardware address, and
    /// copies a datagram for `port` into `buf` or leaves one for another port in its mailbox.
    fn sort(
        &self,
        f: &[u8],
        neighbors: &mut HashMap<u32, Neighbor, BuildIpHasher>,
        port: u16,
        buf: &mut [u8],
    ) -> Sorted {
        let Some(d) = frame::parse(f) else {
            self.stats.malformed.fetch_add(1, Ordering::Relaxed);
            return Sorted::Dropped;
        };
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        let heard = Neighbor { mac: d.from_mac, heard: true };
        let key = u32::from(*d.from.ip());
        if neighbors.get(&key) != Some(&heard) && (neighbors.len() < NEIGHBORS || neighbors.contains_key(&key)) {
            neighbors.insert(key, heard);
        }
        if d.to.port() != port {
            return if self.post(d.to.port(), d.from, d.payload) { Sorted::Posted } else { Sorted::Dropped };
        }
        match buf.get_mut(..d.payload.len()) {
            Some(to) => {
                tiercel_proto::copy::copy(to, d.payload);
                Sorted::Ours((d.payload.len(), d.from))
            }
            None => {
                self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                Sorted::Dropped
            }
        }
    }

    fn take_letter(&self, port: u16, buf: &mut [u8]) -> Option<(usize, SocketAddrV4)> {
        let mut post = lock(&self.post);
        let (from, bytes) = post.mailboxes.get_mut(&port)?.letters.pop_front()?;
        self.letters.fetch_sub(1, Ordering::Relaxed);
        match buf.get_mut(..bytes.len()) {
            Some(to) => {
                tiercel_proto::copy::copy(to, &bytes);
                Some((bytes.len(), from))
            }
            None => {
                self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Keeps a datagram for `port`'s reader, and wakes its task if it waits; false when it was
    /// dropped.
    fn post(&self, port: u16, from: SocketAddrV4, payload: &[u8]) -> bool {
        let mut post = lock(&self.post);
        match post.mailboxes.get_mut(&port) {
            Some(mailbox) if mailbox.letters.len() < MAILBOX => {
                mailbox.letters.push_back((from, payload.to_vec()));
                self.letters.fetch_add(1, Ordering::Relaxed);
                let waiting = mailbox.waker.take();
                if post.thread_polls == Some(port) && !post.rung {
                    // Rung with `post` held, so that the poller, which reads it with `post` held
                    // once it has woken, finds it rung whenever `rung` says so.
                    post.rung = true;
                    let _ = rustix::io::write(&self.bell, &1u64.to_ne_bytes());
                }
                drop(post);
                if let Some(task) = waiting {
                    task.wake();
                }
                true
            }
            _ => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Waits until a datagram may be there for `port` (true), or `timeout` passes (false): one
    /// waiter at a time polls the sockets' descriptors, the others wait to be woken by it or by a
    /// reader that left them a datagram. The one that polls is woken by a datagram left for it
    /// too: a frame for it wakes it, but another reader may take the frame from the ring before
    /// it looks, and it would poll on.
    pub fn wait(&self, port: u16, timeout: Option<Duration>) -> io::Result<bool> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut post = lock(&self.post);
        loop {
            if post.mailboxes.get(&port).is_some_and(|m| !m.letters.is_empty()) {
                return Ok(true);
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Ok(false),
                },
                None => None,
            };
            if !post.polling {
                post.polling = true;
                post.thread_polls = Some(port);
                drop(post);
                let ready = super::poll_readable(&self.polled, left);
                post = lock(&self.post);
                post.thread_polls = None;
                if std::mem::take(&mut post.rung) {
                    let _ = rustix::io::read(&self.bell, &mut [0u8; 8]);
                }
                let task = post.end_turn();
                drop(post);
                self.hand_over(task);
                return ready;
            }
            self.sleepers.fetch_add(1, Ordering::Relaxed);
            post = match left {
                Some(left) => self.ready.wait_timeout(post, left).unwrap_or_else(|p| p.into_inner()).0,
                None => self.ready.wait(post).unwrap_or_else(|p| p.into_inner()),
            };
            self.sleepers.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// After a poller's turn ended: tells the waiting threads, if any, and wakes `task`, if any,
    /// to take the turn.
    fn hand_over(&self, task: Option<Waker>) {
        self.tell_sleepers();
        if let Some(task) = task {
            task.wake();
        }
    }

    fn tell_sleepers(&self) {
        if self.sleepers.load(Ordering::Relaxed) > 0 {
            self.ready.notify_all();
        }
    }

    /// A descriptor that is readable when a socket of the station may hold a frame (an `epoll` set
    /// of them), for a runtime's reactor to wait on: the poller of [`Station::turn`] waits for it.
    /// Each call makes a new one.
    pub fn readiness(&self) -> io::Result<std::os::fd::OwnedFd> {
        super::readiness_set(&self.fds)
    }

    /// For a task that waits for a datagram for `port` without holding its thread: whether one is
    /// in the port's mailbox, or the task polls (no one else does, or `polling`: it already took the
    /// turn), or it waits for another reader. Unless a datagram is there, `task` is woken when one
    /// is left for the port, or when a poller ends its turn ([`Station::done_waiting`], or a
    /// thread's [`Station::wait`]). A task that took the turn polls until it calls
    /// [`Station::done_waiting`], which every task calls when it stops waiting (whether or not it
    /// took the turn), so that no other waiter is left without a poller.
    pub fn turn(&self, port: u16, task: &Waker, polling: bool) -> Turn {
        lock(&self.post).turn(port, task, polling)
    }

    /// A task that waited for `port` ([`Station::turn`]) stops: its waker is forgotten, and if it
    /// `polled`, its turn ends and another waiter (a task or a thread) takes it.
    pub fn done_waiting(&self, port: u16, polled: bool) {
        let task = lock(&self.post).done_waiting(port, polled);
        if polled {
            self.hand_over(task);
        }
    }
}

/// A frame sent through the fault-injection layer (feature `fault-injection`, when installed):
/// dropped, corrupted, sent twice, or held back until the next frame has gone. `None`: no layer.
#[cfg(feature = "fault-injection")]
fn faulty(io: &mut Io, parts: &[&[u8]]) -> Option<io::Result<()>> {
    let mut frame = parts.concat();
    // The headers are left whole: a corrupted frame is one the peer's checks must refuse, not one
    // the program passes to the kernel.
    let (copies, held) = crate::faults::judge(&mut frame[frame::HEADERS..])?;
    if held {
        for _ in 0..copies {
            io.held.push(frame.clone());
        }
        return Some(Ok(()));
    }
    for _ in 0..copies {
        if let Err(e) = io.xsks[0].send(&frame) {
            return Some(Err(e));
        }
    }
    for frame in std::mem::take(&mut io.held) {
        let _ = io.xsks[0].send(&frame);
    }
    Some(Ok(()))
}

/// The first IPv4 address of interface `ifname`.
fn interface_ipv4(ifname: &str) -> io::Result<Ipv4Addr> {
    super::interface_addresses()?
        .into_iter()
        .find(|(name, _)| name == ifname)
        .map(|(_, ip)| ip)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{ifname} has no IPv4 address")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::task::Wake;

    /// A task's waker that counts its wake-ups.
    struct Task(AtomicU32);

    impl Wake for Task {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn task() -> (Arc<Task>, Waker) {
        let t = Arc::new(Task(AtomicU32::new(0)));
        (t.clone(), Waker::from(t))
    }

    fn post(ports: &[u16]) -> Post {
        let mut post = Post::default();
        for &p in ports {
            post.mailboxes.entry(p).or_default();
        }
        post
    }

    fn wake(w: Option<Waker>) {
        if let Some(w) = w {
            w.wake();
        }
    }

    #[test]
    fn one_task_polls_and_hands_the_turn_to_one_that_waits_when_it_stops() {
        let mut post = post(&[1, 2, 3]);
        let ((a, wa), (b, wb), (c, wc)) = (task(), task(), task());
        assert_eq!(post.turn(1, &wa, false), Turn::Poll);
        assert_eq!(post.turn(2, &wb, false), Turn::Wait);
        assert_eq!(post.turn(3, &wc, false), Turn::Wait);
        // The poller looks again while it polls: still its turn.
        assert_eq!(post.turn(1, &wa, true), Turn::Poll);
        wake(post.done_waiting(1, true));
        let woken = b.0.load(Ordering::SeqCst) + c.0.load(Ordering::SeqCst);
        assert_eq!((a.0.load(Ordering::SeqCst), woken), (0, 1), "one waiting task takes the turn");
        let (next, next_port, other, other_port) =
            if b.0.load(Ordering::SeqCst) == 1 { (&wb, 2, &wc, 3) } else { (&wc, 3, &wb, 2) };
        assert_eq!(post.turn(next_port, next, false), Turn::Poll);
        assert_eq!(post.turn(other_port, other, false), Turn::Wait);
    }

    #[test]
    fn a_task_that_stops_waiting_is_not_the_one_woken_to_poll() {
        let mut post = post(&[1, 2, 3]);
        let ((_, wa), (b, wb), (c, wc)) = (task(), task(), task());
        assert_eq!(post.turn(1, &wa, false), Turn::Poll);
        assert_eq!(post.turn(2, &wb, false), Turn::Wait);
        // Task 2's call ended (its future was dropped, or its timer came): it waits no more.
        assert_eq!(post.done_waiting(2, false).map(|_| ()), None);
        assert_eq!(post.turn(3, &wc, false), Turn::Wait);
        wake(post.done_waiting(1, true));
        assert_eq!((b.0.load(Ordering::SeqCst), c.0.load(Ordering::SeqCst)), (0, 1));
    }

    #[test]
    fn a_poller_dropped_leaves_the_turn_free() {
        let mut post = post(&[1, 2]);
        let ((_, wa), (_, wb)) = (task(), task());
        assert_eq!(post.turn(1, &wa, false), Turn::Poll);
        // No one else waits: nobody is woken, and the next to come polls.
        assert!(post.done_waiting(1, true).is_none());
        assert_eq!(post.turn(2, &wb, false), Turn::Poll);
    }

    #[test]
    fn a_letter_wakes_its_task_and_is_read_before_any_turn() {
        let mut post = post(&[1, 2]);
        let ((_, wa), (b, wb)) = (task(), task());
        assert_eq!(post.turn(1, &wa, false), Turn::Poll);
        assert_eq!(post.turn(2, &wb, false), Turn::Wait);
        // What `Station::post` does for the poller's read of a frame for port 2.
        let mailbox = post.mailboxes.get_mut(&2).unwrap();
        mailbox.letters.push_back((SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9), vec![1]));
        wake(mailbox.waker.take());
        assert_eq!(b.0.load(Ordering::SeqCst), 1);
        assert_eq!(post.turn(2, &wb, false), Turn::Letter);
        // A port closed meanwhile: its reader looks, and finds nothing.
        assert_eq!(post.turn(7, &wb, false), Turn::Letter);
    }
}
