//! OpenAI's API and every server compatible with it: the identity format.
//! Each inbound API it serves goes to `<base_path>/<endpoint>` as the
//! client sent it (the model id spliced in); the key is a bearer token.

use super::{base, endpoint, Format};
use crate::api::Api;
use crate::config::Provider;

pub struct OpenAi;

impl Format for OpenAi {
    fn path(&self, p: &Provider, api: Api, _model_id: &str, _stream: bool) -> String {
        format!("{}/{}", base(p), endpoint(api))
    }

    fn credential(&self, key: &str) -> (&'static str, String) {
        ("authorization", format!("Bearer {key}"))
    }
}
