//! What the control plane manages, and the plugin YAML it makes of it: the
//! `base` (every section of the plugin config but `clients` and `teams`),
//! the clients (one key each, plus rotated-out keys in their grace period)
//! and the teams. The rendered YAML is exactly what a file-based Envoy
//! would be given: the same compiler accepts or refuses it.

use serde_yaml::{Mapping, Value};

/// A client: its key's hash, its config entry (everything but `name`,
/// `key_sha256` and `previous_keys`), rotated-out keys.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientRow {
    pub name: String,
    /// Its place in the config's `clients` (rows are read in this order).
    pub pos: i64,
    pub key_sha256: String,
    pub entry: Mapping,
    pub previous: Vec<PreviousKey>,
    pub created_ms: i64,
    /// Revoked clients are kept (for the audit and the dashboard) and
    /// left out of the config.
    pub revoked_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PreviousKey {
    pub sha256: String,
    /// Unix seconds from which the old key is refused.
    pub until: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TeamRow {
    pub name: String,
    pub pos: i64,
    pub entry: Mapping,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct State {
    pub base: Mapping,
    pub clients: Vec<ClientRow>,
    pub teams: Vec<TeamRow>,
}

fn key(s: &str) -> Value {
    Value::String(s.to_string())
}

/// Client fields that are the control plane's, not the entry's.
pub const CLIENT_OWN: [&str; 3] = ["name", "key_sha256", "previous_keys"];

impl State {
    /// Split a whole plugin YAML into base, clients and teams.
    pub fn from_yaml(text: &str, now_ms: i64) -> Result<State, String> {
        let doc: Value =
            serde_yaml::from_str(text).map_err(|e| format!("the YAML does not parse: {e}"))?;
        let Value::Mapping(mut base) = doc else {
            return Err("the plugin config must be a mapping".into());
        };
        let mut state = State::default();
        // `clients` and `teams` keep their place in the document (a null
        // placeholder in the base) so that an export reads like the import.
        if let Some(cs) = base.get_mut(key("clients")).map(std::mem::take) {
            let cs = if cs.is_null() {
                Value::Sequence(Vec::new())
            } else {
                cs
            };
            let Value::Sequence(cs) = cs else {
                return Err("`clients` must be a list".into());
            };
            for (i, c) in cs.into_iter().enumerate() {
                let Value::Mapping(mut m) = c else {
                    return Err(format!("clients[{i}] must be a mapping"));
                };
                let name = take_string(&mut m, "name")
                    .ok_or_else(|| format!("clients[{i}]: `name` is required"))?;
                let key_sha256 = take_string(&mut m, "key_sha256")
                    .ok_or_else(|| format!("clients[{i}] ({name}): `key_sha256` is required"))?;
                let previous = match m.shift_remove(key("previous_keys")) {
                    None => Vec::new(),
                    Some(v) => serde_yaml::from_value(v)
                        .map_err(|e| format!("clients[{i}] ({name}).previous_keys: {e}"))?,
                };
                state.clients.push(ClientRow {
                    name,
                    pos: i as i64,
                    key_sha256,
                    entry: m,
                    previous,
                    created_ms: now_ms,
                    revoked_ms: None,
                });
            }
        }
        if let Some(ts) = base.get_mut(key("teams")).map(std::mem::take) {
            let ts = if ts.is_null() {
                Value::Sequence(Vec::new())
            } else {
                ts
            };
            let Value::Sequence(ts) = ts else {
                return Err("`teams` must be a list".into());
            };
            for (i, t) in ts.into_iter().enumerate() {
                let Value::Mapping(mut m) = t else {
                    return Err(format!("teams[{i}] must be a mapping"));
                };
                let name = take_string(&mut m, "name")
                    .ok_or_else(|| format!("teams[{i}]: `name` is required"))?;
                state.teams.push(TeamRow {
                    name,
                    pos: i as i64,
                    entry: m,
                });
            }
        }
        state.base = base;
        Ok(state)
    }

    /// The plugin YAML: the base's sections in their order, `teams` (when
    /// there are any) and `clients` (revoked ones left out) where the
    /// imported document had them, else last.
    pub fn render(&self) -> String {
        let mut doc = self.base.clone();
        if self.teams.is_empty() {
            doc.shift_remove(key("teams"));
        } else {
            let teams = self
                .teams
                .iter()
                .map(|t| {
                    let mut m = Mapping::new();
                    m.insert(key("name"), key(&t.name));
                    for (k, v) in &t.entry {
                        m.insert(k.clone(), v.clone());
                    }
                    Value::Mapping(m)
                })
                .collect();
            doc.insert(key("teams"), Value::Sequence(teams));
        }
        let clients = self
            .clients
            .iter()
            .filter(|c| c.revoked_ms.is_none())
            .map(|c| Value::Mapping(c.to_entry()))
            .collect();
        doc.insert(key("clients"), Value::Sequence(clients));
        serde_yaml::to_string(&Value::Mapping(doc)).unwrap_or_default()
    }

    pub fn client(&self, name: &str) -> Option<&ClientRow> {
        self.clients.iter().find(|c| c.name == name)
    }

    pub fn client_mut(&mut self, name: &str) -> Option<&mut ClientRow> {
        self.clients.iter_mut().find(|c| c.name == name)
    }

    pub fn team(&self, name: &str) -> Option<&TeamRow> {
        self.teams.iter().find(|t| t.name == name)
    }

    /// The place after every client's.
    pub fn next_client_pos(&self) -> i64 {
        self.clients
            .iter()
            .map(|c| c.pos)
            .max()
            .map_or(0, |p| p.saturating_add(1))
    }

    /// The place after every team's.
    pub fn next_team_pos(&self) -> i64 {
        self.teams
            .iter()
            .map(|t| t.pos)
            .max()
            .map_or(0, |p| p.saturating_add(1))
    }
}

impl ClientRow {
    /// The client as the plugin config spells it.
    pub fn to_entry(&self) -> Mapping {
        let mut m = Mapping::new();
        m.insert(key("name"), key(&self.name));
        m.insert(key("key_sha256"), key(&self.key_sha256));
        if !self.previous.is_empty() {
            m.insert(
                key("previous_keys"),
                serde_yaml::to_value(&self.previous).unwrap_or(Value::Null),
            );
        }
        for (k, v) in &self.entry {
            m.insert(k.clone(), v.clone());
        }
        m
    }
}

fn take_string(m: &mut Mapping, k: &str) -> Option<String> {
    match m.shift_remove(key(k))? {
        Value::String(s) => Some(s),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A mapping as YAML text (for a database column).
pub fn mapping_text(m: &Mapping) -> String {
    serde_yaml::to_string(m).unwrap_or_default()
}

/// A mapping from YAML text (a database column); an empty one if it does
/// not parse (the database is ours; a hand edit that breaks a row shows as
/// an empty entry, which the compiler then judges).
pub fn text_mapping(text: &str) -> Mapping {
    match serde_yaml::from_str::<Value>(text) {
        Ok(Value::Mapping(m)) => m,
        _ => Mapping::new(),
    }
}

/// JSON (an API body) as YAML.
pub fn json_to_yaml(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                Value::Number(u.into())
            } else if let Some(i) = n.as_i64() {
                Value::Number(i.into())
            } else {
                Value::Number(n.as_f64().unwrap_or(0.0).into())
            }
        }
        serde_json::Value::String(s) => Value::String(s.clone()),
        serde_json::Value::Array(a) => Value::Sequence(a.iter().map(json_to_yaml).collect()),
        serde_json::Value::Object(o) => Value::Mapping(
            o.iter()
                .map(|(k, v)| (Value::String(k.clone()), json_to_yaml(v)))
                .collect(),
        ),
    }
}

/// YAML as JSON (for the API's answers).
pub fn yaml_to_json(v: &Value) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

/// Apply a JSON merge patch (RFC 7396) of fields to an entry: a `null`
/// removes the field.
pub fn merge(entry: &mut Mapping, patch: &serde_json::Map<String, serde_json::Value>) {
    for (k, v) in patch {
        if v.is_null() {
            entry.shift_remove(key(k));
        } else {
            entry.insert(key(k), json_to_yaml(v));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_yaml_splits_and_renders_back_to_the_same_document() {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../envoy/plugin.yaml"))
                .unwrap();
        let s = State::from_yaml(&text, 0).unwrap();
        assert!(s.clients.len() >= 2);
        let original: Value = serde_yaml::from_str(&text).unwrap();
        let back: Value = serde_yaml::from_str(&s.render()).unwrap();
        assert_eq!(original, back);
    }

    #[test]
    fn a_clients_fields_keep_their_order_through_every_import() {
        // Taking a key's own fields out of its entry once moved the last
        // field into their place (a swap), so each import of an export
        // reordered a key with two fields and made a new version.
        let text = "clients:\n- name: a\n  key_sha256: aa\n  limits:\n    requests_per_minute: 5\n  mcp:\n    tools:\n    - x__y\n  team: t\nteams:\n- name: t\n";
        let once = State::from_yaml(text, 0).unwrap().render();
        let twice = State::from_yaml(&once, 0).unwrap().render();
        assert_eq!(once, twice);
        let fields: Vec<&str> = once
            .lines()
            .filter(|l| l.starts_with("  ") && !l.starts_with("   ") && l.contains(':'))
            .map(|l| l.trim().split(':').next().unwrap_or_default())
            .collect();
        assert_eq!(fields, ["key_sha256", "limits", "mcp", "team"]);
    }

    #[test]
    fn revoked_clients_and_previous_keys_render_as_the_filter_reads_them() {
        let mut s = State::from_yaml(
            "providers: []\nclients:\n  - {name: a, key_sha256: aa, team: t}\n  - {name: b, key_sha256: bb}\nteams: [{name: t}]\n",
            0,
        )
        .unwrap();
        s.client_mut("a").unwrap().previous.push(PreviousKey {
            sha256: "cc".into(),
            until: 7,
        });
        s.client_mut("b").unwrap().revoked_ms = Some(1);
        let out: Value = serde_yaml::from_str(&s.render()).unwrap();
        let want: Value = serde_yaml::from_str(
            "providers: []\nteams: [{name: t}]\nclients:\n  - {name: a, key_sha256: aa, previous_keys: [{sha256: cc, until: 7}], team: t}\n",
        )
        .unwrap();
        assert_eq!(out, want);
    }

    #[test]
    fn bad_documents_say_what_is_wrong() {
        for (text, want) in [
            ("- a\n", "must be a mapping"),
            ("clients: 3\n", "`clients` must be a list"),
            (
                "clients: [{key_sha256: aa}]\n",
                "clients[0]: `name` is required",
            ),
            (
                "clients: [{name: x}]\n",
                "clients[0] (x): `key_sha256` is required",
            ),
            ("teams: [{}]\n", "teams[0]: `name` is required"),
            ("a: [\n", "does not parse"),
        ] {
            let e = State::from_yaml(text, 0).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
