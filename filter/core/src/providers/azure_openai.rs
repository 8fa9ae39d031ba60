//! Azure OpenAI: OpenAI's bodies, with the deployment (the model id) in the
//! path (Responses: `/openai/responses`, the model in the body),
//! `api-version` in the query and the key in `api-key`.

use super::{base, endpoint, path_segment, Format};
use crate::api::Api;
use crate::config::{Provider, Schema};

pub struct AzureOpenAi;

impl Format for AzureOpenAi {
    fn path(&self, p: &Provider, api: Api, model_id: &str, _stream: bool) -> String {
        let version = match &p.schema {
            Schema::AzureOpenAi { api_version } => api_version.as_str(),
            _ => "",
        };
        if api == Api::Realtime {
            return format!(
                "{}/openai/realtime?api-version={}&deployment={}",
                base(p),
                path_segment(version),
                path_segment(model_id)
            );
        }
        if api == Api::Responses {
            // Responses name the model in the body, not by deployment path.
            return format!(
                "{}/openai/responses?api-version={}",
                base(p),
                path_segment(version)
            );
        }
        format!(
            "{}/openai/deployments/{}/{}?api-version={}",
            base(p),
            path_segment(model_id),
            endpoint(api),
            path_segment(version)
        )
    }

    fn credential(&self, key: &str) -> (&'static str, String) {
        ("api-key", key.to_string())
    }
}
