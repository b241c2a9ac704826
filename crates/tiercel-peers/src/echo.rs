//! A raw tokio TCP echo: the floor under the TCP peers. A request is a 4-byte little-endian length
//! (of the answer asked for) and the answer that many bytes behind its own 4-byte length; one task
//! per connection, `TCP_NODELAY`.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::Error;

/// Largest answer asked for.
const MAX_ANSWER: u32 = 1 << 20;

pub(crate) async fn serve(listener: tokio::net::TcpListener) -> Result<(), Error> {
    loop {
        let (stream, _) = listener.accept().await.map_err(Error::of)?;
        tokio::spawn(async move {
            let _ = answer(stream).await;
        });
    }
}

async fn answer(mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut out = Vec::new();
    loop {
        let mut ask = [0u8; 4];
        stream.read_exact(&mut ask).await?;
        let len = u32::from_le_bytes(ask).min(MAX_ANSWER);
        out.clear();
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&crate::result_of(len));
        stream.write_all(&out).await?;
    }
}

/// One caller's connection.
pub struct Connection {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Connection {
    pub(crate) async fn open(addr: SocketAddr) -> Result<Connection, Error> {
        let stream = TcpStream::connect(addr).await.map_err(Error::of)?;
        stream.set_nodelay(true).map_err(Error::of)?;
        Ok(Connection { stream, buf: Vec::new() })
    }

    /// Asks for `len` bytes and reads them; returns how many came.
    pub(crate) async fn exchange(&mut self, len: u32) -> Result<usize, Error> {
        self.stream.write_all(&len.to_le_bytes()).await.map_err(Error::of)?;
        let mut head = [0u8; 4];
        self.stream.read_exact(&mut head).await.map_err(Error::of)?;
        let n = u32::from_le_bytes(head).min(MAX_ANSWER) as usize;
        self.buf.resize(n, 0);
        self.stream.read_exact(&mut self.buf).await.map_err(Error::of)?;
        Ok(n)
    }
}
