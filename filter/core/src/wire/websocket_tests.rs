use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const KEY: [u8; 4] = [0x12, 0x34, 0x56, 0x78];

/// A frame as a client or server writes it, FIN as given.
fn frame(fin: bool, opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut f = encode(opcode, payload, mask);
    if !fin {
        f[0] &= 0x7F;
    }
    f
}

/// Feed `chunks`; what passed and the messages seen.
fn run(
    side: Side,
    cap: usize,
    chunks: &[&[u8]],
    verdict: fn(&[u8]) -> Verdict,
) -> (Vec<u8>, Vec<String>, Frames) {
    let mut r = Frames::new(side, cap, KEY);
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for c in chunks {
        let mut visit = |m: Message<'_>| match m {
            Message::Text(t) => {
                seen.push(String::from_utf8_lossy(t).into_owned());
                verdict(t)
            }
            Message::Close(code) => {
                seen.push(format!("close {code}"));
                verdict(b"close")
            }
        };
        match r.feed(c, &mut visit) {
            Some(o) => out.extend(o),
            None => out.extend_from_slice(c),
        }
    }
    (out, seen, r)
}

fn pass(_: &[u8]) -> Verdict {
    Verdict::Pass
}

#[test]
fn a_masked_client_message_is_read_unmasked_and_passes_as_it_came() {
    let f = frame(true, 1, br#"{"type":"response.create"}"#, Some(KEY));
    let mut r = Frames::new(Side::Client, DEFAULT_CAP, KEY);
    let mut seen = Vec::new();
    let out = r.feed(&f, &mut |m| {
        if let Message::Text(t) = m {
            seen.push(t.to_vec());
        }
        Verdict::Pass
    });
    // Held whole inside the slice and passed as it came: no copy at all.
    assert_eq!(out, None);
    assert_eq!(seen, vec![br#"{"type":"response.create"}"#.to_vec()]);
    assert_eq!((r.messages, r.bytes), (1, f.len() as u64));
}

#[test]
fn binary_frames_pass_without_a_copy_and_a_close_may_be_dropped() {
    let mut s = frame(true, 2, &[0u8; 300], None);
    let mut r = Frames::new(Side::Server, DEFAULT_CAP, KEY);
    assert_eq!(r.feed(&s, &mut |_| Verdict::Drop), None);
    assert_eq!(r.messages, 1);
    let ping = frame(true, 9, b"hi", None);
    s.extend(&ping);
    s.extend(frame(true, 8, &[0x03, 0xE8], None));
    let (out, seen, _) = run(Side::Server, DEFAULT_CAP, &[&s], |_| Verdict::Drop);
    assert_eq!(seen, vec!["close 1000".to_string()]);
    assert_eq!(out, [frame(true, 2, &[0u8; 300], None), ping].concat());
}

#[test]
fn every_split_of_a_session_passes_the_same_bytes_and_messages() {
    let mut s = frame(true, 1, br#"{"type":"a"}"#, Some(KEY));
    // A fragmented text message with a ping between its frames.
    s.extend(frame(false, 1, br#"{"type":"#, Some([1, 2, 3, 4])));
    s.extend(frame(true, 9, b"ping", Some([9, 9, 9, 9])));
    s.extend(frame(false, 0, br#""b","x":"#, Some([5, 6, 7, 8])));
    s.extend(frame(true, 0, br#"1}"#, Some([0, 0, 0, 1])));
    s.extend(frame(true, 2, &[7u8; 70_000], Some(KEY)));
    s.extend(frame(true, 1, "é".repeat(200).as_bytes(), Some(KEY)));
    s.extend(frame(true, 8, &[0x03, 0xE8, b'b', b'y', b'e'], Some(KEY)));
    let (whole, seen, _) = run(Side::Client, DEFAULT_CAP, &[&s], pass);
    let want = vec![
        r#"{"type":"a"}"#.to_string(),
        r#"{"type":"b","x":1}"#.to_string(),
        "é".repeat(200),
        "close 1000".to_string(),
    ];
    assert_eq!(seen, want);
    // The ping went ahead of the message it interrupted; every byte passed.
    assert_eq!(whole.len(), s.len());
    for cut in 1..s.len().min(400) {
        let (out, seen2, r) = run(Side::Client, DEFAULT_CAP, &[&s[..cut], &s[cut..]], pass);
        assert_eq!(out, whole, "split at {cut}");
        assert_eq!(seen2, want, "split at {cut}");
        assert!(r.error.is_none());
    }
    let bytes: Vec<&[u8]> = s.chunks(1).collect();
    let (out, seen3, _) = run(Side::Client, DEFAULT_CAP, &bytes, pass);
    assert_eq!((out, seen3), (whole, want));
}

#[test]
fn a_message_is_replaced_or_dropped_whole() {
    let mut s = frame(false, 1, b"hel", None);
    s.extend(frame(true, 0, b"lo", None));
    s.extend(frame(true, 1, b"keep", None));
    let (out, _, _) = run(Side::Server, DEFAULT_CAP, &[&s], |t| {
        if t == b"hello" {
            Verdict::Replace(b"HELLO!".to_vec())
        } else {
            Verdict::Pass
        }
    });
    let mut want = encode(1, b"HELLO!", None);
    want.extend(frame(true, 1, b"keep", None));
    assert_eq!(out, want);
    let (out, _, _) = run(Side::Server, DEFAULT_CAP, &[&s], |_| Verdict::Drop);
    assert!(out.is_empty());
    // A client's replacement is masked (a server refuses unmasked frames).
    let r = Frames::new(Side::Client, DEFAULT_CAP, KEY);
    let made = r.text_frame(b"x");
    assert_eq!(made[1] & 0x80, 0x80);
    let (_, seen, _) = run(Side::Client, DEFAULT_CAP, &[&made], pass);
    assert_eq!(seen, vec!["x".to_string()]);
}

/// A text message past the cap is never passed unread (#61): what came
/// whole before it passes, then the reader stops with [`OVERSIZED`] and
/// nothing of the big message nor after it goes on, however it is split
/// (one frame too big, or fragments that grow past the cap).
#[test]
fn text_past_the_cap_stops_the_reader_and_nothing_of_it_passes() {
    let first = frame(true, 1, b"small", Some(KEY));
    for big in [
        {
            let mut s = frame(false, 1, &[b'a'; 60], Some(KEY));
            s.extend(frame(true, 0, &[b'b'; 60], Some(KEY)));
            s
        },
        frame(true, 1, &[b'c'; 101], Some(KEY)),
    ] {
        let mut s = first.clone();
        s.extend(&big);
        s.extend(frame(true, 1, b"after", Some(KEY)));
        for cut in 1..s.len() {
            let (out, seen, r) = run(Side::Client, 100, &[&s[..cut], &s[cut..]], pass);
            assert_eq!(seen, vec!["small".to_string()], "split at {cut}");
            assert_eq!(out, first, "split at {cut}");
            assert_eq!(r.error, Some(FrameError(OVERSIZED)), "split at {cut}");
        }
    }
    // At the cap exactly: read.
    let (_, seen, r) = run(
        Side::Client,
        100,
        &[&frame(true, 1, &[b'd'; 100], Some(KEY))],
        pass,
    );
    assert_eq!((seen.len(), r.error), (1, None));
}

#[test]
fn close_frames_are_seen_with_their_code() {
    let r = Frames::new(Side::Server, DEFAULT_CAP, KEY);
    let long = "ü".repeat(100);
    let c = r.close_frame(1008, &long);
    assert!(c.len() <= 127);
    let (_, seen, _) = run(
        Side::Server,
        DEFAULT_CAP,
        &[&c, &encode(8, &[], None)],
        pass,
    );
    assert_eq!(
        seen,
        vec!["close 1008".to_string(), "close 1005".to_string()]
    );
}

#[test]
fn frames_that_break_the_protocol_stop_the_reader() {
    let big = {
        // A 2^63 length: its most significant bit must be 0.
        let mut f = vec![0x82, 0xFF];
        f.extend_from_slice(&(1u64 << 63).to_be_bytes());
        f.extend_from_slice(&KEY);
        f
    };
    let cases: Vec<(Side, Vec<u8>, &str)> = vec![
        (
            Side::Client,
            frame(true, 1, b"x", None),
            "a client's frame is not masked",
        ),
        (
            Side::Server,
            frame(true, 1, b"x", Some(KEY)),
            "a server's frame is masked",
        ),
        (
            Side::Client,
            big,
            "a frame's length has its most significant bit set",
        ),
        (
            Side::Server,
            vec![0xC1, 0x00],
            "a frame has reserved bits set (no extension was negotiated)",
        ),
        (
            Side::Server,
            vec![0x83, 0x00],
            "a frame has a reserved opcode",
        ),
        (
            Side::Server,
            frame(true, 9, &[0; 126], None),
            "a control frame's payload is over 125 bytes",
        ),
        (
            Side::Server,
            frame(false, 9, b"p", None),
            "a control frame is fragmented",
        ),
        (
            Side::Server,
            frame(true, 0, b"p", None),
            "a continuation frame without a message to continue",
        ),
        (
            Side::Server,
            [frame(false, 1, b"p", None), frame(true, 1, b"q", None)].concat(),
            "a new message began inside a fragmented one",
        ),
    ];
    for (side, bytes, why) in cases {
        let ok = frame(
            true,
            2,
            b"before",
            if side == Side::Client {
                Some(KEY)
            } else {
                None
            },
        );
        let mut s = ok.clone();
        s.extend(&bytes);
        s.extend(&ok);
        let (out, _, r) = run(side, DEFAULT_CAP, &[&s], pass);
        assert_eq!(r.error, Some(FrameError(why)), "{why}");
        assert_eq!(out, ok, "{why}: what came before passes, nothing after");
        let (again, _, _) = run(side, DEFAULT_CAP, &[&s, &ok], pass);
        assert_eq!(again, ok, "{why}: nothing passes once broken");
    }
}

#[test]
fn a_frame_longer_than_any_slice_passes_as_it_comes() {
    let mut head = vec![0x82, 0x7F];
    head.extend_from_slice(&(1u64 << 40).to_be_bytes());
    let mut r = Frames::new(Side::Server, DEFAULT_CAP, KEY);
    assert_eq!(r.feed(&head, &mut |_| Verdict::Pass), None);
    assert_eq!(r.feed(&[0u8; 4096], &mut |_| Verdict::Pass), None);
    assert!(r.error.is_none());
}
