//! WebSocket frames (RFC 6455) read as they pass through the gateway, one
//! direction each: the bytes of a body callback go in, the bytes to pass
//! on come out. Text messages are held until whole (up to a cap) so that
//! the caller reads them (and may replace or drop them), and so are
//! control frames (at most 125 bytes: a close may be dropped); binary
//! messages pass as they come, and a text message past the cap stops the
//! reader (it never passes unread).
//!
//! Written by hand rather than with a WebSocket crate: the crates read
//! frames from a socket they own, where the gateway sees someone else's
//! connection in slices it must pass on; and it runs on every byte of a
//! session, on the filter's hot path (it copies only the text it holds).

// Frame lengths come from the network: every sum saturates or is checked.
#![deny(clippy::arithmetic_side_effects)]

/// Who sent the frames: a client's must be masked, a server's must not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

/// A frame that breaks the protocol: the session cannot go on (close code
/// 1002).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError(pub &'static str);

/// A whole message (or a close frame) as the caller sees it.
#[derive(Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// A text message's payload, unmasked (not checked for UTF-8).
    Text(&'a [u8]),
    /// A close frame: its status code (1005 when it has none).
    Close(u16),
}

/// What the caller does with a text message (or a close frame).
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// Sent as this payload instead (one frame).
    Replace(Vec<u8>),
    /// Sent as these text messages instead (none: dropped).
    Messages(Vec<Vec<u8>>),
    Drop,
}

/// Text messages are held and read whole up to a cap (the Realtime
/// gateway's: the key's `limits.max_body_bytes`, 32 MiB by default, over
/// the 15 MiB an audio append may carry); a larger one breaks the session
/// ([`OVERSIZED`]), never passes unread (#61).
pub const DEFAULT_CAP: usize = 32 << 20;

/// The frame error of a text message past the cap.
pub const OVERSIZED: &str = "a text message is larger than the gateway reads whole";

const OP_CONT: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

/// The frame being read.
#[derive(Debug, Default)]
struct Frame {
    opcode: u8,
    fin: bool,
    mask: Option<[u8; 4]>,
    /// Payload bytes still to come.
    left: u64,
    /// Payload bytes seen (the mask's phase).
    seen: u64,
    /// Its bytes are held (part of a text message being read).
    held: bool,
}

/// One direction of a WebSocket session.
#[derive(Debug)]
pub struct Frames {
    side: Side,
    cap: usize,
    /// A frame header's bytes so far (at most 14).
    head: Vec<u8>,
    frame: Option<Frame>,
    /// A data message is open (its first frame had no FIN): its opcode.
    open: Option<u8>,
    /// The open text message is being read (held); false past the cap or
    /// for binary.
    reading: bool,
    /// The text message being read, unmasked.
    text: Vec<u8>,
    /// Its frames' bytes as they came.
    raw: Vec<u8>,
    /// A control frame's payload, unmasked (at most 125 bytes), and its
    /// bytes as they came (held until it ends: a close can be dropped).
    control: Vec<u8>,
    control_raw: Vec<u8>,
    /// A masking key for frames this side makes (a client's).
    key: [u8; 4],
    /// The last message ended was passed as it came.
    as_is: bool,
    /// Broken: nothing more is read or passed.
    pub error: Option<FrameError>,
    /// Data messages that passed whole, and bytes seen, for the record.
    pub messages: u64,
    pub bytes: u64,
}

/// From here on the output differs from the chunk: it starts with the
/// bytes passed as they are so far.
fn divert<'o>(out: &'o mut Option<Vec<u8>>, chunk: &[u8], passed: usize) -> &'o mut Vec<u8> {
    out.get_or_insert_with(|| chunk.get(..passed).unwrap_or_default().to_vec())
}

impl Frames {
    pub fn new(side: Side, cap: usize, key: [u8; 4]) -> Frames {
        Frames {
            side,
            cap,
            head: Vec::with_capacity(14),
            frame: None,
            open: None,
            reading: false,
            text: Vec::new(),
            raw: Vec::new(),
            control: Vec::new(),
            control_raw: Vec::new(),
            key,
            as_is: false,
            error: None,
            messages: 0,
            bytes: 0,
        }
    }

    /// Read a slice of the stream: the bytes to pass on, `None` when they
    /// are the slice as it came. On a frame error what was already whole
    /// passes and nothing after it (`error` says why).
    pub fn feed(
        &mut self,
        chunk: &[u8],
        visit: &mut dyn FnMut(Message<'_>) -> Verdict,
    ) -> Option<Vec<u8>> {
        self.bytes = self.bytes.saturating_add(chunk.len() as u64);
        if self.error.is_some() {
            return Some(Vec::new());
        }
        // Until the output stops being a prefix of the chunk, `passed`
        // counts the bytes that pass as they are and no copy is made. A
        // text message held whole inside the chunk is not copied either:
        // `lazy` is where it starts (its raw bytes are the chunk's, up to
        // `lazy_end`), and a message passed as it came costs no copy.
        let mut out: Option<Vec<u8>> = None;
        let mut passed = 0usize;
        let mut at = 0usize;
        let mut lazy: Option<usize> = None;
        let mut lazy_end = 0usize;
        while at < chunk.len() {
            let rest = chunk.get(at..).unwrap_or_default();
            if self.frame.is_none() {
                let start = at;
                let carried = !self.head.is_empty();
                let (used, whole) = self.read_head(rest);
                at = at.saturating_add(used);
                if !whole {
                    // A header split across slices: sent when whole.
                    divert(&mut out, chunk, passed);
                    break;
                }
                if let Err(e) = self.start_frame() {
                    divert(&mut out, chunk, passed);
                    self.head.clear();
                    self.error = Some(e);
                    lazy = None;
                    break;
                }
                let held = self.frame.as_ref().is_some_and(|f| f.held);
                let control = self.frame.as_ref().is_some_and(|f| f.opcode >= OP_CLOSE);
                if control || (!held && lazy.is_some()) {
                    if let Some(l) = lazy.take() {
                        if control {
                            // A control frame inside a held message: the
                            // message's bytes so far are copied after all.
                            self.raw
                                .extend_from_slice(chunk.get(l..lazy_end).unwrap_or_default());
                            divert(&mut out, chunk, passed);
                        } else {
                            // Past the cap: what was held passes as it came.
                            passed = start;
                        }
                    }
                }
                if control {
                    divert(&mut out, chunk, passed);
                    self.control_raw.extend_from_slice(&self.head);
                    self.head.clear();
                    if self.frame.as_ref().is_some_and(|f| f.left == 0) {
                        if let Some(emit) = self.end_frame(visit) {
                            divert(&mut out, chunk, passed).extend(emit);
                        }
                    }
                    continue;
                }
                if !held && !self.raw.is_empty() {
                    // A text message past the cap: what was held goes first.
                    let raw = std::mem::take(&mut self.raw);
                    divert(&mut out, chunk, passed).extend(raw);
                }
                if held {
                    if lazy.is_some() {
                        lazy_end = at;
                    } else if out.is_none() && !carried && self.raw.is_empty() {
                        lazy = Some(start);
                        lazy_end = at;
                    } else {
                        divert(&mut out, chunk, passed);
                        self.raw.extend_from_slice(&self.head);
                    }
                } else if carried || out.is_some() {
                    divert(&mut out, chunk, passed).extend_from_slice(&self.head);
                } else {
                    passed = at;
                }
                self.head.clear();
            } else {
                let used = self.payload(rest);
                let bytes = rest.get(..used).unwrap_or_default();
                at = at.saturating_add(used);
                if self.frame.as_ref().is_some_and(|f| f.opcode >= OP_CLOSE) {
                    divert(&mut out, chunk, passed);
                    self.control_raw.extend_from_slice(bytes);
                } else if self.frame.as_ref().is_some_and(|f| f.held) {
                    if lazy.is_some() {
                        lazy_end = at;
                    } else {
                        divert(&mut out, chunk, passed);
                        self.raw.extend_from_slice(bytes);
                    }
                } else if let Some(o) = out.as_mut() {
                    o.extend_from_slice(bytes);
                } else {
                    passed = at;
                }
            }
            if self.frame.as_ref().is_some_and(|f| f.left == 0) {
                let emit = self.end_frame(visit);
                match (lazy, emit) {
                    // The held message passed as it came: nothing copied.
                    (Some(_), Some(_)) if self.as_is => {
                        lazy = None;
                        passed = at;
                    }
                    (Some(_), Some(emit)) => {
                        lazy = None;
                        divert(&mut out, chunk, passed).extend(emit);
                    }
                    (_, Some(emit)) => divert(&mut out, chunk, passed).extend(emit),
                    (_, None) => {}
                }
            }
        }
        if let Some(l) = lazy {
            // The message goes on in the next slice: its bytes so far held.
            self.raw
                .extend_from_slice(chunk.get(l..lazy_end).unwrap_or_default());
            divert(&mut out, chunk, passed);
        }
        out
    }

    /// Header bytes from `rest` into `head`: how many were taken and
    /// whether the header is whole.
    fn read_head(&mut self, rest: &[u8]) -> (usize, bool) {
        let mut used = 0usize;
        loop {
            let need = head_len(&self.head);
            if self.head.len() >= need {
                return (used, true);
            }
            let want = need.saturating_sub(self.head.len());
            let take = rest.get(used..).unwrap_or_default();
            let n = want.min(take.len());
            if n == 0 {
                return (used, false);
            }
            self.head
                .extend_from_slice(take.get(..n).unwrap_or_default());
            used = used.saturating_add(n);
        }
    }

    /// A whole header read: the frame checked and begun.
    fn start_frame(&mut self) -> Result<(), FrameError> {
        let h = &self.head;
        let b0 = h.first().copied().unwrap_or(0);
        let b1 = h.get(1).copied().unwrap_or(0);
        let fin = b0 & 0x80 != 0;
        let opcode = b0 & 0x0F;
        if b0 & 0x70 != 0 {
            return Err(FrameError(
                "a frame has reserved bits set (no extension was negotiated)",
            ));
        }
        let masked = b1 & 0x80 != 0;
        let (len, at) = match b1 & 0x7F {
            126 => (
                u64::from(u16::from_be_bytes([byte(h, 2), byte(h, 3)])),
                4usize,
            ),
            127 => {
                let mut b = [0u8; 8];
                for (i, x) in b.iter_mut().enumerate() {
                    *x = byte(h, i.saturating_add(2));
                }
                let n = u64::from_be_bytes(b);
                if n >> 63 != 0 {
                    return Err(FrameError(
                        "a frame's length has its most significant bit set",
                    ));
                }
                (n, 10)
            }
            n => (u64::from(n), 2),
        };
        let mask = masked.then(|| {
            [
                byte(h, at),
                byte(h, at.saturating_add(1)),
                byte(h, at.saturating_add(2)),
                byte(h, at.saturating_add(3)),
            ]
        });
        match (self.side, masked) {
            (Side::Client, false) => return Err(FrameError("a client's frame is not masked")),
            (Side::Server, true) => return Err(FrameError("a server's frame is masked")),
            _ => {}
        }
        let control = opcode >= OP_CLOSE;
        match opcode {
            OP_CLOSE | OP_PING | OP_PONG => {
                if !fin {
                    return Err(FrameError("a control frame is fragmented"));
                }
                if len > 125 {
                    return Err(FrameError("a control frame's payload is over 125 bytes"));
                }
            }
            OP_CONT if self.open.is_none() => {
                return Err(FrameError(
                    "a continuation frame without a message to continue",
                ))
            }
            OP_TEXT | OP_BINARY if self.open.is_some() => {
                return Err(FrameError("a new message began inside a fragmented one"))
            }
            OP_CONT | OP_TEXT | OP_BINARY => {}
            _ => return Err(FrameError("a frame has a reserved opcode")),
        }
        let mut held = false;
        if !control {
            let kind = if opcode == OP_CONT {
                self.open.unwrap_or(OP_BINARY)
            } else {
                self.reading = opcode == OP_TEXT;
                opcode
            };
            if kind == OP_TEXT && self.reading {
                let fits = usize::try_from(len)
                    .ok()
                    .and_then(|n| n.checked_add(self.text.len()))
                    .is_some_and(|n| n <= self.cap);
                if !fits {
                    // Past the cap: nothing of it passes unread.
                    self.reading = false;
                    self.text = Vec::new();
                    return Err(FrameError(OVERSIZED));
                }
                held = true;
            }
        }
        self.frame = Some(Frame {
            opcode,
            fin,
            mask,
            left: len,
            seen: 0,
            held,
        });
        Ok(())
    }

    /// Payload bytes of the current frame from `rest`: how many it takes.
    fn payload(&mut self, rest: &[u8]) -> usize {
        let Some(f) = self.frame.as_mut() else {
            return 0;
        };
        let n = usize::try_from(f.left).map_or(rest.len(), |l| l.min(rest.len()));
        let bytes = rest.get(..n).unwrap_or_default();
        let keep = if f.opcode >= OP_CLOSE {
            Some(&mut self.control)
        } else if f.held {
            Some(&mut self.text)
        } else {
            None
        };
        if let Some(keep) = keep {
            let from = keep.len();
            keep.extend_from_slice(bytes);
            if let (Some(m), Some(dst)) = (f.mask, keep.get_mut(from..)) {
                unmask(dst, m, f.seen);
            }
        }
        f.left = f.left.saturating_sub(n as u64);
        f.seen = f.seen.saturating_add(n as u64);
        n
    }

    /// A frame read to its end: a message's end read by the caller. The
    /// bytes to send in place of what was held, if any.
    fn end_frame(&mut self, visit: &mut dyn FnMut(Message<'_>) -> Verdict) -> Option<Vec<u8>> {
        let f = self.frame.take()?;
        if f.opcode >= OP_CLOSE {
            let raw = std::mem::take(&mut self.control_raw);
            let verdict = if f.opcode == OP_CLOSE {
                let code = match self.control.get(..2) {
                    Some(&[a, b]) => u16::from_be_bytes([a, b]),
                    _ => 1005,
                };
                visit(Message::Close(code))
            } else {
                Verdict::Pass
            };
            self.control.clear();
            return Some(match verdict {
                Verdict::Pass => raw,
                Verdict::Replace(p) => self.frame_of(OP_CLOSE, &p),
                Verdict::Messages(_) | Verdict::Drop => Vec::new(),
            });
        }
        if f.opcode != OP_CONT && !f.fin {
            self.open = Some(f.opcode);
        }
        if !f.fin {
            return None;
        }
        self.open = None;
        self.messages = self.messages.saturating_add(1);
        if !f.held {
            return None;
        }
        self.reading = false;
        let mut text = std::mem::take(&mut self.text);
        let raw = std::mem::take(&mut self.raw);
        let verdict = visit(Message::Text(&text));
        // The buffer is kept for the next message (no allocation a message).
        text.clear();
        self.text = text;
        self.as_is = verdict == Verdict::Pass;
        Some(match verdict {
            Verdict::Pass => raw,
            Verdict::Replace(p) => self.frame_of(OP_TEXT, &p),
            Verdict::Messages(m) => m.iter().flat_map(|p| self.frame_of(OP_TEXT, p)).collect(),
            Verdict::Drop => Vec::new(),
        })
    }

    /// A frame this side makes: masked when it is a client's.
    pub fn frame_of(&self, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mask = (self.side == Side::Client).then_some(self.key);
        encode(opcode, payload, mask)
    }

    /// A text message this side sends.
    pub fn text_frame(&self, payload: &[u8]) -> Vec<u8> {
        self.frame_of(OP_TEXT, payload)
    }

    /// A close frame this side sends: its code and reason (cut to fit the
    /// 125 bytes of a control frame, at a character's boundary).
    pub fn close_frame(&self, code: u16, reason: &str) -> Vec<u8> {
        let mut end = reason.len().min(123);
        while !reason.is_char_boundary(end) {
            end = end.saturating_sub(1);
        }
        let mut p = code.to_be_bytes().to_vec();
        p.extend_from_slice(reason.get(..end).unwrap_or_default().as_bytes());
        self.frame_of(OP_CLOSE, &p)
    }
}

fn byte(h: &[u8], i: usize) -> u8 {
    h.get(i).copied().unwrap_or(0)
}

/// A header's whole length, known from its first two bytes (2 until then).
fn head_len(h: &[u8]) -> usize {
    let Some(&b1) = h.get(1) else {
        return 2;
    };
    let ext = match b1 & 0x7F {
        126 => 2usize,
        127 => 8,
        _ => 0,
    };
    let mask = if b1 & 0x80 != 0 { 4usize } else { 0 };
    2usize.saturating_add(ext).saturating_add(mask)
}

/// XOR a payload's bytes with the mask, `seen` bytes into the payload:
/// eight bytes at a time (a byte at a time cost ~8 instructions a byte).
fn unmask(dst: &mut [u8], m: [u8; 4], seen: u64) {
    let phase = (seen % 4) as usize;
    let mut key = [0u8; 8];
    for (i, k) in key.iter_mut().enumerate() {
        *k = m.get(i.wrapping_add(phase) % 4).copied().unwrap_or(0);
    }
    let word = u64::from_ne_bytes(key);
    let mut words = dst.chunks_exact_mut(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        w.copy_from_slice(&(u64::from_ne_bytes(b) ^ word).to_ne_bytes());
    }
    for (b, k) in words.into_remainder().iter_mut().zip(key) {
        *b ^= k;
    }
}

/// One whole frame (FIN set).
pub fn encode(opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let len = payload.len();
    let mut out = Vec::with_capacity(len.saturating_add(14));
    out.push(0x80 | (opcode & 0x0F));
    let m = if mask.is_some() { 0x80u8 } else { 0 };
    if len < 126 {
        out.push(m | len as u8);
    } else if let Ok(n) = u16::try_from(len) {
        out.push(m | 126);
        out.extend_from_slice(&n.to_be_bytes());
    } else {
        out.push(m | 127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
    match mask {
        Some(k) => {
            out.extend_from_slice(&k);
            let from = out.len();
            out.extend_from_slice(payload);
            if let Some(dst) = out.get_mut(from..) {
                unmask(dst, k, 0);
            }
        }
        None => out.extend_from_slice(payload),
    }
    out
}

#[cfg(test)]
#[path = "websocket_tests.rs"]
mod tests;
