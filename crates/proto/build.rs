fn main() {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR is set"));
    let descriptors = out.join("descriptors.bin");
    // Fathom's own protos, Pyroscope's push.v1 (served over Connect and
    // gRPC) and Pyroscope's query API (querier.v1, types.v1, google.v1;
    // served over Connect; its service stubs are unused).
    tonic_prost_build::configure()
        // An ingester appends a received record to its WAL as is: a
        // `Bytes` view of the request buffer, not a copy.
        .bytes(".fathom.ingester.v1.Record.record")
        .file_descriptor_set_path(&descriptors)
        .compile_protos(
            &[
                "proto/profile.proto",
                "proto/push.proto",
                "proto/ingester.proto",
                "proto/types/v1/types.proto",
                "proto/push/v1/push.proto",
                "proto/querier/v1/querier.proto",
                "proto/google/v1/profile.proto",
            ],
            &["proto"],
        )
        .expect("compile protos (needs protoc: apt-get install protobuf-compiler)");
    // Pyroscope's Connect APIs also speak JSON: serde impls that follow the
    // canonical protobuf JSON mapping (camelCase or original names, bytes as
    // base64, 64-bit integers as strings), one pass over one descriptor set
    // so that the shared types.v1 gets one implementation.
    let set = std::fs::read(&descriptors).expect("read the file descriptor set");
    pbjson_build::Builder::new()
        .register_descriptors(&set)
        .expect("register descriptors")
        .ignore_unknown_fields()
        .build(&[".push.v1", ".types.v1", ".querier.v1", ".google.v1"])
        .expect("generate the JSON mapping");
}
