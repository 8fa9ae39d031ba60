//! The FFI layer against a fake Envoy (`fake_envoy`): every hook with
//! hostile arguments returns without unwinding, a bad config is refused,
//! and a request runs through the hooks as Envoy drives them.

use super::fake_envoy::FAKE;
use super::ffi::*;
use super::*;

const SHIPPED: &str = include_str!("../../../../envoy/plugin.yaml");

/// The shipped config without the fleet's cache tier (no limiter here).
fn plugin() -> String {
    let shared = "  shared: {cluster: portcullis_ratelimit, timeout_ms: 50}\n";
    assert!(
        SHIPPED.contains(shared),
        "envoy/plugin.yaml: the shared line changed"
    );
    SHIPPED.replace(shared, "")
}

fn buf(b: &[u8]) -> EnvoyBuffer {
    EnvoyBuffer {
        ptr: b.as_ptr(),
        length: b.len(),
    }
}

fn null_buf(length: usize) -> EnvoyBuffer {
    EnvoyBuffer {
        ptr: std::ptr::null(),
        length,
    }
}

/// Any non-null pointer stands for Envoy's objects: the fake ignores them.
fn envoy_ptr() -> *mut std::ffi::c_void {
    std::ptr::NonNull::<u8>::dangling().as_ptr().cast()
}

fn new_config(yaml: &[u8]) -> ConfigModule {
    // SAFETY: live buffers.
    unsafe {
        envoy_dynamic_module_on_http_filter_config_new(envoy_ptr(), buf(b"portcullis"), buf(yaml))
    }
}

#[test]
fn every_hook_takes_null_and_empty_arguments_without_unwinding() {
    // SAFETY: null and empty arguments are what is under test; the hooks
    // must check them.
    unsafe {
        assert!(envoy_dynamic_module_on_http_filter_config_new(
            std::ptr::null_mut(),
            null_buf(0),
            null_buf(0)
        )
        .is_null());
        // A length with a null pointer reads nothing.
        assert!(envoy_dynamic_module_on_http_filter_config_new(
            std::ptr::null_mut(),
            null_buf(10),
            null_buf(4096)
        )
        .is_null());
        envoy_dynamic_module_on_http_filter_config_destroy(std::ptr::null());
        assert!(
            envoy_dynamic_module_on_http_filter_new(std::ptr::null(), std::ptr::null_mut())
                .is_null()
        );
        let (e, m) = (std::ptr::null_mut(), std::ptr::null());
        assert_eq!(
            envoy_dynamic_module_on_http_filter_request_headers(e, m, true),
            CONTINUE
        );
        assert_eq!(
            envoy_dynamic_module_on_http_filter_request_body(e, m, true),
            CONTINUE
        );
        assert_eq!(
            envoy_dynamic_module_on_http_filter_response_headers(e, m, false),
            CONTINUE
        );
        assert_eq!(
            envoy_dynamic_module_on_http_filter_response_body(e, m, true),
            CONTINUE
        );
        envoy_dynamic_module_on_http_filter_stream_complete(e, m);
        envoy_dynamic_module_on_http_filter_http_callout_done(
            e,
            m,
            7,
            1,
            std::ptr::null(),
            3,
            std::ptr::null(),
            2,
        );
        envoy_dynamic_module_on_http_filter_config_scheduled(e, std::ptr::null(), 1);
        envoy_dynamic_module_on_http_filter_config_http_callout_done(
            e,
            std::ptr::null(),
            1,
            0,
            std::ptr::null(),
            5,
            std::ptr::null(),
            5,
        );
        envoy_dynamic_module_on_http_filter_destroy(std::ptr::null());
    }
}

#[test]
fn a_bad_config_is_refused_and_every_problem_logged() {
    let cfg = new_config(b"providers: [{name: a}]\nclients: 7\n");
    assert!(cfg.is_null());
    let logs = FAKE.with(|f| f.borrow().logs.join("\n"));
    assert!(logs.contains("plugin config rejected"), "{logs}");
    assert!(logs.contains("missing field `cluster`"), "{logs}");
    assert!(new_config(b"\xff\xfe not yaml").is_null());
}

fn set_request(headers: &[(&str, &str)], body: &str) {
    FAKE.with(|f| {
        let mut f = f.borrow_mut();
        f.request_headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        f.received[0] = body.as_bytes().to_vec();
    });
}

#[test]
fn a_chat_request_runs_through_the_hooks_to_its_provider_cluster() {
    let cfg = new_config(plugin().as_bytes());
    assert!(!cfg.is_null());
    // SAFETY: the config and filter this module made, as Envoy drives them.
    unsafe {
        let filter = envoy_dynamic_module_on_http_filter_new(cfg, envoy_ptr());
        assert!(!filter.is_null());
        set_request(
            &[
                (":method", "POST"),
                (":path", "/v1/chat/completions"),
                (":authority", "gateway"),
                ("authorization", "Bearer sk-portcullis-demo"),
                ("content-type", "application/json"),
            ],
            r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#,
        );
        let e = envoy_ptr();
        assert_eq!(
            envoy_dynamic_module_on_http_filter_request_headers(e, filter, false),
            STOP_ITERATION
        );
        assert_eq!(
            envoy_dynamic_module_on_http_filter_request_body(e, filter, true),
            CONTINUE
        );
        let (cluster, auth, sent) = FAKE.with(|f| {
            let f = f.borrow();
            let find = |n: &str| {
                f.request_headers
                    .iter()
                    .find(|(k, _)| k == n)
                    .map(|(_, v)| v.clone())
            };
            (
                find("x-portcullis-cluster"),
                find("authorization"),
                f.sent.clone(),
            )
        });
        assert_eq!(sent, None);
        assert!(cluster.is_some(), "routed to a provider's cluster");
        assert_ne!(
            auth.as_deref(),
            Some("Bearer sk-portcullis-demo"),
            "the client's key is replaced"
        );

        // The provider's answer, then the end of the stream.
        FAKE.with(|f| {
            let mut f = f.borrow_mut();
            f.response_headers = vec![
                (":status".into(), "200".into()),
                ("content-type".into(), "application/json".into()),
            ];
            f.received[2] = br#"{"id":"c1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#.to_vec();
        });
        envoy_dynamic_module_on_http_filter_response_headers(e, filter, false);
        envoy_dynamic_module_on_http_filter_response_body(e, filter, true);
        let model = FAKE.with(|f| {
            f.borrow()
                .response_headers
                .iter()
                .find(|(k, _)| k == "x-portcullis-model")
                .map(|(_, v)| v.clone())
        });
        assert_eq!(model.as_deref(), Some("gpt-4o-mini"));
        // A callout answer nobody asked for, with nothing in it.
        envoy_dynamic_module_on_http_filter_http_callout_done(
            e,
            filter,
            99,
            1,
            std::ptr::null(),
            0,
            std::ptr::null(),
            0,
        );
        envoy_dynamic_module_on_http_filter_stream_complete(e, filter);
        envoy_dynamic_module_on_http_filter_destroy(filter);
        envoy_dynamic_module_on_http_filter_config_destroy(cfg);
    }
}

#[test]
fn a_request_with_no_headers_at_all_is_answered_not_unwound() {
    let cfg = new_config(plugin().as_bytes());
    // SAFETY: as Envoy drives them.
    unsafe {
        let filter = envoy_dynamic_module_on_http_filter_new(cfg, envoy_ptr());
        set_request(&[], "");
        envoy_dynamic_module_on_http_filter_request_headers(envoy_ptr(), filter, true);
        let sent = FAKE.with(|f| f.borrow().sent.clone());
        let (status, body) = sent.expect("the gateway answers");
        assert!((400..500).contains(&status), "{status} {body}");
        envoy_dynamic_module_on_http_filter_stream_complete(envoy_ptr(), filter);
        envoy_dynamic_module_on_http_filter_destroy(filter);
        envoy_dynamic_module_on_http_filter_config_destroy(cfg);
    }
}

/// Envoy's header map copied into one map: order, repeated names and values
/// that are not UTF-8 kept; a name that is not text left out, the rest kept.
#[test]
fn headers_are_copied_whole_and_a_name_that_is_not_text_is_left_out() {
    // Envoy's map of (name, value) buffers, copied; what the copy reads.
    fn copied(pairs: &[(&'static [u8], &'static [u8])]) -> (Headers, Vec<(String, Vec<u8>)>) {
        let map: Vec<EnvoyHeader> = pairs
            .iter()
            .map(|(k, v)| EnvoyHeader {
                key_ptr: k.as_ptr(),
                key_length: k.len(),
                value_ptr: v.as_ptr(),
                value_length: v.len(),
            })
            .collect();
        // SAFETY: the map and its buffers outlive the copy.
        let h = unsafe { copy_headers(map.as_ptr(), map.len()) };
        let read = h.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect();
        (h, read)
    }
    let own = |pairs: &[(&str, &[u8])]| -> Vec<(String, Vec<u8>)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect()
    };
    let (h, read) = copied(&[
        (b":status", b"200"),
        (b"set-cookie", b"a=1"),
        (b"set-cookie", b"b=\xff"),
        (b"empty", b""),
    ]);
    assert_eq!(
        read,
        own(&[
            (":status", b"200"),
            ("set-cookie", b"a=1"),
            ("set-cookie", b"b=\xff"),
            ("empty", b""),
        ])
    );
    assert_eq!(h.get("set-cookie"), Some(&b"a=1"[..]));
    assert_eq!(h.get("missing"), None);
    let (_, read) = copied(&[(b"x-a", b"1"), (b"x-\xff", b"2"), (b"x-c", b"3")]);
    assert_eq!(read, own(&[("x-a", b"1"), ("x-c", b"3")]));
    // Two names not text alone, whose bytes together would be (é split):
    // both left out, not read as one.
    let (_, read) = copied(&[(b"x-\xc3", b"1"), (b"\xa9", b"2"), (b"x-d", b"4")]);
    assert_eq!(read, own(&[("x-d", b"4")]));
    // SAFETY: null with a count is an empty map.
    assert!(unsafe { copy_headers(std::ptr::null(), 3) }.is_empty());
}
