use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn sample() -> Vec<u8> {
    let mut out = encode(
        &[
            (":event-type", "contentBlockDelta"),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        br#"{"contentBlockIndex":0,"delta":{"text":"Hello"},"p":"abcdefgh"}"#,
    );
    out.extend(encode(
        &[(":event-type", "messageStop"), (":message-type", "event")],
        br#"{"stopReason":"end_turn"}"#,
    ));
    out.extend(encode(&[(":event-type", "metadata")], b""));
    out
}

#[test]
fn the_crc_is_crc_32_ieee() {
    // The check value of CRC-32/ISO-HDLC.
    assert_eq!(crc(b"123456789"), 0xCBF4_3926);
}

#[test]
fn messages_decode_at_every_split_point() {
    let bytes = sample();
    let mut whole = Decoder::default();
    let expected = whole.push(&bytes).unwrap();
    assert_eq!(expected.len(), 3);
    assert_eq!(expected[0].header(":event-type"), Some("contentBlockDelta"));
    assert_eq!(
        expected[0].payload,
        br#"{"contentBlockIndex":0,"delta":{"text":"Hello"},"p":"abcdefgh"}"#
    );
    assert_eq!(expected[1].header(":event-type"), Some("messageStop"));
    assert!(expected[2].payload.is_empty());
    for a in 0..=bytes.len() {
        for b in [a, (a + 7).min(bytes.len()), bytes.len()] {
            let mut d = Decoder::default();
            let mut got = d.push(&bytes[..a]).unwrap();
            got.extend(d.push(&bytes[a..b]).unwrap());
            got.extend(d.push(&bytes[b..]).unwrap());
            assert_eq!(got, expected, "split at {a} and {b}");
            assert!(!d.pending());
        }
    }
    // Byte by byte.
    let mut d = Decoder::default();
    let got: Vec<Message> = bytes
        .iter()
        .flat_map(|b| d.push(std::slice::from_ref(b)).unwrap())
        .collect();
    assert_eq!(got, expected);
}

#[test]
fn a_corrupted_crc_fails_the_stream_for_good() {
    let good = sample();
    // A flipped bit in the payload: the message CRC.
    let mut bad = good.clone();
    bad[40] ^= 0x01;
    let mut d = Decoder::default();
    assert_eq!(d.push(&bad), Err(FrameError::MessageCrc));
    assert_eq!(d.push(&good), Err(FrameError::MessageCrc), "stays failed");
    // A flipped bit in the length: the prelude CRC.
    let mut bad = good.clone();
    bad[2] ^= 0x10;
    assert_eq!(Decoder::default().push(&bad), Err(FrameError::PreludeCrc));
    // The second message's CRC: the first still comes out on its own push.
    let first_len = u32::from_be_bytes(good[..4].try_into().unwrap()) as usize;
    let mut bad = good.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    let mut d = Decoder::default();
    assert_eq!(d.push(&bad[..first_len]).unwrap().len(), 1);
    assert_eq!(d.push(&bad[first_len..]), Err(FrameError::MessageCrc));
}

fn framed(total: u32, headers_len: u32, rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&total.to_be_bytes());
    out.extend_from_slice(&headers_len.to_be_bytes());
    let c = crc(&out);
    out.extend_from_slice(&c.to_be_bytes());
    out.extend_from_slice(rest);
    out
}

#[test]
fn lengths_out_of_bounds_are_refused_before_buffering() {
    // Too short, too long, headers longer than the message.
    for (total, headers) in [(8, 0), (u32::MAX, 0), (32, 20), (20_000_000, 0)] {
        assert_eq!(
            Decoder::default().push(&framed(total, headers, &[])),
            Err(FrameError::Length),
            "total {total}, headers {headers}"
        );
    }
}

#[test]
fn headers_of_every_type_are_skipped_and_bad_ones_refused() {
    // bool true, byte, short, int, long, bytes, timestamp, uuid, then a
    // string: only the string is kept.
    let mut h = Vec::new();
    let mut add = |name: &str, kind: u8, value: &[u8]| {
        h.push(name.len() as u8);
        h.extend_from_slice(name.as_bytes());
        h.push(kind);
        h.extend_from_slice(value);
    };
    add("t", 0, &[]);
    add("b", 2, &[7]);
    add("s", 3, &[0, 1]);
    add("i", 4, &[0, 0, 0, 1]);
    add("l", 5, &[0; 8]);
    add("y", 6, &[0, 3, 1, 2, 3]);
    add("ts", 8, &[0; 8]);
    add("u", 9, &[0; 16]);
    add(":event-type", 7, &[0, 4, b'p', b'i', b'n', b'g']);
    let total = 12 + h.len() + 2 + 4;
    let mut msg = framed(total as u32, h.len() as u32, &h);
    msg.extend_from_slice(b"{}");
    let c = crc(&msg);
    msg.extend_from_slice(&c.to_be_bytes());
    let got = Decoder::default().push(&msg).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].headers, vec![(":event-type".into(), "ping".into())]);
    assert_eq!(got[0].payload, b"{}");
    // An unknown type, and a string that runs past the headers.
    for bad in [vec![1, b'x', 10], vec![1, b'x', 7, 0, 9, b'a']] {
        let total = 12 + bad.len() + 4;
        let mut msg = framed(total as u32, bad.len() as u32, &bad);
        let c = crc(&msg);
        msg.extend_from_slice(&c.to_be_bytes());
        assert_eq!(Decoder::default().push(&msg), Err(FrameError::Header));
    }
}
