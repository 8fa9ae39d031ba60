//! The JSON Schema subset an output check can require of an answer the
//! client asked to be JSON: `type` (one or a list), `properties`,
//! `required`, `additionalProperties: false`, `items`, `enum`, `minLength`,
//! `maxLength`, `minimum`, `maximum`, `minItems`, `maxItems`. Any other
//! keyword is a config error (a check that silently ignored part of its
//! schema would pass answers the operator meant to stop).

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    types: Option<Vec<String>>,
    properties: Vec<(String, Schema)>,
    required: Vec<String>,
    closed: bool,
    items: Option<Box<Schema>>,
    allowed: Option<Vec<Value>>,
    min_length: Option<u64>,
    max_length: Option<u64>,
    minimum: Option<f64>,
    maximum: Option<f64>,
    min_items: Option<u64>,
    max_items: Option<u64>,
}

const TYPES: [&str; 7] = [
    "object", "array", "string", "number", "integer", "boolean", "null",
];
const KEYWORDS: [&str; 14] = [
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "description",
    "title",
];

/// Nesting allowed in a schema (config is trusted, but bounded all the same).
const MAX_DEPTH: usize = 32;

impl Schema {
    /// Compile a schema from config; problems are reported with `at`.
    pub fn compile(v: &Value, at: &str, problems: &mut Vec<String>) -> Schema {
        compile(v, at, 0, problems)
    }

    /// The first way `v` breaks the schema, if any (a JSON pointer and why).
    pub fn violation(&self, v: &Value) -> Option<String> {
        self.check(v, "").err()
    }

    fn check(&self, v: &Value, path: &str) -> Result<(), String> {
        let here = || {
            if path.is_empty() {
                "/".to_string()
            } else {
                path.to_string()
            }
        };
        if let Some(types) = &self.types {
            if !types.iter().any(|t| is_type(v, t)) {
                return Err(format!("{}: expected {}", here(), types.join(" or ")));
            }
        }
        if let Some(allowed) = &self.allowed {
            if !allowed.contains(v) {
                return Err(format!("{}: not one of the allowed values", here()));
            }
        }
        match v {
            Value::String(s) => {
                let n = s.chars().count() as u64;
                if self.min_length.is_some_and(|m| n < m) || self.max_length.is_some_and(|m| n > m)
                {
                    return Err(format!("{}: string length {n} out of bounds", here()));
                }
            }
            Value::Number(n) => {
                let x = n.as_f64().unwrap_or(f64::NAN);
                let below = self.minimum.is_some_and(|m| x.is_nan() || x < m);
                let above = self.maximum.is_some_and(|m| x.is_nan() || x > m);
                if below || above {
                    return Err(format!("{}: number out of bounds", here()));
                }
            }
            Value::Array(a) => {
                let n = a.len() as u64;
                if self.min_items.is_some_and(|m| n < m) || self.max_items.is_some_and(|m| n > m) {
                    return Err(format!("{}: {n} items out of bounds", here()));
                }
                if let Some(items) = &self.items {
                    for (i, item) in a.iter().enumerate() {
                        items.check(item, &format!("{path}/{i}"))?;
                    }
                }
            }
            Value::Object(o) => {
                for r in &self.required {
                    if !o.contains_key(r) {
                        return Err(format!("{}: missing required `{r}`", here()));
                    }
                }
                for (k, item) in o {
                    match self.properties.iter().find(|(name, _)| name == k) {
                        Some((_, s)) => s.check(item, &format!("{path}/{k}"))?,
                        None if self.closed => {
                            return Err(format!("{}: unexpected property `{k}`", here()))
                        }
                        None => {}
                    }
                }
            }
            Value::Bool(_) | Value::Null => {}
        }
        Ok(())
    }
}

fn is_type(v: &Value, t: &str) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|x| x.fract() == 0.0),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => false,
    }
}

fn compile(v: &Value, at: &str, depth: usize, problems: &mut Vec<String>) -> Schema {
    let mut s = Schema {
        types: None,
        properties: Vec::new(),
        required: Vec::new(),
        closed: false,
        items: None,
        allowed: None,
        min_length: None,
        max_length: None,
        minimum: None,
        maximum: None,
        min_items: None,
        max_items: None,
    };
    let Some(o) = v.as_object() else {
        problems.push(format!("{at}: a schema must be a mapping"));
        return s;
    };
    if depth > MAX_DEPTH {
        problems.push(format!("{at}: schema nested deeper than {MAX_DEPTH}"));
        return s;
    }
    for (k, val) in o {
        let mut bad = |what: &str| problems.push(format!("{at}.{k}: {what}"));
        match k.as_str() {
            "type" => {
                let list: Vec<String> = match val {
                    Value::String(t) => vec![t.clone()],
                    Value::Array(a) => a
                        .iter()
                        .filter_map(|t| t.as_str().map(String::from))
                        .collect(),
                    _ => Vec::new(),
                };
                if list.is_empty() || list.iter().any(|t| !TYPES.contains(&t.as_str())) {
                    bad(&format!(
                        "expected one of {} (or a list of them)",
                        TYPES.join(", ")
                    ));
                }
                s.types = Some(list);
            }
            "properties" => match val.as_object() {
                Some(props) => {
                    for (name, sub) in props {
                        let sub =
                            compile(sub, &format!("{at}.properties.{name}"), depth + 1, problems);
                        s.properties.push((name.clone(), sub));
                    }
                }
                None => bad("must be a mapping of property schemas"),
            },
            "required" => match val.as_array() {
                Some(a) if a.iter().all(Value::is_string) => {
                    s.required = a
                        .iter()
                        .filter_map(|r| r.as_str().map(String::from))
                        .collect();
                }
                _ => bad("must be a list of property names"),
            },
            "additionalProperties" => match val {
                Value::Bool(b) => s.closed = !b,
                _ => bad("only `true` or `false` is supported"),
            },
            "items" => {
                s.items = Some(Box::new(compile(
                    val,
                    &format!("{at}.items"),
                    depth + 1,
                    problems,
                )))
            }
            "enum" => match val.as_array() {
                Some(a) if !a.is_empty() => s.allowed = Some(a.clone()),
                _ => bad("must be a non-empty list"),
            },
            "minLength" | "maxLength" | "minItems" | "maxItems" => match val.as_u64() {
                Some(n) => match k.as_str() {
                    "minLength" => s.min_length = Some(n),
                    "maxLength" => s.max_length = Some(n),
                    "minItems" => s.min_items = Some(n),
                    _ => s.max_items = Some(n),
                },
                None => bad("must be a non-negative integer"),
            },
            "minimum" | "maximum" => match val.as_f64() {
                Some(x) if k == "minimum" => s.minimum = Some(x),
                Some(x) => s.maximum = Some(x),
                None => bad("must be a number"),
            },
            "description" | "title" => {}
            other => bad(&format!(
                "`{other}` is not supported (supported: {})",
                KEYWORDS.join(", ")
            )),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn schema(v: Value) -> Schema {
        let mut problems = Vec::new();
        let s = Schema::compile(&v, "s", &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        s
    }

    #[test]
    fn objects_are_checked_for_required_and_typed_properties() {
        let s = schema(
            json!({"type": "object", "required": ["name", "age"], "additionalProperties": false,
            "properties": {"name": {"type": "string", "minLength": 1}, "age": {"type": "integer", "minimum": 0},
                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}}}),
        );
        assert_eq!(
            s.violation(&json!({"name": "x", "age": 3, "tags": ["a"]})),
            None
        );
        assert!(s
            .violation(&json!({"name": "x"}))
            .unwrap()
            .contains("missing required `age`"));
        assert!(s
            .violation(&json!({"name": "x", "age": 1.5}))
            .unwrap()
            .contains("/age: expected integer"));
        assert!(s
            .violation(&json!({"name": "", "age": 1}))
            .unwrap()
            .contains("/name"));
        assert!(s
            .violation(&json!({"name": "x", "age": 1, "tags": ["c"]}))
            .unwrap()
            .contains("/tags/0"));
        assert!(s
            .violation(&json!({"name": "x", "age": 1, "z": 1}))
            .unwrap()
            .contains("unexpected property `z`"));
        assert!(s
            .violation(&json!([1]))
            .unwrap()
            .starts_with("/: expected object"));
    }

    #[test]
    fn unsupported_keywords_are_config_errors() {
        let mut problems = Vec::new();
        Schema::compile(
            &json!({"type": "strin", "pattern": "x", "properties": {"a": {"oneOf": []}}}),
            "s",
            &mut problems,
        );
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems
            .iter()
            .any(|p| p.contains("`pattern` is not supported")));
        assert!(problems.iter().any(|p| p.contains("s.properties.a.oneOf")));
    }
}
