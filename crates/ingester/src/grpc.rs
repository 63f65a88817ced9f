//! `fathom.ingester.v1.IngesterService`: the distributors' writes to this
//! ingester. A write is acknowledged once it is in the WAL (fsync'd) and the
//! head, exactly as in-process writes.

use std::sync::Arc;
use tracing::Instrument;

use fathom_model::IngestBatch;
use fathom_proto::ingester::ingester_service_server::{IngesterService, IngesterServiceServer};
use fathom_proto::ingester::{Record, WriteRequest, WriteResponse};
use tonic::{Request, Response, Status};

use crate::{Error, Ingester};

/// The gRPC write service of `ingester`.
pub fn write_service(ingester: Arc<Ingester>) -> IngesterServiceServer<WriteServer> {
    IngesterServiceServer::new(WriteServer(ingester))
        .max_decoding_message_size(64 << 20)
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
}

/// See [`write_service`].
pub struct WriteServer(pub(crate) Arc<Ingester>);

#[tonic::async_trait]
impl IngesterService for WriteServer {
    async fn write(
        &self,
        request: Request<WriteRequest>,
    ) -> Result<Response<WriteResponse>, Status> {
        let batch = IngestBatch::try_from(request.into_inner())
            .map_err(|e| Status::invalid_argument(format!("write request: {e}")))?;
        let span = tracing::info_span!(
            "ingester_write",
            tenant = %batch.tenant,
            profiles = batch.profiles.len() as i64,
            samples = batch.sample_count() as i64,
            rows = tracing::field::Empty,
        );
        answer(self.0.write(batch).instrument(span.clone()).await, &span)
    }

    async fn write_record(
        &self,
        request: Request<Record>,
    ) -> Result<Response<WriteResponse>, Status> {
        let record = request.into_inner().record;
        let span = tracing::info_span!(
            "ingester_write",
            bytes = record.len() as i64,
            tenant = tracing::field::Empty,
            profiles = tracing::field::Empty,
            samples = tracing::field::Empty,
            rows = tracing::field::Empty,
        );
        answer(
            self.0.write_record(record).instrument(span.clone()).await,
            &span,
        )
    }
}

/// The gRPC answer to a write's outcome.
fn answer(
    r: Result<usize, Error>,
    span: &tracing::Span,
) -> Result<Response<WriteResponse>, Status> {
    match r {
        Ok(rows) => {
            span.record("rows", rows as i64);
            Ok(Response::new(WriteResponse {}))
        }
        Err(e @ Error::Record(_)) => Err(Status::invalid_argument(format!(
            "{e}: {}",
            std::error::Error::source(&e).map_or(String::new(), |s| s.to_string())
        ))),
        Err(e @ Error::ShuttingDown) => Err(Status::unavailable(e.to_string())),
        // The tenant's own limit: the distributor passes it on, not retried.
        Err(e @ Error::SeriesLimit { .. }) => Err(Status::resource_exhausted(e.to_string())),
        Err(e) => Err(Status::unavailable(format!("ingester: {e}"))),
    }
}
