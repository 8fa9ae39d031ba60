//! The gRPC ingest service.

use crate::proto::collector_server::Collector;
use crate::proto::{Ack, RecordBatch};
use crate::store::{SubmitError, Writer};
use tonic::{Request, Response, Status};

pub struct Ingest {
    pub writer: Writer,
}

#[tonic::async_trait]
impl Collector for Ingest {
    async fn ingest(&self, request: Request<RecordBatch>) -> Result<Response<Ack>, Status> {
        let batch = request.into_inner();
        if batch.records.iter().any(|r| r.request_id.is_empty()) {
            return Err(Status::invalid_argument("every record needs a request_id"));
        }
        let done = match self.writer.submit(batch.records) {
            Ok(rx) => rx,
            Err(SubmitError::Full) => {
                return Err(Status::resource_exhausted(
                    "ingest queue is full; retry later",
                ))
            }
            Err(SubmitError::Closed) => return Err(Status::unavailable("the writer has stopped")),
        };
        match done.await {
            Ok(Ok((stored, duplicates))) => Ok(Response::new(Ack { stored, duplicates })),
            Ok(Err(e)) => Err(Status::internal(format!("commit failed: {e}"))),
            Err(_) => Err(Status::unavailable("the writer has stopped")),
        }
    }
}
