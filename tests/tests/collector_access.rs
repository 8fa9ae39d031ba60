//! The collector's HTTP side answers only its own host names (a DNS
//! rebinding page gets 421) and, with a read token, only requests that
//! carry it: a bearer for the API, a cookie (HttpOnly, SameSite=Strict) for
//! the dashboard after its login form. `/healthz` stays open for probes.

use portcullis_tests::*;

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[test]
fn a_token_guards_the_api_and_the_dashboard_and_foreign_hosts_get_421() {
    let dir = TempDir::new("collector-access");
    let token_file = dir.0.join("token");
    std::fs::write(&token_file, "t0ken-for-tests\n").unwrap();
    let c = Collector::start_args(
        dir.0.join("log.db").as_os_str(),
        0,
        &["--read-token-file", token_file.to_str().unwrap()],
    );
    let host = format!("127.0.0.1:{}", c.http_port);
    let local = [("host", host.as_str())];
    // Open for probes; everything else needs the token.
    assert_eq!(raw_http(c.http_port, "GET", "/healthz", &local, "").0, 200);
    let (status, _, body) = raw_http(c.http_port, "GET", "/v1/metrics/summary", &local, "");
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("read token"), "{body}");
    let bearer = [
        ("host", host.as_str()),
        ("authorization", "Bearer t0ken-for-tests"),
    ];
    assert_eq!(
        raw_http(c.http_port, "GET", "/v1/metrics/summary", &bearer, "").0,
        200
    );
    let wrong = [
        ("host", host.as_str()),
        ("authorization", "Bearer t0ken-for-test"),
    ];
    assert_eq!(
        raw_http(c.http_port, "GET", "/v1/requests/recent", &wrong, "").0,
        401
    );
    // A page served from another name (DNS rebinding) is refused, token or not.
    let rebound = [
        ("host", "evil.example:9090"),
        ("authorization", "Bearer t0ken-for-tests"),
    ];
    assert_eq!(
        raw_http(c.http_port, "GET", "/v1/metrics/summary", &rebound, "").0,
        421
    );
    assert_eq!(
        raw_http(
            c.http_port,
            "GET",
            "/dashboard",
            &[("host", "evil.example")],
            ""
        )
        .0,
        421
    );
    // The dashboard: a login form, then a cookie the browser keeps.
    let (status, _, page) = raw_http(c.http_port, "GET", "/dashboard", &local, "");
    assert_eq!(status, 401);
    assert!(page.contains("id=\"login\""), "{page}");
    let form = [
        ("host", host.as_str()),
        ("content-type", "application/x-www-form-urlencoded"),
    ];
    assert_eq!(
        raw_http(c.http_port, "POST", "/login", &form, "token=nope").0,
        401
    );
    let (status, h, _) = raw_http(
        c.http_port,
        "POST",
        "/login",
        &form,
        "token=t0ken-for-tests",
    );
    assert_eq!(status, 303);
    assert_eq!(header(&h, "location"), Some("/dashboard"));
    let cookie = header(&h, "set-cookie").unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let jar = cookie.split(';').next().unwrap().to_string();
    let with_cookie = [("host", host.as_str()), ("cookie", jar.as_str())];
    let (status, _, page) = raw_http(c.http_port, "GET", "/dashboard", &with_cookie, "");
    assert_eq!(status, 200);
    assert!(!page.contains("id=\"login\""));
    assert_eq!(
        raw_http(c.http_port, "GET", "/v1/requests/recent", &with_cookie, "").0,
        200
    );
}

#[test]
fn without_a_token_only_the_host_is_checked() {
    let dir = TempDir::new("collector-hosts");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let host = format!("localhost:{}", c.http_port);
    assert_eq!(
        raw_http(
            c.http_port,
            "GET",
            "/v1/metrics/summary",
            &[("host", &host)],
            ""
        )
        .0,
        200
    );
    assert_eq!(
        raw_http(
            c.http_port,
            "GET",
            "/v1/metrics/summary",
            &[("host", "attacker.test")],
            ""
        )
        .0,
        421
    );
}
