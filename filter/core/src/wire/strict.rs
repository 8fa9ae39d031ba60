//! One strict pass over a request body. Every value is read as exactly as a
//! JSON tree would read it — numbers in range, string escapes decoded (a
//! lone surrogate is an error), nesting within serde_json's limit — without
//! building the tree, while the fields the gateway needs are borrowed.
//! Duplicate gateway fields are an error (a provider might read the other
//! one); other duplicates are the provider's business.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;

/// The gateway's fields of a body that reads strictly as a JSON object.
#[derive(Debug, Default)]
pub struct Fields<'a> {
    pub model: Option<&'a RawValue>,
    pub messages: Option<Messages>,
    pub stream: Option<&'a RawValue>,
    pub stream_options: Option<&'a RawValue>,
    pub max_tokens: Option<&'a RawValue>,
    pub max_completion_tokens: Option<&'a RawValue>,
    /// The Responses API's completion cap.
    pub max_output_tokens: Option<&'a RawValue>,
    /// Embeddings' `input`.
    pub input: Option<&'a RawValue>,
    /// Read for the record only (the last one, when repeated).
    pub temperature: Option<&'a RawValue>,
}

/// What `messages` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Messages {
    Array(usize),
    NotArray,
}

/// Read `text` (which starts with `{`) strictly.
pub fn read(text: &str) -> Result<Fields<'_>, serde_json::Error> {
    serde_json::from_str(text)
}

/// Any JSON value, read strictly and thrown away.
struct Strict;

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(|_| Strict)
    }
}

/// Visits any value; `Some(n)` for an array of `n` items.
struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut n: usize = 0;
        while seq.next_element::<Strict>()?.is_some() {
            n = n.saturating_add(1);
        }
        Ok(Some(n))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<Strict, Strict>()?.is_some() {}
        Ok(None)
    }
}

impl<'de> Deserialize<'de> for Messages {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match d.deserialize_any(StrictVisitor)? {
            Some(n) => Messages::Array(n),
            None => Messages::NotArray,
        })
    }
}

/// A top-level key, matched without allocating.
enum Key {
    Model,
    Messages,
    Stream,
    StreamOptions,
    MaxTokens,
    MaxCompletionTokens,
    MaxOutputTokens,
    Input,
    Temperature,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E>(self, k: &str) -> Result<Key, E> {
                Ok(match k {
                    "model" => Key::Model,
                    "messages" => Key::Messages,
                    "stream" => Key::Stream,
                    "stream_options" => Key::StreamOptions,
                    "max_tokens" => Key::MaxTokens,
                    "max_completion_tokens" => Key::MaxCompletionTokens,
                    "max_output_tokens" => Key::MaxOutputTokens,
                    "input" => Key::Input,
                    "temperature" => Key::Temperature,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// A borrowed field, read strictly, once.
fn take<'de, A: MapAccess<'de>>(
    map: &mut A,
    slot: &mut Option<&'de RawValue>,
    name: &str,
) -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(de::Error::custom(format!("duplicate field `{name}`")));
    }
    let raw: &'de RawValue = map.next_value()?;
    serde_json::from_str::<Strict>(raw.get()).map_err(de::Error::custom)?;
    *slot = Some(raw);
    Ok(())
}

impl<'de: 'a, 'a> Deserialize<'de> for Fields<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct FieldsVisitor;
        impl<'de> Visitor<'de> for FieldsVisitor {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields<'de>, A::Error> {
                let mut f = Fields::default();
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::Model => take(&mut map, &mut f.model, "model")?,
                        Key::Stream => take(&mut map, &mut f.stream, "stream")?,
                        Key::StreamOptions => {
                            take(&mut map, &mut f.stream_options, "stream_options")?
                        }
                        Key::MaxTokens => take(&mut map, &mut f.max_tokens, "max_tokens")?,
                        Key::MaxCompletionTokens => take(
                            &mut map,
                            &mut f.max_completion_tokens,
                            "max_completion_tokens",
                        )?,
                        Key::MaxOutputTokens => {
                            take(&mut map, &mut f.max_output_tokens, "max_output_tokens")?
                        }
                        Key::Input => take(&mut map, &mut f.input, "input")?,
                        Key::Temperature => {
                            let raw: &'de RawValue = map.next_value()?;
                            serde_json::from_str::<Strict>(raw.get()).map_err(de::Error::custom)?;
                            f.temperature = Some(raw);
                        }
                        Key::Messages if f.messages.is_some() => {
                            return Err(de::Error::custom("duplicate field `messages`"))
                        }
                        Key::Messages => f.messages = Some(map.next_value()?),
                        Key::Other => {
                            map.next_value::<Strict>()?;
                        }
                    }
                }
                Ok(f)
            }
        }
        d.deserialize_map(FieldsVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Exactly what a JSON tree accepts, no more, no less.
    #[test]
    fn reads_as_strictly_as_a_tree() {
        let deep = format!(r#"{{"x":{}1{}}}"#, "[".repeat(200), "]".repeat(200));
        let cases = [
            r#"{"model":"m","messages":[{"a":1}],"x":1e400}"#.to_string(),
            r#"{"model":"m","messages":[{"content":"\ud800"}]}"#.to_string(),
            r#"{"model":"m","max_tokens":1e400,"messages":[1]}"#.to_string(),
            r#"{"model":"m","stream_options":{"a":"\udc00"},"messages":[1]}"#.to_string(),
            r#"{"\ud800":1,"messages":[1]}"#.to_string(),
            deep,
            r#"{"model":"m","messages":[1,{"b":[true,null,-0.5e-3,"\u00e9"]}],"n":18446744073709551615}"#
                .to_string(),
            r#"{"messages":"text","a":{"a":1,"a":2}}"#.to_string(),
        ];
        for text in &cases {
            let tree = serde_json::from_str::<serde_json::Value>(text).is_ok();
            assert_eq!(read(text).is_ok(), tree, "{text}");
        }
    }

    #[test]
    fn borrows_the_gateway_fields_and_counts_messages() {
        let f =
            read(r#"{"stream":true,"model":"gpt","messages":[{},{},{}],"max_tokens":5}"#).unwrap();
        assert_eq!(f.model.map(RawValue::get), Some(r#""gpt""#));
        assert_eq!(f.messages, Some(Messages::Array(3)));
        assert_eq!(f.stream.map(RawValue::get), Some("true"));
        assert_eq!(f.max_tokens.map(RawValue::get), Some("5"));
        let f = read(r#"{"messages":{"a":1}}"#).unwrap();
        assert_eq!(f.messages, Some(Messages::NotArray));
        for dup in [
            r#"{"model":"a","model":"b"}"#,
            r#"{"messages":[1],"messages":[2]}"#,
        ] {
            assert!(read(dup)
                .unwrap_err()
                .to_string()
                .contains("duplicate field"));
        }
    }
}
