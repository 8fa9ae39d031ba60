//! AWS's binary event-stream framing (`application/vnd.amazon.eventstream`,
//! Bedrock's streams), decoded incrementally: bytes may be split anywhere.
//!
//! A message: its total length and its headers' length (big-endian
//! `u32`s), the CRC-32 of those 8 bytes, the headers (a name of 1..=255
//! bytes, a type byte, a value), the payload, the CRC-32 of everything
//! before it. A wrong CRC, a length out of bounds or a header that does not
//! read is an error, and the decoder stays failed (what follows cannot be
//! framed).

/// The largest message read (AWS's limit is 16 MiB of payload).
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024 + 128 * 1024;
const PRELUDE: usize = 12;
const MIN_MESSAGE: usize = PRELUDE + 4;

/// One decoded message: its string headers and its payload.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Message {
    /// String-valued headers (`:event-type`, `:message-type`, ...), in
    /// order; headers of other types are read and skipped.
    pub headers: Vec<(String, String)>,
    pub payload: Vec<u8>,
}

impl Message {
    /// A string header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why the stream cannot be read further.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    PreludeCrc,
    MessageCrc,
    Length,
    Header,
}

impl FrameError {
    pub fn describe(self) -> &'static str {
        match self {
            FrameError::PreludeCrc => "a frame's prelude CRC does not match",
            FrameError::MessageCrc => "a frame's message CRC does not match",
            FrameError::Length => "a frame's length is out of bounds",
            FrameError::Header => "a frame's headers do not read",
        }
    }
}

/// The incremental decoder.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Bytes of `buf` already decoded (dropped at the next push).
    read: usize,
    failed: Option<FrameError>,
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    let s: [u8; 4] = b.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_be_bytes(s))
}

fn be16(b: &[u8], at: usize) -> Option<usize> {
    let s: [u8; 2] = b.get(at..at.checked_add(2)?)?.try_into().ok()?;
    Some(usize::from(u16::from_be_bytes(s)))
}

fn crc(bytes: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(bytes);
    h.finalize()
}

impl Decoder {
    /// The messages these bytes complete; an error once a frame is bad
    /// (then, and for every later push, the same error).
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Message>, FrameError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        if self.read > 0 {
            self.buf.drain(..self.read);
            self.read = 0;
        }
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        loop {
            match self.next() {
                Ok(Some(m)) => out.push(m),
                Ok(None) => return Ok(out),
                Err(e) => {
                    self.failed = Some(e);
                    self.buf = Vec::new();
                    self.read = 0;
                    return Err(e);
                }
            }
        }
    }

    /// Whether bytes of an unfinished message are waiting.
    pub fn pending(&self) -> bool {
        self.buf.len() > self.read
    }

    fn next(&mut self) -> Result<Option<Message>, FrameError> {
        let rest = self.buf.get(self.read..).unwrap_or_default();
        let (Some(total), Some(headers_len), Some(prelude_crc)) =
            (be32(rest, 0), be32(rest, 4), be32(rest, 8))
        else {
            return Ok(None);
        };
        let prelude = rest.get(..8).ok_or(FrameError::Length)?;
        if crc(prelude) != prelude_crc {
            return Err(FrameError::PreludeCrc);
        }
        let total = usize::try_from(total).map_err(|_| FrameError::Length)?;
        let headers_len = usize::try_from(headers_len).map_err(|_| FrameError::Length)?;
        if !(MIN_MESSAGE..=MAX_MESSAGE).contains(&total)
            || headers_len > total.saturating_sub(MIN_MESSAGE)
        {
            return Err(FrameError::Length);
        }
        let Some(whole) = rest.get(..total) else {
            return Ok(None);
        };
        let body_end = total.saturating_sub(4);
        let expected = be32(whole, body_end).ok_or(FrameError::Length)?;
        if crc(whole.get(..body_end).ok_or(FrameError::Length)?) != expected {
            return Err(FrameError::MessageCrc);
        }
        let headers_end = PRELUDE.saturating_add(headers_len);
        let headers = parse_headers(whole.get(PRELUDE..headers_end).ok_or(FrameError::Length)?)?;
        let payload = whole
            .get(headers_end..body_end)
            .ok_or(FrameError::Length)?
            .to_vec();
        self.read = self.read.saturating_add(total);
        Ok(Some(Message { headers, payload }))
    }
}

/// The headers block: string headers kept, the others skipped by their
/// type's size.
fn parse_headers(mut b: &[u8]) -> Result<Vec<(String, String)>, FrameError> {
    let mut out = Vec::new();
    while let Some((&name_len, rest)) = b.split_first() {
        let name_len = usize::from(name_len);
        if name_len == 0 {
            return Err(FrameError::Header);
        }
        let name = rest.get(..name_len).ok_or(FrameError::Header)?;
        let rest = rest.get(name_len..).ok_or(FrameError::Header)?;
        let (&kind, rest) = rest.split_first().ok_or(FrameError::Header)?;
        let (value_len, skip) = match kind {
            0 | 1 => (0, 0),
            2 => (1, 0),
            3 => (2, 0),
            4 => (4, 0),
            5 | 8 => (8, 0),
            9 => (16, 0),
            6 | 7 => (be16(rest, 0).ok_or(FrameError::Header)?, 2),
            _ => return Err(FrameError::Header),
        };
        let end = skip + value_len;
        let value = rest.get(skip..end).ok_or(FrameError::Header)?;
        if kind == 7 {
            let name = std::str::from_utf8(name).map_err(|_| FrameError::Header)?;
            let value = std::str::from_utf8(value).map_err(|_| FrameError::Header)?;
            out.push((name.to_string(), value.to_string()));
        }
        b = rest.get(end..).ok_or(FrameError::Header)?;
    }
    Ok(out)
}

/// One message framed (string headers): for tests, fuzzing and benches.
pub fn encode(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    for (k, v) in headers {
        h.push(u8::try_from(k.len()).unwrap_or(u8::MAX));
        h.extend_from_slice(k.as_bytes());
        h.push(7);
        h.extend_from_slice(&u16::try_from(v.len()).unwrap_or(u16::MAX).to_be_bytes());
        h.extend_from_slice(v.as_bytes());
    }
    let total = PRELUDE + h.len() + payload.len() + 4;
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&u32::try_from(total).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(&u32::try_from(h.len()).unwrap_or(u32::MAX).to_be_bytes());
    let prelude_crc = crc(&out);
    out.extend_from_slice(&prelude_crc.to_be_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(payload);
    let message_crc = crc(&out);
    out.extend_from_slice(&message_crc.to_be_bytes());
    out
}

#[cfg(test)]
mod tests;
