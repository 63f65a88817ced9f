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
        // No head number: this path's senders never leave stacks out.
        answer(
            self.0
                .write(batch)
                .instrument(span.clone())
                .await
                .map(|rows| (rows, 0)),
            &span,
        )
    }

    async fn write_record(
        &self,
        request: Request<Record>,
    ) -> Result<Response<WriteResponse>, Status> {
        let Record { record, held_under } = request.into_inner();
        let span = tracing::info_span!(
            "ingester_write",
            bytes = record.len() as i64,
            tenant = tracing::field::Empty,
            profiles = tracing::field::Empty,
            samples = tracing::field::Empty,
            rows = tracing::field::Empty,
        );
        answer(
            self.0
                .write_record_to_head(record, held_under)
                .instrument(span.clone())
                .await,
            &span,
        )
    }
}

/// The gRPC answer to a write's outcome.
fn answer(
    r: Result<(usize, u64), Error>,
    span: &tracing::Span,
) -> Result<Response<WriteResponse>, Status> {
    match r {
        Ok((rows, head)) => {
            span.record("rows", rows as i64);
            Ok(Response::new(WriteResponse { head }))
        }
        // The sender's to resolve by sending the write whole.
        Err(e @ (Error::NotHeld | Error::LeftOut { .. })) => {
            Err(Status::failed_precondition(e.to_string()))
        }
        Err(e) => Err(fathom_api::ApiError::from(e).into()),
    }
}

/// An ingester's errors in the API's one mapping: a record that cannot be
/// decoded is the sender's (400 / `INVALID_ARGUMENT`); the tenant's own
/// series limit is not retryable as is (429 / `RESOURCE_EXHAUSTED`: the
/// distributor passes it on); everything else is this ingester's state,
/// retryable on another replica (503 / `UNAVAILABLE`).
impl From<Error> for fathom_api::ApiError {
    fn from(e: Error) -> Self {
        use fathom_api::ApiError;
        match e {
            e @ Error::Record(_) => ApiError::BadRequest(format!(
                "{e}: {}",
                std::error::Error::source(&e).map_or(String::new(), |s| s.to_string())
            )),
            e @ Error::ShuttingDown => ApiError::Unavailable(e.to_string()),
            e @ Error::SeriesLimit { .. } => ApiError::RateLimited(e.to_string()),
            e => ApiError::Unavailable(format!("ingester: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_errors_map_to_one_status() {
        let bad = Error::Record(fathom_proto::ConvertError::UnknownStack);
        let s = Status::from(fathom_api::ApiError::from(bad));
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert!(
            s.message().contains("could not be decoded: "),
            "{}",
            s.message()
        );
        let limit = Error::SeriesLimit {
            tenant: fathom_model::TenantId::new("t").unwrap(),
            limit: 1,
            series: 1,
            new: 1,
        };
        let api = fathom_api::ApiError::from(limit);
        assert_eq!(api.grpc_code(), tonic::Code::ResourceExhausted);
        assert_eq!(api.status().as_u16(), 429);
        let full = fathom_api::ApiError::from(Error::HeadFull { held: 2, limit: 1 });
        assert_eq!(full.grpc_code(), tonic::Code::Unavailable);
        assert!(full.to_string().starts_with("ingester: "), "{full}");
        let down = fathom_api::ApiError::from(Error::ShuttingDown);
        assert_eq!(down.grpc_code(), tonic::Code::Unavailable);
    }
}
