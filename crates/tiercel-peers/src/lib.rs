//! The RPC systems users would pick instead of tiercel, serving the same two procedures (Null, and
//! MaxResult: a result of a given size) so that `tiercel bench --peers` measures them in the same
//! run as tiercel, with the same pinning and process split: tarpc (bincode over TCP), tonic (gRPC over
//! HTTP/2, plain and over TLS) and a raw tokio TCP echo (a length-prefixed frame each way, no RPC at all). Each runs on
//! its default runtime: tokio's multi-thread runtime, built on the thread that serves or calls, so
//! that its workers inherit that thread's CPU pinning.
//!
//! This crate is a dependency of the benchmarks only, never of the library.

#![forbid(unsafe_code)]

use std::net::SocketAddr;

mod echo;
mod grpc;
mod rpc;

/// A peer system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// tarpc 0.38, bincode over TCP.
    Tarpc,
    /// tonic 0.14, gRPC over HTTP/2 on TCP.
    Tonic,
    /// tonic 0.14, gRPC over HTTP/2 on TLS 1.3 (rustls, ring) on TCP: the server's certificate is
    /// a fixed self-signed one for `localhost` (`tls/`), which the client trusts alone.
    TonicTls,
    /// A raw tokio TCP echo: a 4-byte length and the payload each way, one connection per caller.
    Echo,
}

impl Peer {
    /// Every peer.
    pub const ALL: [Peer; 4] = [Peer::Tarpc, Peer::Tonic, Peer::TonicTls, Peer::Echo];

    /// Its name on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Peer::Tarpc => "tarpc",
            Peer::Tonic => "tonic",
            Peer::TonicTls => "tonic tls",
            Peer::Echo => "tokio echo",
        }
    }

    /// Its name as an argument: `tarpc`, `tonic`, `tonic-tls` or `echo`.
    pub fn key(self) -> &'static str {
        match self {
            Peer::Tarpc => "tarpc",
            Peer::Tonic => "tonic",
            Peer::TonicTls => "tonic-tls",
            Peer::Echo => "echo",
        }
    }

    /// The peer named `name` (as [`Peer::name`] or [`Peer::key`]).
    pub fn from_name(name: &str) -> Option<Peer> {
        match name {
            "tarpc" => Some(Peer::Tarpc),
            "tonic" => Some(Peer::Tonic),
            "tonic-tls" | "tonic tls" => Some(Peer::TonicTls),
            "echo" | "tokio echo" => Some(Peer::Echo),
            _ => None,
        }
    }
}

/// An error of a peer: its own, as text.
#[derive(Debug)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl Error {
    fn of(e: impl std::fmt::Display) -> Error {
        Error(e.to_string())
    }
}

/// Serves `peer` on `listener` until the process ends, on a tokio multi-thread runtime built here
/// (its workers inherit this thread's CPU affinity).
pub fn serve(peer: Peer, listener: std::net::TcpListener) -> Result<(), Error> {
    listener.set_nonblocking(true).map_err(Error::of)?;
    let rt = tokio::runtime::Runtime::new().map_err(Error::of)?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener).map_err(Error::of)?;
        match peer {
            Peer::Tarpc => rpc::serve(listener).await,
            Peer::Tonic => grpc::serve(listener, false).await,
            Peer::TonicTls => grpc::serve(listener, true).await,
            Peer::Echo => echo::serve(listener).await,
        }
    })
}

/// A client of a peer at one address, for many tasks at once (tarpc and tonic share one connection,
/// as their clients do when cloned; the echo opens one connection per [`Client::caller`]).
#[derive(Clone)]
pub enum Client {
    Tarpc(rpc::Client),
    Tonic(grpc::Client),
    Echo(SocketAddr),
}

/// One caller's handle: calls one at a time.
pub enum Caller {
    Tarpc(rpc::Client),
    Tonic(grpc::Client),
    Echo(echo::Connection),
}

impl Client {
    /// Connects to `peer` at `addr` (from inside a tokio runtime).
    pub async fn connect(peer: Peer, addr: SocketAddr) -> Result<Client, Error> {
        Ok(match peer {
            Peer::Tarpc => Client::Tarpc(rpc::connect(addr).await?),
            Peer::Tonic => Client::Tonic(grpc::connect(addr, false).await?),
            Peer::TonicTls => Client::Tonic(grpc::connect(addr, true).await?),
            Peer::Echo => Client::Echo(addr),
        })
    }

    /// A handle for one caller.
    pub async fn caller(&self) -> Result<Caller, Error> {
        Ok(match self {
            Client::Tarpc(c) => Caller::Tarpc(c.clone()),
            Client::Tonic(c) => Caller::Tonic(c.clone()),
            Client::Echo(addr) => Caller::Echo(echo::Connection::open(*addr).await?),
        })
    }
}

impl Caller {
    /// Null: no argument, no result.
    pub async fn null(&mut self) -> Result<(), Error> {
        match self {
            Caller::Tarpc(c) => rpc::null(c).await,
            Caller::Tonic(c) => grpc::null(c).await,
            Caller::Echo(c) => c.exchange(0).await.map(drop),
        }
    }

    /// MaxResult: a result of `len` bytes; returns how many came.
    pub async fn max_result(&mut self, len: u32) -> Result<usize, Error> {
        match self {
            Caller::Tarpc(c) => rpc::max_result(c, len).await,
            Caller::Tonic(c) => grpc::max_result(c, len).await,
            Caller::Echo(c) => c.exchange(len).await,
        }
    }
}

/// The bytes of a MaxResult result of `len` bytes.
fn result_of(len: u32) -> Vec<u8> {
    (0..len).map(|i| i as u8).collect()
}
