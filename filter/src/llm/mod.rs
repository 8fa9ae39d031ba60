//! The LLM request path: a model call from its headers to its answer,
//! as steps on [`RequestContext`](crate::request::RequestContext).
//!
//! | file | step |
//! |---|---|
//! | `pipeline` | the request's life as steps, top to bottom |
//! | `headers`, `body` | authenticate at the headers; the body's steps |
//! | `limit_service` | the calls to the fleet's rate limit service |
//! | `policy` | conditional routes, strategies, pinned providers |
//! | `attempts` | candidates, breakers, fallback callouts |
//! | `answer` | the one answer path (begin / chunk / end) |
//! | `cache` | the prompt cache's step: the exact tiers, the fleet's, the semantic tier, handed their parts; a hit served |
//! | `guard` | the guardrails' step: input checks and external guards, output checks, handed their parts |
//! | `stored_responses` | which provider kept a response: by-id requests, chaining |
//!
//! May use: `host`, `loaded`, `limits`, `health`, `request`, `upstream`, `guardrails`, `cache`.

pub mod answer;
pub mod attempts;
pub mod body;
pub mod cache;
pub mod guard;
pub mod headers;
pub mod limit_service;
pub mod pipeline;
pub mod policy;
pub mod stored_responses;
