//! Protobuf wire format by hand, both ways: the few helpers the request
//! record and the rate-limit protocol need, instead of a codegen dependency
//! in the wasm module. The reader never panics and never trusts a length:
//! a malformed message is an error, an unknown field is skipped.

pub(crate) fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

/// A varint field, left out when 0 (proto3's default).
pub(crate) fn uint(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        key(out, field, 0);
        varint(out, v);
    }
}

/// A length-delimited field, left out when empty.
pub(crate) fn bytes(out: &mut Vec<u8>, field: u32, v: &[u8]) {
    if !v.is_empty() {
        message(out, field, v);
    }
}

/// An embedded message (written even when empty: presence matters).
pub(crate) fn message(out: &mut Vec<u8>, field: u32, v: &[u8]) {
    key(out, field, 2);
    varint(out, v.len() as u64);
    out.extend_from_slice(v);
}

/// Why a message could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    Truncated,
    BadVarint,
    BadWireType(u8),
}

/// One field as read: its number and value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    /// Fixed 32- or 64-bit values (read past; nothing here uses them).
    Fixed,
}

/// Reads a message's fields in order.
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    fn varint(&mut self) -> Result<u64, WireError> {
        let mut v: u64 = 0;
        for i in 0..10u32 {
            let (&b, rest) = self.rest.split_first().ok_or(WireError::Truncated)?;
            self.rest = rest;
            let low = u64::from(b & 0x7f);
            // The tenth byte may only hold the top bit of a u64.
            if i == 9 && b > 1 {
                return Err(WireError::BadVarint);
            }
            v |= low << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(WireError::BadVarint)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.rest.len() {
            return Err(WireError::Truncated);
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    /// The next field, or `None` at the end of the message.
    pub fn field(&mut self) -> Result<Option<(u64, Value<'a>)>, WireError> {
        if self.rest.is_empty() {
            return Ok(None);
        }
        let k = self.varint()?;
        let (number, wire) = (k >> 3, (k & 7) as u8);
        let value = match wire {
            0 => Value::Varint(self.varint()?),
            1 => self.take(8).map(|_| Value::Fixed)?,
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| WireError::Truncated)?;
                Value::Bytes(self.take(n)?)
            }
            5 => self.take(4).map(|_| Value::Fixed)?,
            w => return Err(WireError::BadWireType(w)),
        };
        Ok(Some((number, value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn reads_what_it_writes_and_skips_unknown_fields() {
        let mut m = Vec::new();
        uint(&mut m, 1, 300);
        bytes(&mut m, 2, b"abc");
        key(&mut m, 9, 1);
        m.extend_from_slice(&[0; 8]);
        key(&mut m, 10, 5);
        m.extend_from_slice(&[0; 4]);
        uint(&mut m, 3, u64::MAX);
        let mut r = Reader::new(&m);
        assert_eq!(r.field(), Ok(Some((1, Value::Varint(300)))));
        assert_eq!(r.field(), Ok(Some((2, Value::Bytes(b"abc")))));
        assert_eq!(r.field(), Ok(Some((9, Value::Fixed))));
        assert_eq!(r.field(), Ok(Some((10, Value::Fixed))));
        assert_eq!(r.field(), Ok(Some((3, Value::Varint(u64::MAX)))));
        assert_eq!(r.field(), Ok(None));
    }

    #[test]
    fn malformed_input_is_an_error() {
        let mut r = Reader::new(&[0x12, 0x05, b'a']);
        assert_eq!(r.field(), Err(WireError::Truncated));
        let mut r = Reader::new(&[0x08; 12]);
        assert!(r.field().is_ok());
        let mut r = Reader::new(&[
            0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
        ]);
        assert_eq!(r.field(), Err(WireError::BadVarint));
        let mut r = Reader::new(&[0x0b]);
        assert_eq!(r.field(), Err(WireError::BadWireType(3)));
        let mut r = Reader::new(&[0x12, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert_eq!(r.field(), Err(WireError::Truncated));
    }
}
