//! Raft RPCs between metastore nodes over gRPC (`fathom.metastore.v1.Raft`),
//! each payload a serde_json-encoded openraft request or result.

use std::time::Duration;

use fathom_api::secret::{ClusterSecret, SecretChannel};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, RPCTypes, RaftNetwork, RaftNetworkFactory};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::Endpoint;
use tonic::{Request, Response, Status};

use crate::proto::raft_client::RaftClient;
use crate::proto::raft_server;
use crate::proto::{RaftReply, RaftRequest};
use crate::sm_store::MAX_SNAPSHOT_BYTES;
use crate::types::{NodeId, Raft, TypeConfig};

/// Largest Raft message accepted or sent (log entries and snapshot chunks).
pub(crate) const MAX_RAFT_MESSAGE_BYTES: usize = 64 << 20;

pub(crate) fn endpoint(addr: &str) -> Result<Endpoint, String> {
    let uri = if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    };
    Endpoint::from_shared(uri)
        .map(|e| {
            e.connect_timeout(Duration::from_secs(2))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(10))
        })
        .map_err(|e| format!("invalid address {addr:?}: {e}"))
}

/// Creates a connection per peer; openraft keeps one per replication stream.
pub(crate) struct Network {
    pub(crate) id: NodeId,
    /// Sent with every Raft call.
    pub(crate) secret: ClusterSecret,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerConn;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerConn {
        let client = endpoint(&node.addr).map(|e| {
            RaftClient::with_interceptor(e.connect_lazy(), self.secret.clone())
                .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES)
        });
        PeerConn {
            id: self.id,
            target,
            client,
        }
    }
}

pub(crate) struct PeerConn {
    id: NodeId,
    target: NodeId,
    client: Result<RaftClient<SecretChannel>, String>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

impl PeerConn {
    async fn call<Req, Resp, E>(
        &mut self,
        action: RPCTypes,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let client = match &mut self.client {
            Ok(c) => c,
            Err(m) => return Err(RPCError::Unreachable(Unreachable::new(&Msg(m.clone())))),
        };
        let data = serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let request = RaftRequest { data };
        let fut = async {
            match action {
                RPCTypes::Vote => client.vote(request).await,
                RPCTypes::AppendEntries => client.append_entries(request).await,
                RPCTypes::InstallSnapshot => client.install_snapshot(request).await,
            }
        };
        let ttl = option.hard_ttl();
        let reply = match tokio::time::timeout(ttl, fut).await {
            Err(_) => {
                return Err(RPCError::Timeout(Timeout {
                    action,
                    id: self.id,
                    target: self.target,
                    timeout: ttl,
                }));
            }
            Ok(Err(status)) => {
                let e = Msg(format!(
                    "node {}: {:?}: {}",
                    self.target,
                    status.code(),
                    status.message()
                ));
                return Err(if status.code() == tonic::Code::Unavailable {
                    RPCError::Unreachable(Unreachable::new(&e))
                } else {
                    RPCError::Network(NetworkError::new(&e))
                });
            }
            Ok(Ok(r)) => r.into_inner(),
        };
        let res: Result<Resp, RaftError<NodeId, E>> = serde_json::from_slice(&reply.data)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerConn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(RPCTypes::AppendEntries, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(RPCTypes::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(RPCTypes::Vote, &rpc, &option).await
    }
}

/// Serves Raft RPCs to this node's [`Raft`].
pub(crate) struct RaftService {
    pub(crate) raft: Raft,
}

fn decode<T: DeserializeOwned>(what: &str, req: Request<RaftRequest>) -> Result<T, Status> {
    serde_json::from_slice(&req.into_inner().data)
        .map_err(|e| Status::invalid_argument(format!("undecodable {what} request: {e}")))
}

fn reply<T: Serialize>(res: &T) -> Result<Response<RaftReply>, Status> {
    serde_json::to_vec(res)
        .map(|data| Response::new(RaftReply { data }))
        .map_err(|e| Status::internal(format!("encoding raft reply: {e}")))
}

#[tonic::async_trait]
impl raft_server::Raft for RaftService {
    async fn append_entries(
        &self,
        req: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = decode("append-entries", req)?;
        reply(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let rpc: VoteRequest<NodeId> = decode("vote", req)?;
        reply(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = decode("install-snapshot", req)?;
        let end = rpc.offset.saturating_add(rpc.data.len() as u64);
        if end > MAX_SNAPSHOT_BYTES {
            return Err(Status::invalid_argument(format!(
                "snapshot exceeds the limit of {MAX_SNAPSHOT_BYTES} bytes"
            )));
        }
        reply(&self.raft.install_snapshot(rpc).await)
    }
}
