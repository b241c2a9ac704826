//! What the TCP tests share: a server of `Test`, a client of it over TCP, and raw connections.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use tiercel::{Client, Server, Transport};
use tiercel_seeds::{SeedTest, TestClient, TestServer};

pub fn serve() -> tiercel::RunningServer {
    Server::bind("127.0.0.1:0").unwrap().export(TestServer::new(SeedTest)).start().unwrap()
}

pub fn tcp(server: &tiercel::RunningServer) -> TestClient {
    let client: TestClient = Client::connect(format!("tcp://{}", server.addr()))
        .unwrap()
        .import()
        .unwrap_or_else(|e| panic!("{e}: {}", server.stats()));
    assert_eq!(client.binding().transport(), Transport::Tcp);
    client
}

/// A raw connection to the server's TCP port.
pub fn raw(server: &tiercel::RunningServer) -> TcpStream {
    let s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// A raw connection to the server's TCP port from the loopback address `from` (127.0.0.2, say).
pub fn raw_from(server: &tiercel::RunningServer, from: std::net::IpAddr) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.bind(&std::net::SocketAddr::new(from, 0).into()).unwrap();
    socket.connect(&server.addr().into()).unwrap();
    let s: TcpStream = socket.into();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Binds over a raw connection, as a client of `Test` that then does what it likes.
pub fn bind_raw(server: &tiercel::RunningServer) -> (TcpStream, tiercel_proto::bind::Granted) {
    bind_over(raw(server))
}

/// Binds over the raw connection `s`, as [`bind_raw`] does.
pub fn bind_over(mut s: TcpStream) -> (TcpStream, tiercel_proto::bind::Granted) {
    use tiercel_proto::bind::{BindClient, BindEvent};
    let info = <TestClient as tiercel::Import>::INFO;
    let mut machine = BindClient::new(&tiercel_seeds::bind_spec(info), 0, 7, false);
    let request = machine.packet();
    s.write_all(&tiercel_proto::stream::prefix(request.len())).unwrap();
    s.write_all(&request).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut answer = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut answer).unwrap();
    let p = tiercel_proto::wire::Packet::new_checked(&answer[..]).unwrap();
    match machine.handle(&p, None) {
        BindEvent::Granted(g) => (s, g),
        other => panic!("{other:?}"),
    }
}
