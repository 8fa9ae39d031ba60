//! The texts the checks read, borrowed from the JSON without building a
//! tree (the common case: nothing to rewrite). Strings without escapes are
//! borrowed; others are unescaped once. Anything that is not a string where
//! text is expected is skipped, as the tree walkers of the rewrite skip it.

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::fmt;

/// What a value read as: text, a list of texts (content parts), a part, or
/// nothing the checks read.
enum Read<'a> {
    Text(Cow<'a, str>),
    Texts(Vec<Cow<'a, str>>),
    /// A content part: its `type` is `text`, and its `text`.
    Part(bool, Option<Cow<'a, str>>),
    Nothing,
}

/// Reads any value; `parts`: a list is content parts (else skipped).
struct Reader {
    parts: bool,
}

impl<'de> de::DeserializeSeed<'de> for Reader {
    type Value = Read<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// Keys of a content part.
enum PartKey {
    Type,
    Text,
    Other,
}

impl<'de> Deserialize<'de> for PartKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = PartKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, k: &str) -> Result<PartKey, E> {
                Ok(match k {
                    "type" => PartKey::Type,
                    "text" => PartKey::Text,
                    _ => PartKey::Other,
                })
            }
        }
        d.deserialize_identifier(KeyVisitor)
    }
}

impl<'de> Visitor<'de> for Reader {
    type Value = Read<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Read::Text(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Read::Text(Cow::Owned(v.to_string())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Read::Text(Cow::Owned(v)))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Read::Nothing)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Read::Nothing)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Read::Nothing)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Read::Nothing)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Read::Nothing)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        if !self.parts {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(Read::Nothing);
        }
        let mut out = Vec::new();
        while let Some(part) = seq.next_element_seed(Reader { parts: false })? {
            if let Read::Part(true, Some(t)) = part {
                out.push(t);
            }
        }
        Ok(Read::Texts(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut is_text, mut text) = (false, None);
        while let Some(k) = map.next_key::<PartKey>()? {
            let v = match k {
                PartKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
                _ => map.next_value_seed(Reader { parts: false })?,
            };
            match (k, v) {
                (PartKey::Type, Read::Text(t)) => is_text = t == "text",
                (PartKey::Text, Read::Text(t)) => text = Some(t),
                _ => {}
            }
        }
        Ok(Read::Part(is_text, text))
    }
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default, deserialize_with = "content")]
    content: Vec<Cow<'a, str>>,
}

fn content<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Cow<'de, str>>, D::Error> {
    Ok(
        match de::DeserializeSeed::deserialize(Reader { parts: true }, d)? {
            Read::Text(t) => vec![t],
            Read::Texts(t) => t,
            _ => Vec::new(),
        },
    )
}

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow, default)]
    messages: Vec<Message<'a>>,
}

/// The prompt's texts: each message's content, as a string or its `text`
/// parts (empty when the body does not read, which the parser refused).
pub fn prompt_texts(body: &[u8]) -> Vec<Cow<'_, str>> {
    serde_json::from_slice::<Request<'_>>(body)
        .map(|r| r.messages.into_iter().flat_map(|m| m.content).collect())
        .unwrap_or_default()
}

#[derive(Deserialize)]
struct AnswerMessage<'a> {
    #[serde(borrow, default, deserialize_with = "text")]
    content: Option<Cow<'a, str>>,
}

fn text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'de, str>>, D::Error> {
    Ok(
        match de::DeserializeSeed::deserialize(Reader { parts: false }, d)? {
            Read::Text(t) => Some(t),
            _ => None,
        },
    )
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    message: Option<AnswerMessage<'a>>,
}

#[derive(Deserialize)]
struct Answer<'a> {
    #[serde(borrow, default)]
    choices: Vec<Choice<'a>>,
}

/// A chat completion's texts (each choice's content), or `None` when the
/// answer does not read as a chat completion.
pub fn answer_texts(body: &[u8]) -> Option<Vec<Cow<'_, str>>> {
    let a: Answer<'_> = serde_json::from_slice(body).ok()?;
    Some(
        a.choices
            .into_iter()
            .filter_map(|c| c.message?.content)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn prompt_texts_are_strings_and_text_parts_only() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"a\nb"},{"role":"user","content":[{"type":"text","text":"c"},{"text":"no type","type":"image"},{"type":"text","text":7},"odd"]},{"role":"user","content":null},{"role":"user"},{"content":{"x":1}}],"x":[1,{"y":2}]}"#;
        let t = prompt_texts(body);
        assert_eq!(t, ["a\nb", "c"]);
        assert!(matches!(t[1], Cow::Borrowed(_)), "no escapes: borrowed");
    }

    #[test]
    fn answer_texts_are_each_choices_content() {
        let body = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"x"}},{"message":{"content":null}},{"delta":{}}],"usage":{}}"#;
        assert_eq!(answer_texts(body).unwrap(), ["x"]);
        assert!(answer_texts(b"[1]").is_none());
    }
}
