fn main() {
    tonic_prost_build::configure()
        .compile_protos(
            &[
                "proto/profile.proto",
                "proto/push.proto",
                "proto/ingester.proto",
            ],
            &["proto"],
        )
        .expect("compile protos (needs protoc: apt-get install protobuf-compiler)");
}
