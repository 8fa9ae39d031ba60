//! The canonical form of a request for the cache key, read without copying
//! its text (#29): strings borrow from the body (a copy only for the rare
//! string with escapes), so a 1 MB prompt is hashed where it lies. The form
//! is the one serde_json's `Value` would print, object keys sorted: the
//! same bytes go into the hash, so keys made either way are equal.

use crate::wire::borrowed::Key;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Number;
use std::borrow::Cow;
use std::fmt;
use std::io::Write;

pub enum Canon<'a> {
    Null,
    Bool(bool),
    Number(Number),
    Str(Cow<'a, str>),
    Array(Vec<Canon<'a>>),
    /// Sorted by key; a repeated key keeps its last value (as `Value` does).
    Object(Vec<(Cow<'a, str>, Canon<'a>)>),
}

impl Canon<'_> {
    /// Write the compact form (as `serde_json::to_writer` of a `Value`).
    pub fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        match self {
            Canon::Null => w.write_all(b"null"),
            Canon::Bool(true) => w.write_all(b"true"),
            Canon::Bool(false) => w.write_all(b"false"),
            Canon::Number(n) => serde_json::to_writer(w, n).map_err(std::io::Error::other),
            Canon::Str(s) => write_str(w, s),
            Canon::Array(items) => {
                w.write_all(b"[")?;
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        w.write_all(b",")?;
                    }
                    v.write(w)?;
                }
                w.write_all(b"]")
            }
            Canon::Object(entries) => {
                w.write_all(b"{")?;
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        w.write_all(b",")?;
                    }
                    write_str(w, k)?;
                    w.write_all(b":")?;
                    v.write(w)?;
                }
                w.write_all(b"}")
            }
        }
    }
}

/// A string as serde_json prints it. One borrowed from the body had no
/// escape there, so it holds no quote, backslash or control character (JSON
/// forbids them raw, and the body was read strictly): it prints as it is,
/// between quotes, without a second scan of a long prompt.
// Whether the string is borrowed is what this reads: it takes the Cow.
#[allow(clippy::ptr_arg)]
fn write_str(w: &mut impl Write, s: &Cow<'_, str>) -> std::io::Result<()> {
    match s {
        Cow::Borrowed(text) => {
            w.write_all(b"\"")?;
            w.write_all(text.as_bytes())?;
            w.write_all(b"\"")
        }
        Cow::Owned(text) => serde_json::to_writer(w, text).map_err(std::io::Error::other),
    }
}

impl<'de> Deserialize<'de> for Canon<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CanonVisitor)
    }
}

struct CanonVisitor;

impl<'de> Visitor<'de> for CanonVisitor {
    type Value = Canon<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Canon<'de>, E> {
        Ok(Canon::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Canon<'de>, E> {
        Ok(Canon::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Canon<'de>, D::Error> {
        Canon::deserialize(d)
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Canon<'de>, E> {
        Ok(Canon::Bool(b))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Canon<'de>, E> {
        Ok(Canon::Number(n.into()))
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Canon<'de>, E> {
        Ok(Canon::Number(n.into()))
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Canon<'de>, E> {
        // As `Value`: a number JSON cannot hold is null.
        Ok(Number::from_f64(n).map_or(Canon::Null, Canon::Number))
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Canon<'de>, E> {
        Ok(Canon::Str(Cow::Borrowed(s)))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Canon<'de>, E> {
        Ok(Canon::Str(Cow::Owned(s.to_string())))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Canon<'de>, E> {
        Ok(Canon::Str(Cow::Owned(s)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Canon<'de>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(v) = seq.next_element::<Canon<'de>>()? {
            items.push(v);
        }
        Ok(Canon::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Canon<'de>, A::Error> {
        let mut entries: Vec<(Cow<'de, str>, Canon<'de>)> = Vec::new();
        while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
            let v = map.next_value::<Canon<'de>>()?;
            entries.push((k, v));
        }
        // Sorted by key (stable: repeated keys stay in order), then the last
        // of each repeated key kept.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(Cow<'de, str>, Canon<'de>)> = Vec::with_capacity(entries.len());
        for (k, v) in entries {
            match out.last_mut() {
                Some(last) if last.0 == k => last.1 = v,
                _ => out.push((k, v)),
            }
        }
        Ok(Canon::Object(out))
    }
}
