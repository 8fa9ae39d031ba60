//! SigV4 against AWS's published test suite (AKIDEXAMPLE, 20150830,
//! us-east-1, service `service`) and HMAC-SHA256 against RFC 4231.

use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
const DATE: &str = "20150830T123600Z";
const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
const SCOPE: Scope<'static> = Scope {
    region: "us-east-1",
    service: "service",
};

fn vanilla(method: &str, path: &str, query: &str) -> String {
    format!(
        "{method}\n{path}\n{query}\nhost:example.amazonaws.com\nx-amz-date:{DATE}\n\nhost;x-amz-date\n{EMPTY}"
    )
}

#[test]
fn hmac_matches_rfc_4231() {
    assert_eq!(
        hex(&hmac_sha256(&[0x0b; 20], b"Hi There")),
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
    );
    assert_eq!(
        hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
    // A key longer than the block is hashed first.
    assert_eq!(
        hex(&hmac_sha256(
            &[0xaa; 131],
            b"Test Using Larger Than Block-Size Key - Hash Key First"
        )),
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
    );
}

#[test]
fn the_signing_key_matches_the_suite() {
    assert_eq!(
        hex(&signing_key(SECRET, "20150830", &SCOPE)),
        "938127b5336810ddb6a5d6af445fcac9e371f9ed418ed386b022aed82901be75"
    );
}

#[test]
fn signatures_match_the_suite() {
    for (name, canonical, expected) in [
        (
            "get-vanilla",
            vanilla("GET", "/", ""),
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        ),
        (
            "post-vanilla",
            vanilla("POST", "/", ""),
            "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b",
        ),
        (
            "get-vanilla-query-order-key-case",
            vanilla("GET", "/", &canonical_query("Param2=value2&Param1=value1")),
            "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
        ),
        (
            "get-utf8",
            vanilla("GET", "/%E1%88%B4", ""),
            "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85",
        ),
    ] {
        let (scope, sig) = signature(SECRET, DATE, &SCOPE, &canonical);
        assert_eq!(scope, "20150830/us-east-1/service/aws4_request", "{name}");
        assert_eq!(sig, expected, "{name}");
    }
}

#[test]
fn dates_are_basic_iso_8601_in_utc() {
    assert_eq!(amz_date(1_440_938_160), DATE);
    assert_eq!(amz_date(0), "19700101T000000Z");
    assert_eq!(amz_date(951_782_399), "20000228T235959Z");
    assert_eq!(amz_date(951_782_400), "20000229T000000Z");
    // A year past 9999 keeps all its digits, the `T` after the day.
    assert_eq!(amz_date(253_402_300_800), "100000101T000000Z");
}

#[test]
fn a_path_as_sent_is_encoded_once_more() {
    // Bedrock's model ids carry `:`; sent as `%3A`, signed as `%253A`.
    assert_eq!(
        canonical_uri("/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse"),
        "/model/anthropic.claude-3-haiku-20240307-v1%253A0/converse"
    );
    assert_eq!(canonical_uri("/"), "/");
    assert_eq!(canonical_uri(""), "/");
    assert_eq!(canonical_uri("/a b/~x"), "/a%20b/~x");
}

/// The whole signer agrees with the lower half over the canonical request
/// written out by hand, with and without a session token.
#[test]
fn sign_signs_the_canonical_request_it_describes() {
    let body = br#"{"messages":[]}"#;
    let payload = hex(&Sha256::digest(body));
    for token in [None, Some("SESSION+TOKEN/=")] {
        let keys = Keys {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: SECRET.into(),
            session_token: token.map(Into::into),
        };
        let scope = Scope {
            region: "eu-west-3",
            service: "bedrock",
        };
        let req = Request {
            method: "POST",
            path: "/model/m%3A1/converse",
            query: "",
            host: "bedrock-runtime.eu-west-3.amazonaws.com",
            body,
        };
        let headers = sign(&keys, &scope, &req, 1_440_938_160);
        let get = |k: &str| {
            headers
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.as_str())
        };
        let (token_line, token_name) = match token {
            Some(t) => (
                format!("x-amz-security-token:{t}\n"),
                ";x-amz-security-token",
            ),
            None => (String::new(), ""),
        };
        let canonical = format!(
            "POST\n/model/m%253A1/converse\n\nhost:bedrock-runtime.eu-west-3.amazonaws.com\nx-amz-content-sha256:{payload}\nx-amz-date:{DATE}\n{token_line}\nhost;x-amz-content-sha256;x-amz-date{token_name}\n{payload}"
        );
        let (_, sig) = signature(SECRET, DATE, &scope, &canonical);
        assert_eq!(
            get("authorization"),
            Some(
                format!(
                    "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/eu-west-3/bedrock/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date{token_name}, Signature={sig}"
                )
                .as_str()
            )
        );
        assert_eq!(get("x-amz-date"), Some(DATE));
        assert_eq!(get("x-amz-content-sha256"), Some(payload.as_str()));
        assert_eq!(get("x-amz-security-token"), token);
    }
}

#[test]
fn keys_never_print_their_secret() {
    let keys = Keys {
        access_key_id: "AKID".into(),
        secret_access_key: "very-secret".into(),
        session_token: Some("token-secret".into()),
    };
    let shown = format!("{keys:?}");
    assert!(
        shown.contains("AKID") && !shown.contains("secret"),
        "{shown}"
    );
}

/// The day's key kept between calls signs as a fresh derivation does, and
/// is derived again when the date changes.
#[test]
fn a_kept_day_key_signs_the_same() {
    let keys = Keys {
        access_key_id: "AKIDEXAMPLE".into(),
        secret_access_key: SECRET.into(),
        session_token: None,
    };
    let req = Request {
        method: "POST",
        path: "/",
        query: "",
        host: "example.amazonaws.com",
        body: b"{}",
    };
    let mut kept = None;
    for now in [1_440_938_160, 1_440_938_161, 1_441_024_560] {
        assert_eq!(
            sign_with(&keys, &SCOPE, &req, now, &mut kept),
            sign(&keys, &SCOPE, &req, now)
        );
        assert_eq!(
            kept.as_ref().map(|k| k.date.as_str()),
            Some(&amz_date(now)[..8])
        );
    }
}

#[test]
fn keys_come_from_the_prefixed_environment_and_name_what_is_missing() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let keys = keys_from_env(
        "EU_",
        env(&[
            ("EU_AWS_ACCESS_KEY_ID", " AKID "),
            ("EU_AWS_SECRET_ACCESS_KEY", "s3cret"),
            ("AWS_SESSION_TOKEN", "not-this-prefix"),
        ]),
    )
    .unwrap();
    assert_eq!(keys.access_key_id, "AKID");
    assert_eq!(keys.secret_access_key, "s3cret");
    assert_eq!(keys.session_token, None);
    assert_eq!(
        keys_from_env("", env(&[("AWS_SECRET_ACCESS_KEY", "  ")])).unwrap_err(),
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    );
    let with_session = keys_from_env(
        "",
        env(&[
            ("AWS_ACCESS_KEY_ID", "a"),
            ("AWS_SECRET_ACCESS_KEY", "b"),
            ("AWS_SESSION_TOKEN", "t"),
        ]),
    )
    .unwrap();
    assert_eq!(with_session.session_token.as_deref(), Some("t"));
}
