// tonic's client and server for proto/peer.proto (needs `protoc`, as the etcd client does).
fn main() -> std::io::Result<()> {
    tonic_prost_build::compile_protos("proto/peer.proto")
}
