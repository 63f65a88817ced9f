fn main() {
    tonic_prost_build::configure()
        .compile_protos(&["proto/metastore.proto"], &["proto"])
        .expect("compile protos (needs protoc: apt-get install protobuf-compiler)");
}
