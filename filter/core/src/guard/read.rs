//! Texts borrowed from the JSON without building a tree (the common case:
//! nothing to rewrite). Strings without escapes are borrowed; others are
//! unescaped once. Anything that is not a string where text is expected is
//! skipped, as the tree walker of the rewrite skips it.
//!
//! - An answer's: a chat completion's ([`answer_texts`]).
//! - A request's, for the shapes nearly every request has
//!   ([`request_texts`]): `system` and `messages` whose contents are
//!   strings or text blocks. Anything else (names, tool calls, Responses
//!   items, prompts, documents) is left to `texts`, the one reader of
//!   every shape, which the rewrite uses too; a test holds the two to the
//!   same texts and seams.

use super::texts::{field_rank, MESSAGE_FIELDS, TEXT_BLOCKS, TOOL_BLOCKS};
use crate::wire::borrowed::{Key, Str};
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

/// A request's texts and, for each, where its parts were joined: what
/// `texts::texts` and `texts::seams` give over `texts::request_slots`, for a
/// body whose only texts are a `system` and `messages` with string or
/// text-block contents (blocks that are not text end a run, as there), read
/// in one pass. `None`: another shape; the caller reads the body as a tree.
/// For a body the request parser accepted (`crate::wire::strict`), which refuses
/// what a tree would not read (numbers beyond `f64`, escapes that do not
/// unescape, nesting beyond the limit) where this pass skips it unread.
pub fn request_texts(body: &[u8]) -> Option<Texts<'_>> {
    let req: Request<'_> = serde_json::from_slice(body).ok()?;
    if req.other {
        return None;
    }
    let mut run = Run::default();
    if let Some(c) = req.system {
        run.content(c)?;
    }
    for m in req.messages {
        match m {
            Msg::Content(c) => run.content(c)?,
            Msg::Plain => {}
            Msg::Other => return None,
        }
    }
    run.flush();
    Some(run.out)
}

/// Texts, and for each the offsets where its joined parts meet.
pub type Texts<'a> = (Vec<Cow<'a, str>>, Vec<Vec<usize>>);

/// A request's members that hold texts (a repeated member: the last, as a
/// tree keeps); `other`: one this pass leaves to the tree.
#[derive(Default)]
struct Request<'a> {
    system: Option<Content<'a>>,
    messages: Vec<Msg<'a>>,
    other: bool,
}

/// A content: a string, blocks, or anything else (no text).
enum Content<'a> {
    Text(Cow<'a, str>),
    Blocks(Vec<Block<'a>>),
    Nothing,
}

/// A content block: a text block (its text when a string), one whose
/// inputs or contents the tree reads (`tool_use`, `tool_result`), another
/// kind, or not an object (both end a run).
enum Block<'a> {
    Text(Option<Cow<'a, str>>),
    Tool,
    Ends,
}

/// A message: its content, none (not an object, or no content), or a
/// member this pass leaves to the tree (a name, tool calls).
enum Msg<'a> {
    Content(Content<'a>),
    Plain,
    Other,
}

/// Texts the model reads one after the other, joined until something else
/// ends the run (`texts`' runs).
#[derive(Default)]
struct Run<'a> {
    parts: Vec<Cow<'a, str>>,
    out: Texts<'a>,
}

impl<'a> Run<'a> {
    /// A content's texts; `None`: blocks the tree reads.
    fn content(&mut self, c: Content<'a>) -> Option<()> {
        match c {
            Content::Text(t) => self.parts.push(t),
            Content::Blocks(blocks) => {
                for b in blocks {
                    match b {
                        Block::Text(t) => self.parts.extend(t),
                        Block::Tool => return None,
                        Block::Ends => self.flush(),
                    }
                }
            }
            Content::Nothing => {}
        }
        Some(())
    }

    /// The run so far as one text (its seams where its parts meet).
    fn flush(&mut self) {
        if self.parts.len() < 2 {
            if let Some(p) = self.parts.pop() {
                self.out.0.push(p);
                self.out.1.push(Vec::new());
            }
            return;
        }
        let len = self.parts.iter().map(|p| p.len()).sum();
        let mut joined = String::with_capacity(len);
        let mut seams = Vec::with_capacity(self.parts.len().saturating_sub(1));
        for (i, p) in self.parts.drain(..).enumerate() {
            if i > 0 {
                seams.push(joined.len());
            }
            joined.push_str(&p);
        }
        self.out.0.push(Cow::Owned(joined));
        self.out.1.push(seams);
    }
}

/// Drains a map's members unread.
fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

impl<'de> Deserialize<'de> for Request<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Request<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut r = Request::default();
                while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
                    match k.as_ref() {
                        "system" => r.system = Some(map.next_value()?),
                        "messages" => r.messages = map.next_value::<Msgs<'de>>()?.0,
                        k => {
                            r.other |= field_rank(k).is_some();
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(r)
            }
        }
        d.deserialize_map(V)
    }
}

/// `messages`: its elements when a list, else none.
struct Msgs<'a>(Vec<Msg<'a>>);

/// A value of any type, read as what `T` makes of it: its string, list or
/// object; anything else (and what `T` does not take) is `nothing`.
trait Lenient<'de>: Sized {
    fn nothing() -> Self;
    fn string(_: Cow<'de, str>) -> Self {
        Self::nothing()
    }
    fn list<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Self::nothing())
    }
    fn object<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        skip_map(map)?;
        Ok(Self::nothing())
    }
}

struct LenientVisitor<T>(std::marker::PhantomData<T>);

fn lenient<'de, T: Lenient<'de>, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
    d.deserialize_any(LenientVisitor(std::marker::PhantomData))
}

impl<'de, T: Lenient<'de>> Visitor<'de> for LenientVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<T, E> {
        Ok(T::string(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        Ok(T::string(Cow::Owned(v.to_string())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<T, E> {
        Ok(T::string(Cow::Owned(v)))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<T, E> {
        Ok(T::nothing())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<T, E> {
        Ok(T::nothing())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<T, E> {
        Ok(T::nothing())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<T, E> {
        Ok(T::nothing())
    }
    fn visit_unit<E: de::Error>(self) -> Result<T, E> {
        Ok(T::nothing())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        T::list(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::object(map)
    }
}

impl<'de> Lenient<'de> for Msgs<'de> {
    fn nothing() -> Self {
        Msgs(Vec::new())
    }
    fn list<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(4).min(64));
        while let Some(m) = seq.next_element::<Msg<'de>>()? {
            out.push(m);
        }
        Ok(Msgs(out))
    }
}

impl<'de> Lenient<'de> for Msg<'de> {
    fn nothing() -> Self {
        Msg::Plain
    }
    fn object<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut content = None;
        let mut other = false;
        while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
            match k.as_ref() {
                "content" => content = Some(map.next_value::<Content<'de>>()?),
                k => {
                    other |= MESSAGE_FIELDS.contains(&k);
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(match (other, content) {
            (true, _) => Msg::Other,
            (false, Some(c)) => Msg::Content(c),
            (false, None) => Msg::Plain,
        })
    }
}

impl<'de> Lenient<'de> for Content<'de> {
    fn nothing() -> Self {
        Content::Nothing
    }
    fn string(s: Cow<'de, str>) -> Self {
        Content::Text(s)
    }
    fn list<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(4).min(64));
        while let Some(b) = seq.next_element::<Block<'de>>()? {
            out.push(b);
        }
        Ok(Content::Blocks(out))
    }
}

impl<'de> Lenient<'de> for Block<'de> {
    fn nothing() -> Self {
        Block::Ends
    }
    fn object<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let (mut kind, mut text) = (Str(None), Str(None));
        while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
            match k.as_ref() {
                "type" => kind = map.next_value()?,
                "text" => text = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let kind = kind.0.as_deref().unwrap_or("");
        Ok(if TEXT_BLOCKS.contains(&kind) {
            Block::Text(text.0)
        } else if TOOL_BLOCKS.contains(&kind) {
            Block::Tool
        } else {
            Block::Ends
        })
    }
}

macro_rules! read_leniently {
    ($($t:ident),*) => {$(
        impl<'de> Deserialize<'de> for $t<'de> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                lenient(d)
            }
        }
    )*};
}
read_leniently!(Msgs, Msg, Content, Block);

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

    /// What the tree reader gives: the texts and seams of `request_slots`
    /// (`None`: the body does not read as a tree).
    fn by_tree(body: &str) -> Option<(Vec<String>, Vec<Vec<usize>>)> {
        let mut doc: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(body).ok()?;
        let slots = super::super::texts::request_slots(&mut doc);
        let texts = super::super::texts::texts(&slots);
        let seams = super::super::texts::seams(&slots);
        Some((texts.iter().map(|t| t.to_string()).collect(), seams))
    }

    fn by_read(body: &str) -> Option<(Vec<String>, Vec<Vec<usize>>)> {
        let (texts, seams) = request_texts(body.as_bytes())?;
        Some((texts.iter().map(|t| t.to_string()).collect(), seams))
    }

    /// The shapes nearly every request has are read without a tree, as the
    /// tree reads them; the rest is left to the tree.
    #[test]
    fn a_request_is_read_as_the_tree_reads_it_or_left_to_the_tree() {
        let read = [
            r#"{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hi."}],"temperature":0.2,"max_tokens":16}"#,
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"},{"type":"text","text":"c"}]}],"model":"m"}"#,
            r#"{"system":[{"type":"text","text":"s1"},{"type":"text","text":"s2"}],"messages":[{"role":"user","content":"u"}],"model":"m","max_tokens":5}"#,
            r#"{"messages":[{"role":"user","content":"x\u00e9\"y"},{"role":"assistant","content":null},{"content":7},{"content":{"a":1}},5,"s"],"system":"sys"}"#,
            r#"{"messages":[{"role":"user","content":[1,{"type":"text","text":3},{"text":"no type"},{"type":"input_text","text":""},{"type":"output_text","text":"o"}]}]}"#,
            r#"{"messages":"not a list","system":{"text":"x"}}"#,
            r#"{"messages":[{"content":"first"}],"messages":[{"content":"last"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"metadata":{"n":1e3}}"#,
            r#"{"model":"m"}"#,
            r#"{"system":"first","system":"last","messages":[{"content":"u","content":"v"},{"content":[{"type":"image","type":"text","text":"a","text":"b"}]}]}"#,
        ];
        for body in read {
            let tree = by_tree(body).expect(body);
            assert_eq!(by_read(body), Some(tree), "{body}");
        }
        let left = [
            // Shapes `texts` reads.
            r#"{"messages":[{"role":"user","name":"bob","content":"x"}]}"#,
            r#"{"messages":[{"role":"assistant","content":null,"tool_calls":[]}]}"#,
            r#"{"messages":[{"role":"assistant","function_call":{"arguments":"{}"}}]}"#,
            r#"{"messages":[{"role":"user","content":[{"type":"tool_result","content":"r"}]}]}"#,
            r#"{"messages":[{"role":"assistant","content":[{"type":"tool_use","input":{"a":"b"}}]}]}"#,
            r#"{"input":"x"}"#,
            r#"{"instructions":"x","input":[]}"#,
            r#"{"prompt":"x"}"#,
            r#"{"query":"q","documents":["d"]}"#,
            "[1]",
            "{",
        ];
        for body in left {
            assert_eq!(by_read(body), None, "{body}");
        }
        // What a tree does not read, this pass may skip unread: the request
        // parser refuses it first.
        let deep = format!(
            r#"{{"model":"m","messages":[{{"content":"x"}}],"m":{}1{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let unread = [
            r#"{"model":"m","messages":[{"content":"x"}],"temperature":1e400}"#.to_string(),
            r#"{"model":"m","messages":[{"content":"x"}],"metadata":{"n":[1e400]}}"#.to_string(),
            r#"{"model":"m","messages":[{"content":"x","role":"\udc00"}]}"#.to_string(),
            deep,
        ];
        for body in unread {
            assert_eq!(by_tree(&body), None, "{body}");
            assert!(
                crate::request::ChatRequest::parse(body.as_bytes()).is_err(),
                "{body}"
            );
        }
    }

    /// Bodies made at random from the parts requests are made of: wherever
    /// the reader reads one, it reads what the tree reads.
    #[test]
    fn random_requests_read_as_the_tree_reads_them() {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: usize| -> usize {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let strings = [
            r#""""#,
            r#""a""#,
            r#""b c""#,
            r#""x\"y""#,
            r#""\u00e9t\u00e9""#,
            r#""\ud83d\ude00""#,
            r#""4111 1111""#,
            r#""1111 1111""#,
            r#""jane@ex""#,
            r#""ample.com""#,
        ];
        let others = [
            "null",
            "7",
            "-0.5e3",
            "true",
            r#"{"k":"v"}"#,
            "[]",
            r#"[1,"s"]"#,
        ];
        let kinds = [
            r#""text""#,
            r#""input_text""#,
            r#""output_text""#,
            r#""image_url""#,
            "3",
            r#""""#,
        ];
        let (mut read, mut total) = (0, 0);
        for _ in 0..3000 {
            let mut pick = |from: &[&str]| from[next(from.len())].to_string();
            let content = |next: &mut dyn FnMut(usize) -> usize| -> String {
                match next(4) {
                    0 | 1 => strings[next(strings.len())].to_string(),
                    2 => others[next(others.len())].to_string(),
                    _ => {
                        let blocks: Vec<String> = (0..next(4))
                            .map(|_| match next(5) {
                                0 => others[next(others.len())].to_string(),
                                1 => format!(r#"{{"text":{}}}"#, strings[next(strings.len())]),
                                _ => format!(
                                    r#"{{"type":{},"text":{}}}"#,
                                    kinds[next(kinds.len())],
                                    if next(5) == 0 {
                                        others[next(others.len())]
                                    } else {
                                        strings[next(strings.len())]
                                    }
                                ),
                            })
                            .collect();
                        format!("[{}]", blocks.join(","))
                    }
                }
            };
            let mut members = vec![format!(r#""model":{}"#, pick(&strings))];
            if next(3) == 0 {
                members.push(format!(r#""system":{}"#, content(&mut next)));
            }
            if next(6) != 0 {
                let msgs: Vec<String> = (0..next(5))
                    .map(|_| match next(8) {
                        0 => others[next(others.len())].to_string(),
                        1 => format!(
                            r#"{{"role":"user","name":{},"content":{}}}"#,
                            strings[next(strings.len())],
                            content(&mut next)
                        ),
                        _ => format!(r#"{{"role":"user","content":{}}}"#, content(&mut next)),
                    })
                    .collect();
                members.push(format!(r#""messages":[{}]"#, msgs.join(",")));
            }
            if next(4) == 0 {
                members.push(format!(r#""metadata":{}"#, others[next(others.len())]));
            }
            let len = members.len();
            members.swap(0, next(len));
            let body = format!("{{{}}}", members.join(","));
            total += 1;
            if let Some(got) = by_read(&body) {
                read += 1;
                assert_eq!(Some(got), by_tree(&body), "{body}");
            }
        }
        assert!(
            read * 2 > total,
            "most are read without a tree: {read} of {total}"
        );
    }
}
