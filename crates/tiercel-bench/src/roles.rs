//! The roles a helper process plays ([`crate::helpers`] starts them). A program that uses this crate
//! calls [`run_if_helper`] first thing in `main`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::helpers::HELPER_ENV;

#[derive(Parser)]
#[command(name = "tiercel-bench-helper")]
struct Helper {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand)]
enum Role {
    /// A server of the Test interface.
    Serve(Box<crate::serve::Args>),
    /// The raw UDP echo server.
    RawEcho(crate::raw::EchoArgs),
    /// The raw shared-memory echo server.
    RawShmEcho(crate::raw_shm::EchoArgs),
    /// The raw TCP echo server.
    RawTcpEcho(crate::raw_tcp::EchoArgs),
    /// A peer's server (tarpc, tonic, the tokio echo), for `bench --peers`.
    PeerServe(crate::peers::ServeArgs),
    /// The remote rows of the Mach list, from inside a network namespace.
    MachRemote(crate::tables::RemoteArgs),
    /// The loss-recovery rows, from inside a network namespace.
    LossRemote(crate::loss::RemoteArgs),
    /// The rows of large calls across two namespaces, from inside the client's.
    WideRemote(crate::wide::RemoteArgs),
    /// tiercel's ONC server, and the same interface on tiercel's own protocol (the ONC table).
    OncServe(crate::onc::ServeArgs),
    /// An on-path UDP relay that looks at, changes and replays what passes (the secure tests).
    Relay(crate::relay::Args),
    /// The AF_XDP echo of the AF_XDP floor, in the server's namespace.
    #[cfg(feature = "xdp")]
    XdpEcho(crate::xdp::EchoArgs),
    /// One round of the AF_XDP floor, from inside the client's namespace.
    #[cfg(feature = "xdp")]
    XdpRemote(crate::xdp::RemoteArgs),
    /// A journal server of the failover test.
    JournalServer(crate::failover::ServerArgs),
    /// The failover test's client.
    JournalClient(crate::failover::ClientArgs),
    /// The soak's ledger server.
    #[cfg(feature = "fault-injection")]
    SoakServer(crate::soak::ServerArgs),
    /// The soak's client, against a server in another namespace.
    #[cfg(feature = "fault-injection")]
    Soak(crate::soak::Args),
}

/// When this process was started as a helper, runs the helper and returns its exit code.
pub fn run_if_helper() -> Option<ExitCode> {
    std::env::var_os(HELPER_ENV)?;
    let result = match Helper::parse().role {
        Role::Serve(a) => crate::serve::run(*a),
        Role::RawEcho(a) => crate::raw::echo(a),
        Role::RawShmEcho(a) => crate::raw_shm::echo(a),
        Role::RawTcpEcho(a) => crate::raw_tcp::echo(a),
        Role::PeerServe(a) => crate::peers::serve(a),
        Role::MachRemote(a) => crate::tables::mach_remote(a),
        Role::LossRemote(a) => crate::loss::remote(a),
        Role::WideRemote(a) => crate::wide::remote(a),
        Role::Relay(a) => crate::relay::run(a),
        Role::OncServe(a) => crate::onc::serve(a),
        #[cfg(feature = "xdp")]
        Role::XdpEcho(a) => crate::xdp::echo(a),
        #[cfg(feature = "xdp")]
        Role::XdpRemote(a) => crate::xdp::remote(a),
        Role::JournalServer(a) => crate::failover::server(a),
        Role::JournalClient(a) => crate::failover::client(a),
        #[cfg(feature = "fault-injection")]
        Role::SoakServer(a) => crate::soak::server(a),
        #[cfg(feature = "fault-injection")]
        Role::Soak(a) => crate::soak::run(a),
    };
    Some(match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tiercel helper: {e}");
            ExitCode::FAILURE
        }
    })
}
