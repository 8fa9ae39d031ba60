//! The collector as the dashboard's source of spend: `GET /v1/budgets` of
//! its HTTP API (plain HTTP on a private address, with its read token),
//! read with a small HTTP/1.0 exchange (one request per page load; no
//! client crate for it).

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub struct Collector {
    /// `host:port`.
    authority: String,
    token: Option<String>,
}

/// Largest answer read (the budgets of 10,000 keys are ~2 MB).
const MAX_ANSWER: u64 = 16 << 20;

impl Collector {
    /// From `http://host:port` (no path, no TLS).
    pub fn new(url: &str, token: Option<String>) -> Result<Collector, String> {
        let authority = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("--collector {url}: expected http://host:port"))?
            .trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') || !authority.contains(':') {
            return Err(format!("--collector {url}: expected http://host:port"));
        }
        Ok(Collector {
            authority: authority.to_string(),
            token,
        })
    }

    /// The collector's budgets answer, as JSON.
    pub async fn budgets(&self) -> Result<serde_json::Value, String> {
        let exchange = async {
            let mut s = tokio::net::TcpStream::connect(&self.authority)
                .await
                .map_err(|e| format!("{}: {e}", self.authority))?;
            let auth = self
                .token
                .as_ref()
                .map(|t| format!("Authorization: Bearer {t}\r\n"))
                .unwrap_or_default();
            let request = format!(
                "GET /v1/budgets HTTP/1.0\r\nHost: {}\r\n{auth}Accept: application/json\r\n\r\n",
                self.authority
            );
            s.write_all(request.as_bytes())
                .await
                .map_err(|e| e.to_string())?;
            let mut answer = Vec::new();
            s.take(MAX_ANSWER)
                .read_to_end(&mut answer)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<Vec<u8>, String>(answer)
        };
        let answer = tokio::time::timeout(Duration::from_secs(5), exchange)
            .await
            .map_err(|_| "no answer within 5 s".to_string())??;
        parse_answer(&answer)
    }
}

/// Status line, headers, JSON body.
fn parse_answer(answer: &[u8]) -> Result<serde_json::Value, String> {
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the answer has no header end")?;
    let head = String::from_utf8_lossy(answer.get(..split).unwrap_or_default());
    let body = answer.get(split + 4..).unwrap_or_default();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or("the answer has no status")?;
    if status != 200 {
        return Err(format!(
            "status {status}: {}",
            String::from_utf8_lossy(body)
                .chars()
                .take(300)
                .collect::<String>()
        ));
    }
    serde_json::from_slice(body).map_err(|e| format!("the answer is not JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_answers() {
        assert!(Collector::new("http://127.0.0.1:9090", None).is_ok());
        for bad in ["127.0.0.1:9090", "https://a:1", "http://a", "http://a:1/x"] {
            assert!(Collector::new(bad, None).is_err(), "{bad}");
        }
        let ok =
            parse_answer(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"data\":[]}")
                .unwrap();
        assert_eq!(ok["data"], serde_json::json!([]));
        let e = parse_answer(b"HTTP/1.1 401 Unauthorized\r\n\r\nno token").unwrap_err();
        assert!(e.contains("401") && e.contains("no token"), "{e}");
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\n\r\nnot json").is_err());
    }
}
