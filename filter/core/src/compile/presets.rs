//! Presets for OpenAI-compatible services (`preset:` on a provider): what
//! each fills when the provider's config leaves it out. The provider still
//! names its Envoy cluster (where the service is, with TLS to it); any field
//! the config sets wins over the preset's.
//!
//! `drop_fields` are top-level request fields the service refuses although
//! OpenAI's API has them: the gateway removes them before sending (and does
//! not ask for `stream_options` itself when that is one of them), and tells
//! the client which of its fields it dropped. Only refusals seen in the
//! services' own answers are listed (docs/providers.md says where each
//! comes from); a service that ignores a field needs nothing.

/// One preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    pub name: &'static str,
    /// The `:authority` sent (the service's host name).
    pub host: &'static str,
    /// The path before `/chat/completions`.
    pub base_path: &'static str,
    /// The environment variable holding the key; `None`: the service takes
    /// no key (a local server), so no credential header is sent.
    pub api_key_env: Option<&'static str>,
    /// Fields removed from requests before they are sent.
    pub drop_fields: &'static [&'static str],
}

const fn hosted(
    name: &'static str,
    host: &'static str,
    base_path: &'static str,
    env: &'static str,
    drop_fields: &'static [&'static str],
) -> Preset {
    Preset {
        name,
        host,
        base_path,
        api_key_env: Some(env),
        drop_fields,
    }
}

const fn local(name: &'static str) -> Preset {
    Preset {
        name,
        host: "localhost",
        base_path: "/v1",
        api_key_env: None,
        drop_fields: &[],
    }
}

/// Every preset, by name.
pub const PRESETS: &[Preset] = &[
    hosted("groq", "api.groq.com", "/openai/v1", "GROQ_API_KEY", &[]),
    // Mistral answers 422 `extra_forbidden` for `stream_options` and sends
    // the usage in a stream's last chunk without being asked.
    hosted(
        "mistral",
        "api.mistral.ai",
        "/v1",
        "MISTRAL_API_KEY",
        &["stream_options"],
    ),
    hosted(
        "deepseek",
        "api.deepseek.com",
        "/v1",
        "DEEPSEEK_API_KEY",
        &[],
    ),
    hosted(
        "together",
        "api.together.xyz",
        "/v1",
        "TOGETHER_API_KEY",
        &[],
    ),
    hosted(
        "fireworks",
        "api.fireworks.ai",
        "/inference/v1",
        "FIREWORKS_API_KEY",
        &[],
    ),
    hosted(
        "openrouter",
        "openrouter.ai",
        "/api/v1",
        "OPENROUTER_API_KEY",
        &[],
    ),
    hosted("xai", "api.x.ai", "/v1", "XAI_API_KEY", &[]),
    hosted(
        "perplexity",
        "api.perplexity.ai",
        "",
        "PERPLEXITY_API_KEY",
        &[],
    ),
    local("vllm"),
    local("ollama"),
    local("lmstudio"),
];

/// The preset of that name.
pub fn find(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// The presets' names, for an error message.
pub fn names() -> String {
    PRESETS
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn every_preset_is_found_by_its_name_and_paths_are_well_formed() {
        assert_eq!(PRESETS.len(), 11);
        for p in PRESETS {
            assert_eq!(find(p.name), Some(p));
            assert!(p.base_path.is_empty() || p.base_path.starts_with('/'));
            assert!(!p.base_path.ends_with('/'), "{}", p.name);
            assert!(!p.host.is_empty());
        }
        assert_eq!(find("openai"), None);
        assert!(names().starts_with("groq, mistral"));
    }
}
