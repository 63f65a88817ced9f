use std::path::PathBuf;

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
    pyroscope_query_api();
}

/// Pyroscope's public query API (`querier.v1`, `types.v1`, `google.v1`):
/// message types only (Fathom serves it over Connect, not gRPC), with
/// serde implementations of the protobuf JSON mapping (pbjson) for
/// Connect's `application/json`.
fn pyroscope_query_api() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let descriptors = out.join("pyroscope_query_descriptors.bin");
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .file_descriptor_set_path(&descriptors)
        .compile_protos(
            &[
                "proto/querier/v1/querier.proto",
                "proto/types/v1/types.proto",
                "proto/google/v1/profile.proto",
            ],
            &["proto"],
        )
        .expect("compile the querier.v1 protos (needs protoc: apt-get install protobuf-compiler)");
    let set = std::fs::read(&descriptors).expect("read the descriptor set protoc wrote");
    pbjson_build::Builder::new()
        .register_descriptors(&set)
        .expect("register the querier.v1 descriptors")
        .ignore_unknown_fields()
        .build(&[".querier.v1", ".types.v1", ".google.v1"])
        .expect("generate the protobuf JSON mapping of querier.v1");
}
