//! The Responses API is stateful: a response lives at the provider that
//! made it. The gateway remembers which provider that was (a bounded table
//! in shared data, `portcullis_core::routing::affinity`), so that
//! `GET`/`DELETE /v1/responses/{id}` and `.../input_items` reach it, and a
//! request chained with `previous_response_id` goes to it too — never
//! silently elsewhere, where the conversation does not exist. A response
//! belongs to the client that made it (#61): for any other key it does not
//! exist (404 when read, listed, deleted or chained to, as the provider
//! says of a response it does not have), and a chain to a
//! response the gateway does not know is refused the same way, since the
//! provider would find it with the gateway's own credential.

use crate::host::Host;
use crate::host::{Action, LogLevel};
use crate::request::{Phase, RequestContext};
use crate::upstream::UpstreamRequest;
use portcullis_core::api::{self, kept};
use portcullis_core::config::Gateway;
use portcullis_core::error::GatewayError;
use portcullis_core::routing::affinity;
use portcullis_core::shared::keys;
use portcullis_core::translate;

impl<H: Host> RequestContext<H> {
    /// The first bytes of a kept response: remember its provider.
    pub(crate) fn remember_response(&mut self, head: &[u8]) {
        let Some(f) = self.flight.as_mut() else {
            return;
        };
        f.remember_response = false;
        let Some(id) = kept::id_of_answer(head) else {
            return;
        };
        let Some(provider) = self.answering_provider() else {
            return;
        };
        let Some(owner) = self.owner_name() else {
            return;
        };
        let now = self.host.now_ms();
        let Some(entry) = affinity::encode(id, &owner, &provider, now) else {
            return;
        };
        let key = keys::response_slot(affinity::slot(id));
        if let Err(e) = self.host.set(&key, &entry, None) {
            self.host.log(
                LogLevel::Warn,
                &format!("cannot remember response {id}: {e:?}"),
            );
        }
    }

    /// The name of the client this request acts as (a response's owner).
    fn owner_name(&self) -> Option<String> {
        let loaded = self.loaded.as_ref()?;
        self.client(&loaded.gw).map(|c| c.name.clone())
    }

    /// The provider (by index) that made a response, if the gateway knows
    /// it as this client's.
    pub(crate) fn response_provider(&self, gw: &Gateway, id: &str) -> Option<usize> {
        let owner = self.client(gw)?.name.as_str();
        let key = keys::response_slot(affinity::slot(id));
        let (entry, _) = self.host.get(&key).ok()?;
        let name = affinity::provider_of(&entry?, id, owner, self.host.now_ms())?;
        gw.providers.iter().position(|p| p.name == name)
    }

    /// `GET`/`DELETE /v1/responses/{id}[/input_items]`: to the provider
    /// that made it, as the client sent it (with that provider's key).
    pub(crate) fn response_by_id(
        &mut self,
        gw: &Gateway,
        path_and_query: &str,
    ) -> Result<Action, GatewayError> {
        let (path, query) = match path_and_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_and_query, None),
        };
        let Some((id, tail)) = kept::by_id(path.trim_end_matches('/')) else {
            return Err(GatewayError::not_found_path(
                "GET",
                path,
                &api::served_paths(),
            ));
        };
        let Some(index) = self.response_provider(gw, id) else {
            return Err(GatewayError::new(
                404,
                "invalid_request_error",
                "response_not_found",
                format!("The gateway does not know response `{id}` for this key: it remembers which provider made each response, and for which key, for 24 hours, and this one is another key's, unknown or older."),
            ));
        };
        let loaded = self.loaded()?;
        let p = loaded
            .gw
            .providers
            .get(index)
            .ok_or_else(|| GatewayError::internal("a remembered provider is gone"))?;
        let base = translate::path(p, kept::API, "", false);
        let mut upstream_path = match base.split_once('?') {
            Some((b, q)) => format!("{b}/{id}{tail}?{q}"),
            None => format!("{base}/{id}{tail}"),
        };
        if let Some(q) = query {
            upstream_path.push(if upstream_path.contains('?') {
                '&'
            } else {
                '?'
            });
            upstream_path.push_str(q);
        }
        // `?stream=true` replays a stored response as its events.
        let stream = query.is_some_and(|q| q.split('&').any(|kv| kv == "stream=true"));
        let up = UpstreamRequest::to_provider(&loaded, index, upstream_path, stream, None)?;
        self.request.has_content_type = true;
        let traceparent = self.attempt_traceparent();
        crate::upstream::through_router(&self.host, &up, &self.request, traceparent, 0)?;
        // Passed on as it is: nothing of it is read.
        self.phase = Phase::Done;
        Ok(Action::Continue)
    }

    /// A request chained with `previous_response_id` goes only to the
    /// provider that made that response, when the gateway knows it: no
    /// fallback to a provider without the conversation.
    pub(crate) fn pin_to_previous_response(&mut self, gw: &Gateway) -> Result<(), GatewayError> {
        let Some(f) = self.flight.as_ref() else {
            return Ok(());
        };
        let Some(previous) = kept::previous_id(f.chat.document()?).map(str::to_string) else {
            return Ok(());
        };
        // Only a provider that keeps responses itself (its answers passed
        // as they are) holds a conversation; a translated one refuses the
        // field by name further on.
        let kept_by_a_candidate = f.candidates.iter().any(|(p, _)| {
            gw.providers
                .get(*p)
                .is_some_and(|p| translate::back_for(p, &f.chat).is_none())
        });
        if !kept_by_a_candidate {
            return Ok(());
        }
        let Some(index) = self.response_provider(gw, &previous) else {
            // Unknown, another key's, or forgotten: the provider would find
            // another key's with the gateway's credential, so the gateway
            // answers as the provider does for one it does not have.
            return Err(GatewayError::new(
                404,
                "invalid_request_error",
                "previous_response_not_found",
                format!("Previous response with id '{previous}' not found."),
            ));
        };
        let Some(f) = self.flight.as_mut() else {
            return Ok(());
        };
        f.candidates.retain(|(p, _)| *p == index);
        if f.candidates.is_empty() {
            let name = gw.providers.get(index).map_or("", |p| p.name.as_str());
            return Err(GatewayError::new(
                400,
                "invalid_request_error",
                "previous_response_elsewhere",
                format!("`previous_response_id` {previous} was made by provider `{name}`, which does not serve model `{}` here: chain to a response of this model's provider, or send the whole conversation in `input`.", f.chat.model),
            ));
        }
        Ok(())
    }
}
