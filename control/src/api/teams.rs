//! The admin API's teams: their config (limits and budgets) and keys.

use super::*;

fn team_view(t: &TeamRow, s: &State) -> Json {
    let keys: Vec<&str> = s
        .clients
        .iter()
        .filter(|c| {
            c.revoked_ms.is_none()
                && c.entry.get("team").and_then(|v| v.as_str()) == Some(t.name.as_str())
        })
        .map(|c| c.name.as_str())
        .collect();
    json!({
        "name": t.name,
        "config": yaml_to_json(&serde_yaml::Value::Mapping(t.entry.clone())),
        "keys": keys,
    })
}

pub(super) async fn list_teams(AxState(app): AxState<App>, headers: HeaderMap) -> Answer {
    let teams = read(&app, &headers, |v, s| {
        json!({"version": v, "teams": s.teams.iter().map(|t| team_view(t, s)).collect::<Vec<_>>()})
    })
    .await?;
    ok(StatusCode::OK, teams)
}

pub(super) async fn get_team(
    AxState(app): AxState<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Answer {
    let n = name.clone();
    let team = read(&app, &headers, move |_, s| {
        s.team(&n).map(|t| team_view(t, s))
    })
    .await?
    .ok_or_else(|| not_found("team", &name))?;
    ok(StatusCode::OK, team)
}

/// PUT replaces a team's config (creating the team), PATCH merges fields
/// into it.
pub(super) async fn put_team(
    AxState(app): AxState<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Answer {
    write_team(app, headers, name, body, true).await
}

pub(super) async fn patch_team(
    AxState(app): AxState<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Answer {
    write_team(app, headers, name, body, false).await
}

async fn write_team(
    app: App,
    headers: HeaderMap,
    name: String,
    body: Bytes,
    replace: bool,
) -> Answer {
    let who = auth(&app, &headers, Role::Write).await?;
    check_name(&name)?;
    let mut fields = json_body(&body)?;
    if fields
        .remove("name")
        .is_some_and(|n| n.as_str() != Some(name.as_str()))
    {
        return Err(bad("`name` in the body differs from the URL's"));
    }
    let detail = serde_json::to_string(&fields).unwrap_or_default();
    let n = name.clone();
    let action = if replace { "team.put" } else { "team.update" };
    let (view, v) = app
        .change(&who, action, &name, detail, move |s, _| {
            let pos = s.next_team_pos();
            let exists = s.team(&n).is_some();
            if !exists && !replace {
                return Err(not_found("team", &n));
            }
            if !exists {
                s.teams.push(TeamRow {
                    name: n.clone(),
                    pos,
                    entry: serde_yaml::Mapping::new(),
                });
            }
            let t = s
                .teams
                .iter_mut()
                .find(|t| t.name == n)
                .ok_or_else(|| not_found("team", &n))?;
            if replace {
                t.entry = serde_yaml::Mapping::new();
            }
            merge(&mut t.entry, &fields);
            let t = t.clone();
            Ok(team_view(&t, s))
        })
        .await?;
    ok(StatusCode::OK, json!({"team": view, "version": v.version}))
}

pub(super) async fn delete_team(
    AxState(app): AxState<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Answer {
    let who = auth(&app, &headers, Role::Write).await?;
    let n = name.clone();
    let (_, v) = app
        .change(&who, "team.delete", &name, String::new(), move |s, _| {
            let before = s.teams.len();
            s.teams.retain(|t| t.name != n);
            if s.teams.len() == before {
                return Err(not_found("team", &n));
            }
            Ok(())
        })
        .await?;
    ok(
        StatusCode::OK,
        json!({"name": name, "deleted": true, "version": v.version}),
    )
}
