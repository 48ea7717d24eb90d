//! Generates the coordinator's gRPC client and server from a service description written in Rust
//! (`tonic_build::manual`): the messages are hand-written prost structs (`src/proto.rs`), so building needs no
//! `protoc`.

use tonic_build::manual::{Builder, Method, Service};

fn main() {
    let unary = |name: &str, route: &str, input: &str, output: &str| {
        Method::builder()
            .name(name)
            .route_name(route)
            .input_type(format!("crate::proto::{input}"))
            .output_type(format!("crate::proto::{output}"))
            .codec_path("tonic::codec::ProstCodec")
            .build()
    };
    let watch = Method::builder()
        .name("watch")
        .route_name("Watch")
        .input_type("crate::proto::Membership")
        .output_type("crate::proto::GroupFailure")
        .codec_path("tonic::codec::ProstCodec")
        .server_streaming()
        .build();
    let service = Service::builder()
        .name("Coordinator")
        .package("lazuli.distributed")
        .method(unary("register", "Register", "RegisterRequest", "RegisterResponse"))
        .method(unary("heartbeat", "Heartbeat", "HeartbeatRequest", "Empty"))
        .method(watch)
        .method(unary("put", "Put", "PutRequest", "Empty"))
        .method(unary("get", "Get", "GetRequest", "GetResponse"))
        .method(unary("delete", "Delete", "GetRequest", "Empty"))
        .method(unary("barrier", "Barrier", "BarrierRequest", "Empty"))
        .method(unary("leave", "Leave", "Membership", "Empty"))
        .method(unary("report_failure", "ReportFailure", "GroupFailure", "Empty"))
        .build();
    Builder::new().compile(&[service]);
}
