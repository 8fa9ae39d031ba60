//! JSON read in place, one level at a time: an object's members with their
//! values still text (borrowed from the body), and readers for the values
//! a translation needs. No tree is built and no string is copied unless it
//! has escapes, so a translation costs about one scan of the body plus the
//! bytes it writes (#24: the tree and its drop were most of a translated
//! request's instructions).
//!
//! The readers are as lenient as `serde_json::Value`'s accessors: a value
//! of another type reads as absent (`None`), never as an error, so the
//! translations decide what is wrong and say it in their own words.

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde::ser::{Serialize, Serializer};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// A JSON object's members in order, each value unparsed.
#[derive(Debug, Default)]
pub struct Obj<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

/// A member name, borrowed when it has no escapes.
pub(crate) struct Key<'a>(pub(crate) Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s)))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> Deserialize<'de> for Obj<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Obj<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Obj<'de>, M::Error> {
                let mut members = Vec::with_capacity(m.size_hint().unwrap_or(8).min(64));
                while let Some(Key(k)) = m.next_key::<Key<'de>>()? {
                    let v = m.next_value::<&'de RawValue>()?;
                    members.push((k, v));
                }
                Ok(Obj(members))
            }
        }
        d.deserialize_map(V)
    }
}

impl<'a> Obj<'a> {
    /// The object a text holds; `None` when it is not one (or not JSON).
    pub fn parse(text: &'a str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }

    /// The object a body holds (UTF-8 JSON).
    pub fn parse_bytes(body: &'a [u8]) -> Option<Self> {
        Self::parse(std::str::from_utf8(body).ok()?)
    }

    /// The object a value holds.
    pub fn of(raw: &'a RawValue) -> Option<Self> {
        raw.get().starts_with('{').then(|| Self::parse(raw.get()))?
    }

    /// A member's value (the last, when a name repeats, as a tree keeps).
    pub fn get(&self, name: &str) -> Option<&'a RawValue> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| *v)
    }

    /// A member that is a string.
    pub fn str(&self, name: &str) -> Option<Cow<'a, str>> {
        self.get(name).and_then(str_of)
    }

    /// A member that is a whole number within `u64`.
    pub fn u64(&self, name: &str) -> Option<u64> {
        self.get(name).and_then(u64_of)
    }

    /// A member that is an object.
    pub fn obj(&self, name: &str) -> Option<Obj<'a>> {
        self.get(name).and_then(Obj::of)
    }

    /// A member that is an array.
    pub fn arr(&self, name: &str) -> Option<Vec<&'a RawValue>> {
        self.get(name).and_then(arr_of)
    }

    /// Whether a member is present and not `null`.
    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some_and(|v| !is_null(v))
    }

    /// The members in order.
    pub fn members(&self) -> impl Iterator<Item = (&str, &'a RawValue)> + '_ {
        self.0.iter().map(|(k, v)| (k.as_ref(), *v))
    }
}

/// A string value, borrowed when it has no escapes.
pub fn str_of(raw: &RawValue) -> Option<Cow<'_, str>> {
    let s = raw.get();
    if !s.starts_with('"') {
        return None;
    }
    if !s.contains('\\') {
        // A JSON string without escapes is its own text between the quotes.
        return s.get(1..s.len().saturating_sub(1)).map(Cow::Borrowed);
    }
    serde_json::from_str::<String>(s).ok().map(Cow::Owned)
}

/// A whole number within `u64`.
pub fn u64_of(raw: &RawValue) -> Option<u64> {
    serde_json::from_str(raw.get()).ok()
}

/// An array's elements.
pub fn arr_of(raw: &RawValue) -> Option<Vec<&RawValue>> {
    raw.get()
        .starts_with('[')
        .then(|| serde_json::from_str(raw.get()).ok())?
}

pub fn is_null(raw: &RawValue) -> bool {
    raw.get() == "null"
}

pub fn is_true(raw: &RawValue) -> bool {
    raw.get() == "true"
}

pub fn is_false(raw: &RawValue) -> bool {
    raw.get() == "false"
}

pub fn is_number(raw: &RawValue) -> bool {
    raw.get()
        .as_bytes()
        .first()
        .is_some_and(|b| *b == b'-' || b.is_ascii_digit())
}

pub fn is_string(raw: &RawValue) -> bool {
    raw.get().starts_with('"')
}

/// A value's text as a JSON string (a tool call's `arguments`).
pub struct AsString<'a>(pub &'a RawValue);

impl Serialize for AsString<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.get())
    }
}

/// A string known to be JSON, parsed as a value of its own (an assistant
/// tool call's `arguments` as Anthropic's `input`); `None` when it does not
/// parse.
pub fn raw_from_text(text: &str) -> Option<Box<RawValue>> {
    serde_json::from_str::<&RawValue>(text)
        .ok()
        .map(|r| r.to_owned())
}

/// A member read in the same pass as its object, as leniently as a tree's
/// `as_str`: a string (borrowed when it has no escapes), anything else
/// `None`. For typed structs whose members may be of any type.
#[derive(Debug, Default)]
pub struct Str<'a>(pub Option<Cow<'a, str>>);

/// A member read in the same pass as its object, as a tree's `as_u64`: a
/// whole number within `u64`, anything else `None`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Count(pub Option<u64>);

/// Reads any value, keeping what `keep` makes of a string or a number.
struct Lenient<T>(std::marker::PhantomData<T>);

trait Keep<'de>: Default {
    fn borrowed(_: &'de str) -> Self {
        Self::default()
    }
    fn owned(_: String) -> Self {
        Self::default()
    }
    fn number(_: Option<u64>) -> Self {
        Self::default()
    }
}

impl<'de: 'a, 'a> Keep<'de> for Str<'a> {
    fn borrowed(s: &'de str) -> Self {
        Str(Some(Cow::Borrowed(s)))
    }
    fn owned(s: String) -> Self {
        Str(Some(Cow::Owned(s)))
    }
}

impl Keep<'_> for Count {
    fn number(n: Option<u64>) -> Self {
        Count(n)
    }
}

impl<'de, T: Keep<'de>> Visitor<'de> for Lenient<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<T, E> {
        Ok(T::borrowed(s))
    }
    fn visit_str<E>(self, s: &str) -> Result<T, E> {
        Ok(T::owned(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<T, E> {
        Ok(T::owned(s))
    }
    fn visit_u64<E>(self, n: u64) -> Result<T, E> {
        Ok(T::number(Some(n)))
    }
    fn visit_i64<E>(self, n: i64) -> Result<T, E> {
        Ok(T::number(u64::try_from(n).ok()))
    }
    fn visit_f64<E>(self, _: f64) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_bool<E>(self, _: bool) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_unit<E>(self) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_none<E>(self) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<T, A::Error> {
        while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(T::default())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<T, A::Error> {
        while a
            .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
            .is_some()
        {}
        Ok(T::default())
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Lenient::<Str<'a>>(std::marker::PhantomData))
    }
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Lenient::<Count>(std::marker::PhantomData))
    }
}

impl<'a> Str<'a> {
    pub fn is(&self, s: &str) -> bool {
        self.0.as_deref() == Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn members_read_as_a_tree_reads_them() {
        let o = Obj::parse(
            r#"{"a": "x", "b": "q\"uote", "n": 16, "f": 1.5, "neg": -1, "o": {"k": [1, 2]}, "a": "last", "z": null, "t": true}"#,
        )
        .unwrap();
        assert_eq!(
            o.str("a").as_deref(),
            Some("last"),
            "the last of a repeated name"
        );
        assert!(
            matches!(o.str("a"), Some(Cow::Borrowed(_))),
            "no escapes: borrowed"
        );
        assert_eq!(o.str("b").as_deref(), Some("q\"uote"));
        assert_eq!(o.u64("n"), Some(16));
        assert_eq!(o.u64("f"), None, "not whole");
        assert_eq!(o.u64("neg"), None, "not within u64");
        assert_eq!(o.str("n"), None, "a number is no string");
        let inner = o.obj("o").unwrap();
        assert_eq!(inner.arr("k").unwrap().len(), 2);
        assert!(o.obj("a").is_none() && o.arr("o").is_none());
        assert!(!o.has("z") && o.get("z").is_some_and(is_null));
        assert!(o.get("t").is_some_and(is_true) && o.get("f").is_some_and(is_number));
        assert!(o.get("neg").is_some_and(is_number) && !o.get("a").is_some_and(is_number));
        let names: Vec<&str> = o.members().map(|(k, _)| k).collect();
        assert_eq!(names, ["a", "b", "n", "f", "neg", "o", "a", "z", "t"]);
    }

    #[test]
    fn what_is_no_object_reads_as_none() {
        for text in ["[1]", "\"s\"", "1", "{", "{\"a\": 1} x", "", "{\"a\" 1}"] {
            assert!(Obj::parse(text).is_none(), "{text}");
        }
        assert!(
            Obj::parse_bytes(b"{\"a\": \"\xff\"}").is_none(),
            "not UTF-8"
        );
    }

    #[test]
    fn escaped_names_and_strings_are_unescaped() {
        let o = Obj::parse(r#"{"n\u0061me": "\u00e9t\u00e9"}"#).unwrap();
        assert_eq!(o.str("name").as_deref(), Some("été"));
    }

    #[test]
    fn lenient_members_read_in_one_pass_as_a_tree_reads_them() {
        #[derive(serde::Deserialize)]
        struct S<'a> {
            #[serde(borrow, default)]
            a: Str<'a>,
            #[serde(default)]
            n: Count,
        }
        let read = |text: &'static str| serde_json::from_str::<S>(text).unwrap();
        let s = read(r#"{"a": "x", "n": 5, "other": [1, {"k": "v"}]}"#);
        assert!(s.a.is("x") && matches!(s.a.0, Some(Cow::Borrowed(_))));
        assert_eq!(s.n.0, Some(5));
        assert_eq!(read(r#"{"a": "\u00e9"}"#).a.0.as_deref(), Some("é"));
        for other in [
            r#"{"a": 1, "n": -1}"#,
            r#"{"a": null, "n": 1.5}"#,
            r#"{"a": [1], "n": "5"}"#,
            r#"{"a": {"x": 1}, "n": {}}"#,
            "{}",
        ] {
            let s = read(other);
            assert!(s.a.0.is_none() && s.n.0.is_none(), "{other}");
        }
    }

    #[test]
    fn a_value_serializes_as_its_text_in_a_string() {
        let raw: &RawValue = serde_json::from_str(r#"{"a": [1, "x"]}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&AsString(raw)).unwrap(),
            r#""{\"a\": [1, \"x\"]}""#
        );
        assert_eq!(raw_from_text(" {\"k\": 1} ").unwrap().get(), "{\"k\": 1}");
        assert!(raw_from_text("{").is_none());
    }
}
