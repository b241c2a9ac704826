//! Keys pinned on first use (`ClientConfig::known_servers`): what a bind or a listing does with
//! them.

use std::net::SocketAddr;

use super::{tcp, udp_bind, Client};
use crate::config::ClientConfig;
use crate::{BindError, KeyChange, KnownServers, PublicKey};

impl Client {
    /// Does `act` (a bind, a listing) with the server at `server`, an exporter of `target` (an
    /// address as `127.0.0.1:7392`, a name as `name:calc`) under the key pinned for `target`; the
    /// first time, under `first` (a key a registry vouches for) or the key the server tells, pinned
    /// once `act` succeeded (the server proved it in the handshake).
    pub(super) fn pinned<T>(
        &self,
        known: &KnownServers,
        target: &str,
        server: SocketAddr,
        first: Option<PublicKey>,
        mut config: ClientConfig,
        act: impl FnOnce(ClientConfig) -> Result<T, BindError>,
    ) -> Result<T, BindError> {
        if let Some((pinned, line)) = known.lookup(target)? {
            config.server_key = Some(pinned);
            return match act(config.clone()) {
                // Why, as far as the server tells: its key now (unproven), for the error to show.
                Err(BindError::KeyNotProven(..)) => {
                    let told = self.ask_key(server, &config).ok().flatten();
                    let file = known.path().to_path_buf();
                    let change = KeyChange { target: target.into(), server, pinned, told, file, line };
                    Err(BindError::KeyChanged(Box::new(change)))
                }
                done => done,
            };
        }
        let key = match first {
            Some(key) => key,
            None => self.ask_key(server, &config)?.ok_or(BindError::NoServerKey(server))?,
        };
        config.server_key = Some(key);
        let done = act(config)?;
        // Proven: pinned, unless another client pinned another key for it meanwhile.
        match known.pin(target, &key)? {
            (pinned, _) if pinned == key => Ok(done),
            (pinned, line) => Err(BindError::KeyChanged(Box::new(KeyChange {
                target: target.into(),
                server,
                pinned,
                told: Some(key),
                file: known.path().to_path_buf(),
                line,
            }))),
        }
    }

    /// The static public key the server at `server` tells (`None`: it has none), plain and
    /// unproven: over UDP, or TCP when the address says so or UDP gets no answer (as a bind would).
    pub(super) fn ask_key(&self, server: SocketAddr, config: &ClientConfig) -> Result<Option<PublicKey>, BindError> {
        self.udp_else_tcp(server, config, udp_bind::ask_key_udp, tcp::ask_key)
    }
}

/// What a key is pinned for when bound by address.
pub(super) fn address_target(server: SocketAddr) -> String {
    server.to_string()
}

/// What a key is pinned for when imported by name.
pub(super) fn name_target(name: &str) -> String {
    format!("name:{name}")
}
