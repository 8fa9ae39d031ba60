//! One Redis, reached lazily: the connection is made on first use and
//! remade after a failure to connect; once made, the manager reconnects by
//! itself when Redis restarts. A service starts whether or not Redis is up.

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::time::Duration;
use tokio::sync::Mutex;
use tonic::Status;

pub struct Redis {
    client: redis::Client,
    conn: Mutex<Option<ConnectionManager>>,
    /// Bounds a connection attempt and every command.
    pub timeout: Duration,
}

impl Redis {
    pub fn new(url: &str, timeout: Duration) -> redis::RedisResult<Self> {
        Ok(Self {
            client: redis::Client::open(url)?,
            conn: Mutex::new(None),
            timeout,
        })
    }

    pub async fn connection(&self) -> Result<ConnectionManager, Status> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(self.timeout)
            .set_response_timeout(self.timeout)
            .set_number_of_retries(1);
        let c = tokio::time::timeout(
            self.timeout,
            ConnectionManager::new_with_config(self.client.clone(), cfg),
        )
        .await
        .map_err(|_| Status::unavailable("redis: no connection within the timeout"))?
        .map_err(|e| Status::unavailable(format!("redis: {e}")))?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// A command or script run within the timeout; Redis away or slow is
    /// `UNAVAILABLE`.
    pub async fn run<T, F>(&self, f: F) -> Result<T, Status>
    where
        F: std::future::Future<Output = redis::RedisResult<T>>,
    {
        tokio::time::timeout(self.timeout, f)
            .await
            .map_err(|_| Status::unavailable("redis: no answer within the timeout"))?
            .map_err(|e| Status::unavailable(format!("redis: {e}")))
    }
}
