//! The in-process transport of the bundled components (scheduler, controllers): a tower service
//! that hands a `kube::Client`'s requests straight to [`Api::handle`] with a fixed caller, so they
//! skip TCP, TLS and the HTTP codec but keep authentication's identity, authorization and
//! admission exactly as for a remote client.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::api::{Api, Body, Caller, collect_body, error_response};

/// A tower service over the API handler, acting as one caller.
#[derive(Debug, Clone)]
pub struct InProcess {
    api: Api,
    caller: Arc<Caller>,
    user_agent: http::HeaderValue,
}

impl InProcess {
    /// A transport on which every request comes from `caller`; requests without a User-Agent
    /// get `component` (the API server names a writer's field manager after it, as upstream's
    /// components are named `kube-scheduler`, `kube-controller-manager`).
    pub fn new(api: Api, caller: Caller, component: &'static str) -> Self {
        Self {
            api,
            caller: Arc::new(caller),
            user_agent: http::HeaderValue::from_static(component),
        }
    }

    /// A `kube::Client` over this transport (default namespace `default`).
    pub fn client(self) -> kube::Client {
        kube::Client::new(self, "default")
    }
}

impl tower::Service<http::Request<kube::client::Body>> for InProcess {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let (api, caller) = (self.api.clone(), self.caller.clone());
        let user_agent = self.user_agent.clone();
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            parts
                .headers
                .entry(http::header::USER_AGENT)
                .or_insert(user_agent);
            Ok(match collect_body(body).await {
                Ok(bytes) => {
                    api.handle(Some(&caller), http::Request::from_parts(parts, bytes))
                        .await
                }
                Err(e) => error_response(&e),
            })
        })
    }
}
