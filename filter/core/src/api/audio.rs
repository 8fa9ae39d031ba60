//! OpenAI's audio: `POST /v1/audio/speech` (JSON: `model`, `input`,
//! `voice`; the answer is the audio's bytes, passed as they come, never
//! read) and `POST /v1/audio/transcriptions` and `/translations`
//! (multipart: a `file`, `model`, optional `prompt`, `language`,
//! `response_format`). Speech is priced per input character
//! (`price.per_million_characters`), transcriptions per second of audio
//! as the answer's `usage.seconds` reports it (`price.per_audio_minute`),
//! or by tokens when the answer's `usage` counts them (`gpt-4o-transcribe`).
//! Served by OpenAI-compatible and Azure OpenAI providers.

use super::Units;
use crate::error::GatewayError;
use serde_json::{Map, Value};

pub const SPEECH: &str = "/v1/audio/speech";
pub const TRANSCRIPTIONS: &str = "/v1/audio/transcriptions";
pub const TRANSLATIONS: &str = "/v1/audio/translations";

/// Speech: a non-empty `input` string, `voice` given; its characters are
/// the units.
pub fn speech_units(doc: &Map<String, Value>) -> Result<Units, GatewayError> {
    let chars = match doc.get("input") {
        Some(Value::String(s)) if !s.is_empty() => s.chars().count() as u64,
        Some(_) => {
            return Err(GatewayError::bad_request(
                "invalid_input",
                "`input` must be a non-empty string.",
            ))
        }
        None => {
            return Err(GatewayError::bad_request(
                "missing_input",
                "Missing required parameter: `input`.",
            ))
        }
    };
    if doc.get("voice").is_none() {
        return Err(GatewayError::bad_request(
            "missing_voice",
            "Missing required parameter: `voice`.",
        ));
    }
    Ok(Units {
        count: chars,
        image: None,
    })
}

/// A transcription or translation: a `file` part. Its seconds come with
/// the answer (`usage.seconds`); a WAV file's are read from its header
/// too, for answers that do not say (`response_format: text`, and
/// translations, whose answers carry no usage).
pub fn file_units(form: &crate::wire::form::Form, body: &[u8]) -> Result<Units, GatewayError> {
    let Some(file) = form.part("file") else {
        return Err(GatewayError::bad_request(
            "missing_file",
            "Missing required parameter: `file` (the audio, as a multipart file part).",
        ));
    };
    let seconds = wav_seconds(form.value(body, file)).unwrap_or(0);
    Ok(Units {
        count: seconds,
        image: None,
    })
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    let bytes: [u8; 4] = b.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_le_bytes(bytes))
}

/// A RIFF/WAVE file's whole seconds (rounded up): its `data` chunk's size
/// over the `fmt ` chunk's byte rate; `None` for anything else.
pub fn wav_seconds(b: &[u8]) -> Option<u64> {
    if b.get(..4)? != b"RIFF" || b.get(8..12)? != b"WAVE" {
        return None;
    }
    let mut at = 12usize;
    let mut byte_rate = None;
    // A bounded walk over the chunks (a file may put LIST chunks first).
    for _ in 0..64 {
        let id = b.get(at..at.checked_add(4)?)?;
        let size = le32(b, at.checked_add(4)?)?;
        let data = at.checked_add(8)?;
        match id {
            b"fmt " => byte_rate = le32(b, data.checked_add(8)?),
            b"data" => {
                let rate = u64::from(byte_rate.filter(|r| *r > 0)?);
                return Some(u64::from(size).div_ceil(rate));
            }
            _ => {}
        }
        // Chunks are padded to an even size.
        let padded = usize::try_from(size)
            .ok()?
            .checked_add(usize::try_from(size % 2).ok()?)?;
        at = data.checked_add(padded)?;
    }
    None
}
