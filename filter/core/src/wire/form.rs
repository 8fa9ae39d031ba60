//! `multipart/form-data` bodies (RFC 7578), read just enough: where each
//! part's value lies and what it is called. The gateway reads the text
//! fields (`model`, `prompt`, `n`, `size`, ...) and never looks into a
//! file's bytes; the body goes on as it came, the model id spliced in.
//!
//! Hand-written rather than a crate's: the well-kept readers (`multer`)
//! are async stream parsers on tokio, and the filter holds the body whole
//! already; this reads a buffer with `memchr`'s searcher, allocates only the
//! parts' names, and refuses anything it cannot read whole (a body that ends
//! before its closing boundary, a part without a name) with a 400.

use crate::error::GatewayError;
use memchr::memmem;
use serde_json::{Map, Value};

/// Parts a body may have (OpenAI's edits take up to 16 images).
const MAX_PARTS: usize = 256;
/// Bytes of one part's headers.
const MAX_HEADERS: usize = 8 * 1024;

/// One part: its name, its file name if it is a file, and where its value
/// lies in the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub name: String,
    pub filename: Option<String>,
    pub value: (usize, usize),
}

/// A body's parts, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Form {
    pub boundary: String,
    pub parts: Vec<Part>,
}

fn bad(message: impl Into<String>) -> GatewayError {
    GatewayError::bad_request("invalid_multipart", message)
}

/// The boundary a `Content-Type: multipart/form-data; boundary=...` names.
pub fn boundary(content_type: &str) -> Option<&str> {
    let mut params = content_type.split(';');
    let kind = params.next()?.trim();
    if !kind.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.find_map(|p| {
        let (k, v) = p.split_once('=')?;
        if !k.trim().eq_ignore_ascii_case("boundary") {
            return None;
        }
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(v);
        // RFC 2046: 1 to 70 characters.
        (!v.is_empty() && v.len() <= 70).then_some(v)
    })
}

/// A `Content-Disposition` parameter's value (`name="model"`), quoted or
/// not; `\"` inside quotes is a quote.
fn param(disposition: &str, key: &str) -> Option<String> {
    let mut rest = disposition;
    while let Some(semi) = rest.find(';') {
        rest = rest.get(semi.checked_add(1)?..)?.trim_start();
        let (k, v) = rest.split_once('=')?;
        let matched = k.trim().eq_ignore_ascii_case(key);
        let v = v.trim_start();
        if let Some(quoted) = v.strip_prefix('"') {
            let mut out = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            out.push(n);
                        }
                    }
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    c => out.push(c),
                }
            }
            let end = end?;
            if matched {
                return Some(out);
            }
            rest = quoted.get(end.checked_add(1)?..)?;
        } else {
            let value = v.split(';').next().unwrap_or("").trim();
            if matched {
                return Some(value.to_string());
            }
            rest = v;
            if !rest.contains(';') {
                return None;
            }
        }
    }
    None
}

/// Read a body's parts.
pub fn parse(body: &[u8], boundary: &str) -> Result<Form, GatewayError> {
    let delimiter = format!("--{boundary}");
    let d = delimiter.as_bytes();
    let closing = || {
        bad(format!(
            "The multipart body ends before its closing boundary (`--{boundary}--`): send the whole body."
        ))
    };
    // The first delimiter starts the body or a line (a preamble before it
    // is ignored, as RFC 2046 says).
    let mut at = if body.starts_with(d) {
        0
    } else {
        let mut needle = b"\r\n".to_vec();
        needle.extend_from_slice(d);
        memmem::find(body, &needle)
            .and_then(|i| i.checked_add(2))
            .ok_or_else(|| {
                bad(format!(
                    "The body has no multipart boundary `--{boundary}`."
                ))
            })?
    };
    let next = {
        let mut n = b"\r\n".to_vec();
        n.extend_from_slice(d);
        n
    };
    let finder = memmem::Finder::new(&next);
    let mut parts = Vec::new();
    loop {
        let after = at.checked_add(d.len()).ok_or_else(closing)?;
        let rest = body.get(after..).ok_or_else(closing)?;
        if rest.starts_with(b"--") {
            return Ok(Form {
                boundary: boundary.to_string(),
                parts,
            });
        }
        // Transport padding, then the line's end.
        let pad = rest
            .iter()
            .take_while(|b| **b == b' ' || **b == b'\t')
            .count();
        if !rest.get(pad..).is_some_and(|r| r.starts_with(b"\r\n")) {
            return Err(if rest.len() <= pad {
                closing()
            } else {
                bad("A multipart boundary line has bytes after the boundary.")
            });
        }
        let head_start = after.saturating_add(pad).saturating_add(2);
        let head = body.get(head_start..).ok_or_else(closing)?;
        let head_len = memmem::find(head, b"\r\n\r\n").ok_or_else(|| {
            if head.len() > MAX_HEADERS {
                bad("A multipart part's headers are too long.")
            } else {
                closing()
            }
        })?;
        if head_len > MAX_HEADERS {
            return Err(bad("A multipart part's headers are too long."));
        }
        let headers = std::str::from_utf8(head.get(..head_len).unwrap_or_default())
            .map_err(|_| bad("A multipart part's headers are not UTF-8."))?;
        let disposition = headers
            .split("\r\n")
            .find_map(|line| {
                let (k, v) = line.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("content-disposition")
                    .then_some(v)
            })
            .ok_or_else(|| bad("A multipart part has no Content-Disposition header."))?;
        let name = param(disposition, "name")
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad("A multipart part has no `name`."))?;
        let filename = param(disposition, "filename");
        let value_start = head_start.saturating_add(head_len).saturating_add(4);
        let value = body.get(value_start..).ok_or_else(closing)?;
        let len = finder.find(value).ok_or_else(closing)?;
        let value_end = value_start.saturating_add(len);
        parts.push(Part {
            name,
            filename,
            value: (value_start, value_end),
        });
        if parts.len() > MAX_PARTS {
            return Err(bad(format!(
                "The multipart body has more than {MAX_PARTS} parts."
            )));
        }
        // The next delimiter, after its CRLF.
        at = value_end.saturating_add(2);
    }
}

impl Form {
    /// The first part of a name.
    pub fn part(&self, name: &str) -> Option<&Part> {
        self.parts.iter().find(|p| p.name == name)
    }

    /// A part's value in the body.
    pub fn value<'b>(&self, body: &'b [u8], p: &Part) -> &'b [u8] {
        body.get(p.value.0..p.value.1).unwrap_or_default()
    }

    /// The text fields (parts that are not files, UTF-8) as a JSON object
    /// of strings, the first of each name: what guardrails and rules read.
    pub fn fields(&self, body: &[u8]) -> Map<String, Value> {
        let mut out = Map::new();
        let mut seen: Vec<&str> = Vec::new();
        for p in self.parts.iter().filter(|p| p.filename.is_none()) {
            // The first part of a name is the field, text or not.
            if seen.contains(&p.name.as_str()) {
                continue;
            }
            seen.push(&p.name);
            if let Ok(text) = std::str::from_utf8(self.value(body, p)) {
                out.insert(p.name.clone(), Value::String(text.to_string()));
            }
        }
        out
    }

    /// The body with text fields' values replaced (each part whose name
    /// `fields` holds as a string; the first of each name, as `fields`
    /// reads them): every other byte as it came.
    pub fn rewrite(&self, body: &[u8], fields: &Map<String, Value>) -> Vec<u8> {
        let mut out = Vec::with_capacity(body.len());
        let mut from = 0;
        let mut seen: Vec<&str> = Vec::new();
        for p in self.parts.iter().filter(|p| p.filename.is_none()) {
            if seen.contains(&p.name.as_str()) {
                continue;
            }
            seen.push(&p.name);
            let Some(Value::String(v)) = fields.get(&p.name) else {
                continue;
            };
            out.extend_from_slice(body.get(from..p.value.0).unwrap_or_default());
            out.extend_from_slice(v.as_bytes());
            from = p.value.1;
        }
        out.extend_from_slice(body.get(from..).unwrap_or_default());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const B: &str = "xYz123";

    fn body(parts: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, file, value) in parts {
            out.extend_from_slice(format!("--{B}\r\n").as_bytes());
            match file {
                Some(f) => out.extend_from_slice(
                    format!("Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\nContent-Type: audio/wav\r\n\r\n").as_bytes(),
                ),
                None => out.extend_from_slice(
                    format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes(),
                ),
            }
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(format!("--{B}--\r\n").as_bytes());
        out
    }

    #[test]
    fn the_boundary_is_read_from_the_content_type() {
        assert_eq!(boundary("multipart/form-data; boundary=abc"), Some("abc"));
        assert_eq!(
            boundary("Multipart/Form-Data;charset=utf-8; BOUNDARY=\"a b\""),
            Some("a b")
        );
        assert_eq!(boundary("multipart/form-data"), None);
        assert_eq!(boundary("application/json; boundary=x"), None);
        assert_eq!(boundary("multipart/form-data; boundary="), None);
    }

    #[test]
    fn text_fields_and_files_are_found_and_a_file_is_never_read() {
        // A file whose bytes look like a boundary line without its CRLF.
        let wav: &[u8] = b"RIFF\x00\x01--xYz123 not a boundary\r\nstill the file";
        let b = body(&[
            ("file", Some("a.wav"), wav),
            ("model", None, b"whisper-1"),
            ("prompt", None, b"say \"hi\""),
        ]);
        let f = parse(&b, B).unwrap();
        assert_eq!(f.parts.len(), 3);
        assert_eq!(f.parts[0].filename.as_deref(), Some("a.wav"));
        assert_eq!(f.value(&b, &f.parts[0]), wav);
        let fields = f.fields(&b);
        assert_eq!(fields["model"], "whisper-1");
        assert_eq!(fields["prompt"], "say \"hi\"");
        assert!(!fields.contains_key("file"));
        let mut changed = fields.clone();
        changed.insert("model".into(), Value::String("provider/whisper".into()));
        let out = f.rewrite(&b, &changed);
        let again = parse(&out, B).unwrap();
        assert_eq!(again.fields(&out)["model"], "provider/whisper");
        assert_eq!(again.value(&out, &again.parts[0]), wav);
        assert_eq!(
            out.len(),
            b.len() + "provider/whisper".len() - "whisper-1".len()
        );
    }

    #[test]
    fn bodies_that_cannot_be_read_whole_are_refused() {
        let whole = body(&[("model", None, b"m"), ("file", Some("x"), b"abc")]);
        for cut in [whole.len() - 3, whole.len() - 12, 40, 10] {
            let e = parse(&whole[..cut], B).unwrap_err();
            assert_eq!((e.status, e.code), (400, "invalid_multipart"), "{cut}");
        }
        let never_ends = format!(
            "--{B}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\n{}",
            "x".repeat(5000)
        );
        let e = parse(never_ends.as_bytes(), B).unwrap_err();
        assert!(e.message.contains("closing boundary"), "{}", e.message);
        for bad_body in [
            "no boundary here".to_string(),
            format!("--{B}\r\nContent-Type: text/plain\r\n\r\nv\r\n--{B}--"),
            format!("--{B}\r\nContent-Disposition: form-data\r\n\r\nv\r\n--{B}--"),
            format!("--{B}junk\r\nContent-Disposition: form-data; name=a\r\n\r\nv\r\n--{B}--"),
            format!("--{B}\r\n{}\r\n\r\nv\r\n--{B}--", "X: y\r\n".repeat(3000)),
        ] {
            let e = parse(bad_body.as_bytes(), B).unwrap_err();
            assert_eq!(e.code, "invalid_multipart", "{bad_body:.80}");
        }
    }

    #[test]
    fn names_are_read_quoted_or_not_with_escapes() {
        assert_eq!(
            param("form-data; name=model", "name").as_deref(),
            Some("model")
        );
        assert_eq!(
            param("form-data; filename=\"a;b\\\".wav\"; name=\"file\"", "name").as_deref(),
            Some("file")
        );
        assert_eq!(
            param("form-data; name=\"file\"; filename=\"a;b.wav\"", "filename").as_deref(),
            Some("a;b.wav")
        );
        assert_eq!(param("form-data; name=\"open", "name"), None);
        assert_eq!(param("form-data", "name"), None);
    }
}
