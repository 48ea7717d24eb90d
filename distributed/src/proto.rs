//! The coordinator's messages, written as prost structs (the wire format is protobuf; there is no `.proto`
//! file to compile). Field numbers are the protocol: change a message only by adding fields.

/// No content.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

/// A process of the group, naming itself.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Membership {
    #[prost(uint32, tag = "1")]
    pub process_id: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegisterRequest {
    #[prost(uint32, tag = "1")]
    pub process_id: u32,
    /// The group's size as this process was told it.
    #[prost(uint32, tag = "2")]
    pub num_processes: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegisterResponse {
    /// The coordinator's heartbeat timeout: members beat several times within it.
    #[prost(uint64, tag = "1")]
    pub heartbeat_timeout_ms: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HeartbeatRequest {
    #[prost(uint32, tag = "1")]
    pub process_id: u32,
    /// The member's training step, reported so that a loss can name it.
    #[prost(uint64, tag = "2")]
    pub step: u64,
}

/// Why the group failed: sent on a member's watch stream and carried by every later call's error.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GroupFailure {
    #[prost(uint32, tag = "1")]
    pub lost_process: u32,
    /// The lost process's last reported step; absent if it never reported one.
    #[prost(uint64, optional, tag = "2")]
    pub last_step: Option<u64>,
    /// What happened, in words ("stopped heartbeating for 3.0 s", "lost its connection").
    #[prost(string, tag = "3")]
    pub reason: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PutRequest {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetRequest {
    #[prost(string, tag = "1")]
    pub key: String,
    /// How long to wait for the key; 0 answers at once (try-get).
    #[prost(uint64, tag = "2")]
    pub timeout_ms: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetResponse {
    /// Absent: not there (a try-get; a waiting get answers DEADLINE_EXCEEDED instead).
    #[prost(bytes = "vec", optional, tag = "1")]
    pub value: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BarrierRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint32, tag = "2")]
    pub process_id: u32,
    #[prost(uint64, tag = "3")]
    pub timeout_ms: u64,
}
