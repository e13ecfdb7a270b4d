//! The `steppe.v1` contract: every message that crosses a process boundary,
//! and the gRPC service workers hold a session with.

pub mod v1 {
    tonic::include_proto!("steppe.v1");
}
