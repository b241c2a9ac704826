// tonic's client and server for proto/peer.proto, compiled by the `protoc` that the
// `protoc-bin-vendored` package ships: a fresh machine builds the peers with nothing installed.
fn main() -> std::io::Result<()> {
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path().map_err(std::io::Error::other)?);
    tonic_prost_build::configure().compile_with_config(config, &["proto/peer.proto"], &["proto"])
}
