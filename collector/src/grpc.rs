//! The gRPC ingest service. With a token (`--ingest-token-file`), a call
//! must carry `authorization: Bearer <token>` in its metadata (the filter
//! sends it from Envoy's environment, `PORTCULLIS_INGEST_TOKEN`); any other
//! is refused (`UNAUTHENTICATED`) and counted, so a local process cannot
//! forge records (any client, any cost) into the log and the spend.

use crate::proto::collector_server::Collector;
use crate::proto::{Ack, RecordBatch};
use crate::store::{SubmitError, Writer};
use tonic::{Request, Response, Status};

pub struct Ingest {
    pub writer: Writer,
    pub token: Option<String>,
}

impl Ingest {
    fn authorized<T>(&self, request: &Request<T>) -> bool {
        portcullis_service::call_authorized(self.token.as_deref(), request)
    }
}

#[tonic::async_trait]
impl Collector for Ingest {
    async fn ingest(&self, request: Request<RecordBatch>) -> Result<Response<Ack>, Status> {
        if !self.authorized(&request) {
            self.writer
                .stats
                .unauthenticated
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(Status::unauthenticated(
                "this collector takes records only with its ingest token",
            ));
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::RequestRecord;
    use crate::store;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    fn batch(ids: &[&str]) -> Request<RecordBatch> {
        Request::new(RecordBatch {
            records: ids
                .iter()
                .map(|id| RequestRecord {
                    request_id: (*id).into(),
                    ..Default::default()
                })
                .collect(),
        })
    }

    /// A full queue answers RESOURCE_EXHAUSTED at once (the filter keeps the
    /// batch and re-sends it); what was queued is still committed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_queue_refuses_with_resource_exhausted_and_loses_nothing_queued() {
        let dir = std::env::temp_dir().join(format!(
            "portcullis-queue-{}-{:?}",
            std::process::id(),
            Instant::now()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log.db");
        let mut conn = store::open(&path).unwrap();
        store::migrate(&mut conn).unwrap();
        let writer = Writer::start(
            crate::db::Db::Sqlite(conn),
            1,
            crate::store::Retention::default(),
        );
        let stats = writer.stats.clone();
        let ingest = Ingest {
            writer: writer.clone(),
            token: None,
        };

        // Another connection holds the write lock: the writer thread takes
        // the first batch and waits on it, so the queue (1 batch) fills.
        let blocker = store::open(&path).unwrap();
        blocker.execute_batch("BEGIN EXCLUSIVE").unwrap();
        let first = writer
            .submit(batch(&["a1", "a2"]).into_inner().records)
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while stats.queue_depth.load(Ordering::Relaxed) > 0 {
            assert!(
                Instant::now() < deadline,
                "the writer never took the first batch"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let second = writer.submit(batch(&["b1"]).into_inner().records).unwrap();
        let refused = ingest.ingest(batch(&["c1"])).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert_eq!(stats.rejected.load(Ordering::Relaxed), 1);

        blocker.execute_batch("COMMIT").unwrap();
        assert_eq!(first.await.unwrap(), Ok((2, 0)));
        assert_eq!(second.await.unwrap(), Ok((1, 0)));
        let check = store::open(&path).unwrap();
        assert_eq!(store::count(&check).unwrap(), 3);
        assert!(
            !store::exists(&check, "c1").unwrap(),
            "the refused batch was not stored"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
