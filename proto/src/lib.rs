//! The `steppe.v1` contract: every message that crosses a process boundary
//! (gRPC, the Redis queue, a result's payload), and the gRPC services —
//! `Coordinator` (the session a worker holds), `Artifacts`, `Runs`, `History`.

pub mod v1 {
    tonic::include_proto!("steppe.v1");
}
