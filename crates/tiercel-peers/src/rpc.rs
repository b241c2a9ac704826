//! tarpc: a service of two procedures, bincode over TCP, each request answered on its own task.

use std::net::SocketAddr;

use futures::prelude::*;
use tarpc::server::{BaseChannel, Channel};
use tarpc::tokio_serde::formats::Bincode;
use tarpc::{client, context, serde_transport::tcp};

use crate::Error;

#[tarpc::service]
pub trait Peer {
    async fn null();
    async fn max_result(len: u32) -> Vec<u8>;
}

#[derive(Clone)]
struct Server;

impl Peer for Server {
    async fn null(self, _: context::Context) {}
    async fn max_result(self, _: context::Context, len: u32) -> Vec<u8> {
        crate::result_of(len)
    }
}

pub type Client = PeerClient;

pub(crate) async fn serve(listener: tokio::net::TcpListener) -> Result<(), Error> {
    let mut incoming = tcp::listen_on(listener, Bincode::default).await.map_err(Error::of)?;
    while let Some(transport) = incoming.next().await {
        let Ok(transport) = transport else { continue };
        tokio::spawn(BaseChannel::with_defaults(transport).execute(Server.serve()).for_each(|response| async move {
            tokio::spawn(response);
        }));
    }
    Ok(())
}

pub(crate) async fn connect(addr: SocketAddr) -> Result<Client, Error> {
    let transport = tcp::connect(addr, Bincode::default).await.map_err(Error::of)?;
    Ok(PeerClient::new(client::Config::default(), transport).spawn())
}

pub(crate) async fn null(c: &Client) -> Result<(), Error> {
    c.null(context::current()).await.map_err(Error::of)
}

pub(crate) async fn max_result(c: &Client, len: u32) -> Result<usize, Error> {
    c.max_result(context::current(), len).await.map(|r| r.len()).map_err(Error::of)
}
