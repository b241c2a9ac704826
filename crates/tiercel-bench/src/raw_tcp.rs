//! The raw TCP ping-pong among the benchmark's baselines: one loopback connection with `TCP_NODELAY`,
//! a request of an 8-byte header (reply length, request length) and its payload, a reply of the
//! asked length (up to 16 MiB and a little more, for the large calls of Peregrine's Table 5); both
//! sides busy-poll non-blocking reads, or block in them. A spinning echo server
//! blocks after 2 ms without a request (as the raw UDP one does), leaving the CPU to the server
//! measured next; it serves each connection on a thread of its own.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Largest request or reply: tiercel's largest message and room for a header.
const MAX: usize = (16 << 20) + 1024;

/// Options of the `raw-tcp-echo` helper role.
#[derive(clap::Args)]
pub struct EchoArgs {
    /// CPU to pin to.
    #[arg(long)]
    cpu: Option<usize>,
    /// Busy-poll non-blocking reads instead of blocking in them.
    #[arg(long)]
    spin: bool,
}

/// Reads exactly `buf.len()` bytes; false if the peer closed first or (with `patience`) nothing
/// came for that long. Spinning, it blocks after [`crate::raw::SPIN_WHILE_IDLE`] without a byte.
fn read_full(stream: &mut TcpStream, buf: &mut [u8], spin: bool, patience: Option<Duration>) -> std::io::Result<bool> {
    let mut at = 0;
    let mut polls = 0u32;
    let mut since = None;
    while at < buf.len() {
        match stream.read(&mut buf[at..]) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                at += n;
                (polls, since) = (0, None);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock && spin => {
                polls = polls.wrapping_add(1);
                if polls.is_multiple_of(4096) {
                    let idle = since.get_or_insert_with(Instant::now).elapsed();
                    if patience.is_some_and(|p| idle > p) {
                        return Ok(false);
                    }
                    if idle > crate::raw::SPIN_WHILE_IDLE {
                        let _ = tiercel_sys::udp::wait_readable_fd(&*stream, Some(Duration::from_millis(100)));
                        continue;
                    }
                }
                core::hint::spin_loop();
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn write_all(stream: &mut TcpStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match stream.write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => core::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Serves connections, each on its own thread until its client closes it, until killed.
pub fn echo(args: EchoArgs) -> crate::Result<()> {
    if let Some(cpu) = args.cpu {
        tiercel_sys::cpu::pin_current_thread(cpu).map_err(crate::Error::from)?;
    }
    let listener = TcpListener::bind("127.0.0.1:0").map_err(crate::Error::from)?;
    println!("listening tcp://{}", listener.local_addr().map_err(crate::Error::from)?);
    let _ = std::io::stdout().flush();
    loop {
        let (stream, _) = listener.accept().map_err(crate::Error::from)?;
        let (spin, cpu) = (args.spin, args.cpu);
        std::thread::spawn(move || {
            if let Some(cpu) = cpu {
                let _ = tiercel_sys::cpu::pin_current_thread(cpu);
            }
            let _ = serve_connection(stream, spin);
        });
    }
}

fn serve_connection(mut stream: TcpStream, spin: bool) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_nonblocking(spin)?;
    // Grown to the largest request and reply seen, before the timed round trips.
    let (mut reply, mut request) = (Vec::new(), Vec::new());
    let mut header = [0u8; 8];
    loop {
        if !read_full(&mut stream, &mut header, spin, None)? {
            return Ok(());
        }
        let want = (u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize).min(MAX);
        let len = (u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize).min(MAX);
        if reply.len() < want {
            reply.resize(want, 0x5a);
        }
        if request.len() < len {
            request.resize(len, 0);
        }
        if !read_full(&mut stream, &mut request[..len], spin, None)? {
            return Ok(());
        }
        write_all(&mut stream, &reply[..want])?;
    }
}

/// The client side of the raw TCP ping-pong.
pub struct TcpPingPong {
    stream: TcpStream,
    request: Vec<u8>,
    reply: Vec<u8>,
    /// The request's and the reply's payload bytes of [`TcpPingPong::round_trip`].
    sizes: (usize, usize),
    spin: bool,
    /// Never summed step by step (the breakdowns are of UDP and shared memory).
    pub stamps: Option<crate::raw::Stamps>,
}

impl TcpPingPong {
    /// `request_len` payload bytes one way, `reply_len` the other.
    pub fn new(server: SocketAddr, request_len: usize, reply_len: usize, spin: bool) -> crate::Result<TcpPingPong> {
        let stream = TcpStream::connect(server).map_err(|e| format!("connecting to {server}: {e}"))?;
        stream.set_nodelay(true).and_then(|()| stream.set_nonblocking(spin)).map_err(crate::Error::from)?;
        let (request_len, reply_len) = (request_len.min(MAX), reply_len.min(MAX));
        let (request, reply) = (vec![0u8; 8 + request_len], vec![0; reply_len]);
        Ok(TcpPingPong { stream, request, reply, sizes: (request_len, reply_len), spin, stamps: None })
    }

    /// One round trip of the sizes it was made with; false if the echo went away.
    pub fn round_trip(&mut self) -> crate::Result<bool> {
        self.round_trip_of(self.sizes.0, self.sizes.1)
    }

    /// One round trip of `request_len` payload bytes out and `reply_len` back on the same
    /// connection, whatever sizes it was made with (so one connection, and one thread of the echo,
    /// can alternate sizes as one binding's calls do); false if the echo went away. The buffers grow
    /// to the largest sizes asked, once.
    pub fn round_trip_of(&mut self, request_len: usize, reply_len: usize) -> crate::Result<bool> {
        let (request_len, reply_len) = (request_len.min(MAX), reply_len.min(MAX));
        if self.request.len() < 8 + request_len {
            self.request.resize(8 + request_len, 0);
        }
        if self.reply.len() < reply_len {
            self.reply.resize(reply_len, 0);
        }
        self.request[..4].copy_from_slice(&(reply_len as u32).to_le_bytes());
        self.request[4..8].copy_from_slice(&(request_len as u32).to_le_bytes());
        write_all(&mut self.stream, &self.request[..8 + request_len]).map_err(crate::Error::from)?;
        read_full(&mut self.stream, &mut self.reply[..reply_len], self.spin, Some(Duration::from_secs(10)))
            .map_err(crate::Error::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blocking echo on loopback in a thread of its own, serving connections as `echo` does.
    fn echo_thread() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let stream = stream.unwrap();
                std::thread::spawn(move || serve_connection(stream, false));
            }
        });
        addr
    }

    #[test]
    fn one_connection_alternates_sizes_and_each_reply_is_as_long_as_asked() {
        let mut ping = TcpPingPong::new(echo_thread(), 16, 16, false).unwrap();
        for (request, reply) in [(16, 16), (20, 1456), (16, 16), (0, 70_000), (16, 16)] {
            assert!(ping.round_trip_of(request, reply).unwrap());
            // Nothing more is on the way: the next round trip's reply is its own, all of it.
            assert!(ping.round_trip_of(4, 3).unwrap());
            assert_eq!(&ping.reply[..3], &[0x5a; 3]);
        }
        // The sizes it was made with are still those of a plain round trip.
        assert!(ping.round_trip().unwrap());
        assert!(ping.round_trip_of(4, 3).unwrap());
        assert!(ping.round_trip().unwrap());
    }
}
