//! OpenAI's moderations, `POST /v1/moderations`: `input` (a string, strings,
//! or text and image parts) and `model`. OpenAI does not charge for them;
//! a config may price them by tokens. Served by OpenAI-compatible and
//! Azure OpenAI providers.

pub const PATH: &str = "/v1/moderations";
