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
        let mut request = vec![0u8; 8 + request_len];
        request[..4].copy_from_slice(&(reply_len as u32).to_le_bytes());
        request[4..8].copy_from_slice(&(request_len as u32).to_le_bytes());
        Ok(TcpPingPong { stream, request, reply: vec![0; reply_len], spin, stamps: None })
    }

    /// One round trip; false if the echo went away.
    pub fn round_trip(&mut self) -> crate::Result<bool> {
        write_all(&mut self.stream, &self.request).map_err(crate::Error::from)?;
        read_full(&mut self.stream, &mut self.reply, self.spin, Some(Duration::from_secs(10)))
            .map_err(crate::Error::from)
    }
}
