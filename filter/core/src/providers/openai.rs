//! OpenAI's API and every server compatible with it: the identity format.
//! Each inbound API it serves goes to `<base_path>/<endpoint>` as the
//! client sent it (the model id spliced in); the key is a bearer token.

use super::{base, endpoint, path_segment, Format};
use crate::api::Api;
use crate::config::Provider;

pub struct OpenAi;

impl Format for OpenAi {
    fn path(&self, p: &Provider, api: Api, model_id: &str, _stream: bool) -> String {
        if api == Api::Realtime {
            // A session names its model in the upgrade's query.
            return format!("{}/realtime?model={}", base(p), path_segment(model_id));
        }
        [base(p), "/", endpoint(api)].concat()
    }

    fn credential(&self, key: &str) -> (&'static str, String) {
        ("authorization", ["Bearer ", key].concat())
    }
}
