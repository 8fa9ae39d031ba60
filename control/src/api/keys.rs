//! The admin API's keys: create (shown once), list, update, rotate with a
//! grace period, revoke.

use super::*;

/// The key a change works on: it must exist and not be revoked.
fn active_client<'s>(s: &'s mut State, name: &str) -> Result<&'s mut ClientRow, Refusal> {
    s.client_mut(name)
        .filter(|c| c.revoked_ms.is_none())
        .ok_or_else(|| not_found("active key", name))
}

fn key_view(c: &ClientRow) -> Json {
    json!({
        "name": c.name,
        "key_sha256": c.key_sha256,
        "team": c.entry.get("team").and_then(|t| t.as_str()),
        "config": yaml_to_json(&serde_yaml::Value::Mapping(c.entry.clone())),
        "previous_keys": c.previous,
        "created_ms": c.created_ms,
        "revoked_ms": c.revoked_ms,
        "active": c.revoked_ms.is_none(),
    })
}

/// Fields a key's body may set: its config entry (the plugin config's
/// client fields but its own three).
fn entry_fields(body: &Map<String, Json>, allow: &[&str]) -> Result<Map<String, Json>, ApiError> {
    let mut out = Map::new();
    for (k, v) in body {
        if allow.contains(&k.as_str()) {
            continue;
        }
        if CLIENT_OWN.contains(&k.as_str()) {
            return Err(bad(format!(
                "`{k}` is the control plane's to set (create, rotate or revoke the key instead)"
            )));
        }
        out.insert(k.clone(), v.clone());
    }
    Ok(out)
}

pub(super) async fn list_keys(AxState(app): AxState<App>, headers: HeaderMap) -> Answer {
    let keys = read(
        &app,
        &headers,
        |v, s| json!({"version": v, "keys": s.clients.iter().map(key_view).collect::<Vec<_>>()}),
    )
    .await?;
    ok(StatusCode::OK, keys)
}

pub(super) async fn get_key(
    AxState(app): AxState<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Answer {
    let n = name.clone();
    let key = read(&app, &headers, move |_, s| s.client(&n).map(key_view))
        .await?
        .ok_or_else(|| not_found("key", &name))?;
    ok(StatusCode::OK, key)
}

pub(super) async fn create_key(
    AxState(app): AxState<App>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let who = auth(&app, &headers, Role::Write).await?;
    let mut body = json_body(&body)?;
    let name = match body.remove("name") {
        Some(Json::String(n)) => n,
        _ => return Err(bad("`name` is required (a string)")),
    };
    check_name(&name)?;
    // A hash brought by the caller (the key made elsewhere), or a new key.
    let (key, hash) = match body.remove("key_sha256") {
        Some(Json::String(h)) => (None, h.to_ascii_lowercase()),
        Some(_) => return Err(bad("`key_sha256` must be a string")),
        None => {
            let key = secret::new_secret("sk-pc-")
                .map_err(|e| ApiError(Refusal::new(500, format!("cannot make a key: {e}"))))?;
            let hash = secret::sha256_hex(&key);
            (Some(key), hash)
        }
    };
    let fields = entry_fields(&body, &[])?;
    let detail = serde_json::to_string(&fields).unwrap_or_default();
    let (n, h) = (name.clone(), hash.clone());
    let (_, v) = app
        .change(&who, "key.create", &name, detail, move |s, now| {
            let mut entry = serde_yaml::Mapping::new();
            merge(&mut entry, &fields);
            let pos = s.next_client_pos();
            let row = ClientRow {
                name: n.clone(),
                pos,
                key_sha256: h,
                entry,
                previous: Vec::new(),
                created_ms: now,
                revoked_ms: None,
            };
            match s.client_mut(&n) {
                Some(c) if c.revoked_ms.is_none() => Err(Refusal::new(
                    409,
                    format!("a key named `{n}` exists (rotate it, or revoke it first)"),
                )),
                Some(c) => {
                    *c = ClientRow { pos: c.pos, ..row };
                    Ok(())
                }
                None => {
                    s.clients.push(row);
                    Ok(())
                }
            }
        })
        .await?;
    let mut out = Map::new();
    out.insert("name".into(), json!(name));
    if let Some(k) = key {
        out.insert("key".into(), json!(k));
    }
    out.insert("key_sha256".into(), json!(hash));
    out.insert("version".into(), json!(v.version));
    ok(StatusCode::CREATED, Json::Object(out))
}

pub(super) async fn update_key(
    AxState(app): AxState<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Answer {
    let who = auth(&app, &headers, Role::Write).await?;
    let fields = entry_fields(&json_body(&body)?, &[])?;
    let detail = serde_json::to_string(&fields).unwrap_or_default();
    let n = name.clone();
    let (view, v) = app
        .change(&who, "key.update", &name, detail, move |s, _| {
            let c = active_client(s, &n)?;
            merge(&mut c.entry, &fields);
            Ok(key_view(c))
        })
        .await?;
    ok(StatusCode::OK, json!({"key": view, "version": v.version}))
}

pub(super) async fn rotate_key(
    AxState(app): AxState<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Answer {
    let who = auth(&app, &headers, Role::Write).await?;
    let body = json_body(&body)?;
    let grace_s = match body.get("grace_s") {
        None => app.default_grace_s,
        Some(g) => g
            .as_u64()
            .ok_or_else(|| bad("`grace_s` must be a whole number of seconds"))?,
    };
    let key = secret::new_secret("sk-pc-")
        .map_err(|e| ApiError(Refusal::new(500, format!("cannot make a key: {e}"))))?;
    let hash = secret::sha256_hex(&key);
    let n = name.clone();
    let h = hash.clone();
    let (until, v) = app
        .change(
            &who,
            "key.rotate",
            &name,
            format!("grace_s={grace_s}"),
            move |s, now| {
                let now_s = u64::try_from(now / 1000).unwrap_or(0);
                let c = active_client(s, &n)?;
                let until = now_s.saturating_add(grace_s);
                c.previous.retain(|p| p.until > now_s);
                if grace_s > 0 {
                    c.previous.push(PreviousKey {
                        sha256: std::mem::replace(&mut c.key_sha256, h),
                        until,
                    });
                } else {
                    c.key_sha256 = h;
                }
                Ok(until)
            },
        )
        .await?;
    ok(
        StatusCode::OK,
        json!({"name": name, "key": key, "key_sha256": hash, "previous_key_valid_until": until, "version": v.version}),
    )
}

pub(super) async fn revoke_key(
    AxState(app): AxState<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Answer {
    let who = auth(&app, &headers, Role::Write).await?;
    let n = name.clone();
    let (_, v) = app
        .change(&who, "key.revoke", &name, String::new(), move |s, now| {
            let c = active_client(s, &n)?;
            c.revoked_ms = Some(now);
            c.previous.clear();
            Ok(())
        })
        .await?;
    ok(
        StatusCode::OK,
        json!({"name": name, "revoked": true, "version": v.version}),
    )
}
