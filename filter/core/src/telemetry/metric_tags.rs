//! The labels inside a metric name, taken out as Envoy's `stats_tags` in
//! `envoy/envoy.yaml` take them out of the Wasm build's names
//! (`portcullis.requests.client.<c>.provider.<p>...total` becomes
//! `portcullis.requests.total{client,provider,...}`). The native build
//! declares each metric this way (the dynamic-module ABI takes a name and
//! label names, fixed when the filter config is created), so both builds
//! give Prometheus the same metrics.

/// The label keys and where in a name each may stand (the same rules as
/// the bootstrap's regexes): after `portcullis.<family>` for most, only in
/// some families for others.
fn allowed(key: &str, family: &str, at: usize) -> bool {
    match key {
        "client" | "model" | "status" => at >= 2,
        "provider" => at >= 1,
        "cache" => family == "requests" && at >= 2,
        "experiment" => family == "experiment_requests" && at == 2,
        "arm" => family == "experiment_requests" && at >= 3,
        "class" => family == "provider" && at >= 3,
        "stage" => family == "guardrail" && at == 2,
        "check" => family == "guardrail" && at >= 3,
        _ => false,
    }
}

const KEYS: [&str; 10] = [
    "client",
    "provider",
    "model",
    "status",
    "cache",
    "experiment",
    "arm",
    "class",
    "stage",
    "check",
];

/// A metric name (`portcullis.`...) as its name without the labels and
/// the labels in the order they stand; `None` for a name that is not the
/// gateway's. A label's value is never the name's last part (the
/// bootstrap's rules need a dot after it), and each key is taken once.
pub fn split(name: &str) -> Option<(String, Vec<(&'static str, &str)>)> {
    let parts: Vec<&str> = name.split('.').collect();
    if parts.first() != Some(&"portcullis") || parts.len() < 2 {
        return None;
    }
    let family = parts.get(1).copied().unwrap_or_default();
    let mut base = String::from("portcullis");
    let mut labels: Vec<(&'static str, &str)> = Vec::new();
    let mut i = 1;
    while let Some(part) = parts.get(i) {
        let key = KEYS
            .iter()
            .find(|k| **k == *part && !labels.iter().any(|(t, _)| t == *k));
        match key {
            Some(k) if allowed(k, family, i) && i + 2 < parts.len() => {
                labels.push((k, parts.get(i + 1).copied().unwrap_or_default()));
                i += 2;
            }
            _ => {
                base.push('.');
                base.push_str(part);
                i += 1;
            }
        }
    }
    Some((base, labels))
}

/// The name Envoy gives a metric declared with labels: its name, then each
/// label's key and value (`portcullis.requests.total.client.<c>...`).
pub fn labelled_name(base: &str, labels: &[(&str, &str)]) -> String {
    let mut out = base.to_string();
    for (k, v) in labels {
        out.push('.');
        out.push_str(k);
        out.push('.');
        out.push_str(v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn labels_come_out_as_the_bootstraps_stats_tags_take_them() {
        let (base, labels) = split(
            "portcullis.requests.client.demo.provider.p.model.gpt-4o.status.2xx.cache.off.total",
        )
        .unwrap();
        assert_eq!(base, "portcullis.requests.total");
        assert_eq!(
            labels,
            vec![
                ("client", "demo"),
                ("provider", "p"),
                ("model", "gpt-4o"),
                ("status", "2xx"),
                ("cache", "off")
            ]
        );
        let (base, labels) = split("portcullis.provider.primary.class.timeout.failures").unwrap();
        assert_eq!(base, "portcullis.failures");
        assert_eq!(labels, vec![("provider", "primary"), ("class", "timeout")]);
        let (base, labels) = split("portcullis.provider.primary.breaker_state").unwrap();
        assert_eq!(
            (base.as_str(), labels),
            ("portcullis.breaker_state", vec![("provider", "primary")])
        );
        let (base, labels) = split("portcullis.guardrail.stage.input.check.no-email.deny").unwrap();
        assert_eq!(base, "portcullis.guardrail.deny");
        assert_eq!(labels, vec![("stage", "input"), ("check", "no-email")]);
        let (base, labels) =
            split("portcullis.experiment_requests.experiment.e.arm.a.total").unwrap();
        assert_eq!(base, "portcullis.experiment_requests.total");
        assert_eq!(labels, vec![("experiment", "e"), ("arm", "a")]);
    }

    #[test]
    fn names_without_labels_and_words_outside_their_family_stay_whole() {
        for n in [
            "portcullis.cache.hits",
            "portcullis.global.errors.allow",
            "portcullis.config_generation",
        ] {
            assert_eq!(split(n), Some((n.to_string(), vec![])));
        }
        // `cache` is a label only in `requests`; a value is never last.
        assert_eq!(
            split("portcullis.x.model"),
            Some(("portcullis.x.model".into(), vec![]))
        );
        assert_eq!(split("other.cache.hits"), None);
    }

    #[test]
    fn the_labelled_name_is_envoys() {
        let (base, labels) = split("portcullis.latency.provider.p.ms").unwrap();
        assert_eq!(
            labelled_name(&base, &labels),
            "portcullis.latency.ms.provider.p"
        );
    }
}
