//! The raw UDP ping-pong the benchmark measures tiercel against: the same system calls (`sendmsg`,
//! non-blocking `recv`/`recvfrom`, `poll`) with no protocol at all. A request's first four bytes say
//! how long the reply must be.

use std::io::{IoSlice, Write};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use tiercel_sys::udp::{self, Received};

/// How long a spinning echo server goes on spinning without a request before it blocks.
pub const SPIN_WHILE_IDLE: Duration = Duration::from_millis(2);

/// Options of the hidden `tiercel raw-echo`.
#[derive(clap::Args)]
pub struct EchoArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    addr: SocketAddr,
    /// CPU to pin to.
    #[arg(long)]
    cpu: Option<usize>,
    /// Busy-poll instead of blocking in `poll`.
    #[arg(long)]
    spin: bool,
    /// Exit after this many seconds, whatever happens.
    #[arg(long, default_value_t = 900)]
    max_seconds: u64,
}

pub fn echo(args: EchoArgs) -> crate::Result<()> {
    if let Some(cpu) = args.cpu {
        tiercel_sys::cpu::pin_current_thread(cpu).map_err(|e| e.to_string())?;
    }
    let socket = udp::bind(args.addr, false).map_err(|e| e.to_string())?;
    println!("listening udp://{}", socket.local_addr().map_err(|e| e.to_string())?);
    let _ = std::io::stdout().flush();
    let reply = vec![0x5au8; tiercel::config::MAX_UDP_PAYLOAD];
    let mut rx = vec![0u8; tiercel::config::MAX_UDP_PAYLOAD];
    let end = Instant::now() + Duration::from_secs(args.max_seconds);
    let mut idle_checks = 0u32;
    let mut last = Instant::now();
    loop {
        match udp::recv_from_nowait(&socket, &mut rx).map_err(|e| e.to_string())? {
            Some((Received::Datagram(n), from)) if n >= 4 => {
                let want = u32::from_le_bytes([rx[0], rx[1], rx[2], rx[3]]) as usize;
                let _ = udp::send_gather_to(&socket, &from, &[IoSlice::new(&reply[..want.min(reply.len())])]);
                idle_checks = 0;
                continue;
            }
            Some(_) => continue,
            None => {}
        }
        idle_checks = idle_checks.wrapping_add(1);
        if idle_checks.is_multiple_of(4096) {
            let now = Instant::now();
            if now > end {
                return Ok(());
            }
            if idle_checks == 4096 {
                last = now;
            }
        }
        // Spin while calls come; after 2 ms without one (the benchmark measuring the other side),
        // block, so as not to take the CPU from the server measured next.
        if args.spin && (idle_checks < 4096 || last.elapsed() < SPIN_WHILE_IDLE) {
            core::hint::spin_loop();
        } else {
            let _ = udp::wait_readable(&socket, Some(Duration::from_millis(100)));
        }
    }
}

/// The client side of the raw ping-pong.
pub struct PingPong {
    socket: UdpSocket,
    request: Vec<u8>,
    rx: Vec<u8>,
    spin: bool,
}

impl PingPong {
    pub fn new(server: SocketAddr, request_len: usize, reply_len: usize, spin: bool) -> crate::Result<PingPong> {
        let socket = udp::connect(server).map_err(|e| e.to_string())?;
        let mut request = vec![0u8; request_len.max(4)];
        request[..4].copy_from_slice(&(reply_len as u32).to_le_bytes());
        Ok(PingPong { socket, request, rx: vec![0; tiercel::config::MAX_UDP_PAYLOAD], spin })
    }

    /// One round trip; false if the reply did not come within a second (a lost packet).
    pub fn round_trip(&mut self) -> crate::Result<bool> {
        udp::send_gather(&self.socket, &[IoSlice::new(&self.request)]).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            if let Received::Datagram(_) = udp::recv_nowait(&self.socket, &mut self.rx).map_err(|e| e.to_string())? {
                return Ok(true);
            }
            if self.spin {
                core::hint::spin_loop();
                if Instant::now() > deadline {
                    return Ok(false);
                }
            } else if !udp::wait_readable(&self.socket, Some(Duration::from_secs(1))).map_err(|e| e.to_string())? {
                return Ok(false);
            }
        }
    }
}
