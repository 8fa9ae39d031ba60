//! Arbitrary input never panics the pure core (a panic would trap the VM
//! and break every later request on that worker). Deterministic pseudo-random
//! inputs, so a failure reproduces.

#[cfg(test)]
mod tests {
    use crate::compile::compile;
    use crate::request::ChatRequest;
    use crate::usage::Usage;
    use crate::wire::headers::{decode_pairs, encode_pairs};
    use crate::wire::sse::{replay, Relay};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    const BODY: &str = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"héllo"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":5}"#;
    const ALPHABET: &[u8] = b"{}[]\":,\\ 0123456789.-eE+truefalsnl\xff\xc3\xa9\n\r";

    /// The text with a few bytes replaced, inserted or removed.
    fn mutate(rng: &mut Rng, src: &[u8]) -> Vec<u8> {
        let mut v = src.to_vec();
        for _ in 0..1 + rng.below(4) {
            let pos = rng.below(v.len() + 1);
            let b = ALPHABET[rng.below(ALPHABET.len())];
            match rng.below(3) {
                0 if pos < v.len() => v[pos] = b,
                1 => v.insert(pos, b),
                _ if pos < v.len() => {
                    v.remove(pos);
                }
                _ => {}
            }
        }
        v
    }

    #[test]
    fn mutated_request_bodies_give_a_request_or_a_400() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for _ in 0..20_000 {
            let body = mutate(&mut rng, BODY.as_bytes());
            match ChatRequest::parse(&body) {
                Ok(r) => {
                    let out = r.body_for_with("provider/model", true).unwrap();
                    assert!(
                        serde_json::from_slice::<serde_json::Value>(&out).is_ok(),
                        "{}",
                        String::from_utf8_lossy(&out)
                    );
                }
                Err(e) => assert_eq!(e.status, 400, "{}", String::from_utf8_lossy(&body)),
            }
        }
    }

    #[test]
    fn mutated_configs_compile_or_are_rejected_with_a_message() {
        let good = crate::compile::tests::GOOD.as_bytes();
        let mut rng = Rng(0x1234_5678_9ABC_DEF1);
        for _ in 0..3_000 {
            if let Err(msg) = compile(&mutate(&mut rng, good)) {
                assert!(!msg.is_empty());
            }
        }
    }

    #[test]
    fn streams_cut_anywhere_or_garbled_pass_through_the_relay() {
        let stream = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n\
            data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n";
        let mut rng = Rng(42);
        for _ in 0..5_000 {
            let bytes = mutate(&mut rng, stream.as_bytes());
            let mut relay = Relay::new(rng.below(2) == 0);
            let mut rest: &[u8] = &bytes;
            while !rest.is_empty() {
                let n = 1 + rng.below(rest.len());
                let (chunk, tail) = rest.split_at(n);
                relay.chunk(chunk);
                rest = tail;
            }
            relay.finish();
            if let Some(c) = relay.assembly.completion() {
                assert!(replay(&c, true).is_some());
            }
            let _ = Usage::from_body(&bytes);
            let _ = Usage::from_tail(&bytes);
            let _ = replay(&bytes, true);
        }
    }

    #[test]
    fn header_maps_from_the_host_decode_or_are_refused_never_panic() {
        let mut rng = Rng(0xD1B5_4A32_D192_ED03);
        let good = encode_pairs(&[(":status", "200"), ("x-note", "caf\u{e9}"), ("a", "")]);
        for _ in 0..5_000 {
            let mut bytes = good.clone();
            for _ in 0..1 + rng.below(3) {
                let pos = rng.below(bytes.len());
                bytes[pos] = (rng.next() & 0xff) as u8;
            }
            bytes.truncate(rng.below(bytes.len() + 1));
            if let Some(pairs) = decode_pairs(&bytes) {
                assert!(pairs.iter().all(|(k, v)| k.len() + v.len() <= bytes.len()));
            }
        }
    }
}
