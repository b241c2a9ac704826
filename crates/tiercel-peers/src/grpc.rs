//! tonic: the gRPC service of `proto/peer.proto` over HTTP/2, one channel shared by every caller;
//! plain, or over TLS 1.3 with rustls.

use std::net::SocketAddr;

use tonic::{Request, Response, Status};

use crate::Error;

mod proto {
    tonic::include_proto!("peer");
}

use proto::peer_client::PeerClient;
use proto::peer_server::{Peer, PeerServer};
use proto::{Data, Empty, Size};

pub type Client = PeerClient<tonic::transport::Channel>;

struct Server;

#[tonic::async_trait]
impl Peer for Server {
    async fn null(&self, _: Request<Empty>) -> Result<Response<Empty>, Status> {
        Ok(Response::new(Empty {}))
    }
    async fn max_result(&self, r: Request<Size>) -> Result<Response<Data>, Status> {
        Ok(Response::new(Data { data: crate::result_of(r.into_inner().len) }))
    }
}

/// The server's certificate (self-signed, for `localhost` and 127.0.0.1, valid until 2126) and its
/// key: a fixed pair of the benchmark's, never a secret of anyone's.
const CERT: &str = include_str!("../tls/cert.pem");
const KEY: &str = include_str!("../tls/key.pem");

pub(crate) async fn serve(listener: tokio::net::TcpListener, tls: bool) -> Result<(), Error> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut builder = tonic::transport::Server::builder();
    if tls {
        let identity = tonic::transport::Identity::from_pem(CERT, KEY);
        builder = builder.tls_config(tonic::transport::ServerTlsConfig::new().identity(identity)).map_err(Error::of)?;
    }
    builder.add_service(PeerServer::new(Server)).serve_with_incoming(incoming).await.map_err(Error::of)
}

pub(crate) async fn connect(addr: SocketAddr, tls: bool) -> Result<Client, Error> {
    if !tls {
        return PeerClient::connect(format!("http://{addr}")).await.map_err(Error::of);
    }
    let config = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(CERT))
        .domain_name("localhost");
    let endpoint = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .map_err(Error::of)?
        .tls_config(config)
        .map_err(Error::of)?;
    endpoint.connect().await.map(PeerClient::new).map_err(Error::of)
}

pub(crate) async fn null(c: &mut Client) -> Result<(), Error> {
    c.null(Empty {}).await.map(drop).map_err(Error::of)
}

pub(crate) async fn max_result(c: &mut Client, len: u32) -> Result<usize, Error> {
    c.max_result(Size { len }).await.map(|r| r.into_inner().data.len()).map_err(Error::of)
}
