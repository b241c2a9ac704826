//! tonic: the gRPC service of `proto/peer.proto` over HTTP/2, one channel shared by every caller.

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

pub(crate) async fn serve(listener: tokio::net::TcpListener) -> Result<(), Error> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(PeerServer::new(Server))
        .serve_with_incoming(incoming)
        .await
        .map_err(Error::of)
}

pub(crate) async fn connect(addr: SocketAddr) -> Result<Client, Error> {
    PeerClient::connect(format!("http://{addr}")).await.map_err(Error::of)
}

pub(crate) async fn null(c: &mut Client) -> Result<(), Error> {
    c.null(Empty {}).await.map(drop).map_err(Error::of)
}

pub(crate) async fn max_result(c: &mut Client, len: u32) -> Result<usize, Error> {
    c.max_result(Size { len }).await.map(|r| r.into_inner().data.len()).map_err(Error::of)
}
