//! An answer's texts, borrowed from the JSON without building a tree (the
//! common case: nothing to rewrite). Strings without escapes are borrowed;
//! others are unescaped once. Anything that is not a string where text is
//! expected is skipped, as the tree walker of the rewrite skips it. (A
//! request's texts are read by `texts`, one reader for checks and rewrite.)

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::fmt;

/// What a value read as: text, or nothing the checks read.
enum Read<'a> {
    Text(Cow<'a, str>),
    Nothing,
}

/// Reads any value (a list is skipped).
struct Reader;

impl<'de> de::DeserializeSeed<'de> for Reader {
    type Value = Read<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
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
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Read::Nothing)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Read::Nothing)
    }
}

#[derive(Deserialize)]
struct AnswerMessage<'a> {
    #[serde(borrow, default, deserialize_with = "text")]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<ToolCall<'a>>>,
    #[serde(borrow, default)]
    function_call: Option<Function<'a>>,
}

#[derive(Deserialize)]
struct ToolCall<'a> {
    #[serde(borrow, default)]
    function: Option<Function<'a>>,
}

#[derive(Deserialize)]
struct Function<'a> {
    #[serde(borrow, default, deserialize_with = "text")]
    arguments: Option<Cow<'a, str>>,
}

fn text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'de, str>>, D::Error> {
    Ok(match de::DeserializeSeed::deserialize(Reader, d)? {
        Read::Text(t) => Some(t),
        _ => None,
    })
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

/// A chat completion's texts: each choice's content, then (after the
/// returned count of those) every string inside each tool call's JSON
/// arguments (the arguments as they are when they are not JSON); `None`
/// when the answer does not read as a chat completion.
pub fn answer_texts(body: &[u8]) -> Option<(Vec<Cow<'_, str>>, usize)> {
    let a: Answer<'_> = serde_json::from_slice(body).ok()?;
    let mut texts = Vec::with_capacity(a.choices.len());
    let mut args = Vec::new();
    for m in a.choices.into_iter().filter_map(|c| c.message) {
        texts.extend(m.content);
        let calls = m
            .tool_calls
            .into_iter()
            .flatten()
            .filter_map(|c| c.function);
        for f in calls.chain(m.function_call) {
            args.extend(f.arguments);
        }
    }
    let content = texts.len();
    for a in args {
        match serde_json::from_str::<serde_json::Value>(&a) {
            Ok(v) => super::texts::strings_in(&v, &mut texts),
            Err(_) => texts.push(a),
        }
    }
    Some((texts, content))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn answer_texts_are_each_choices_content() {
        let body = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"x"}},{"message":{"content":null}},{"delta":{}}],"usage":{}}"#;
        assert_eq!(answer_texts(body).unwrap(), (vec![Cow::Borrowed("x")], 1));
        assert!(answer_texts(b"[1]").is_none());
    }
}
