//! Warnings of the request being handled: code anywhere below [`collect`] adds one with [`warn`],
//! and each becomes a `Warning: 299 - "..."` header of the response ([`attach`]).

use std::cell::RefCell;
use std::future::Future;

use http::{HeaderValue, Response, header};

tokio::task_local! {
    static WARNINGS: RefCell<Vec<String>>;
}

/// Adds a warning to the current request's response (nothing outside [`collect`]).
pub(crate) fn warn(text: String) {
    let _ = WARNINGS.try_with(|w| w.borrow_mut().push(text));
}

/// Runs `fut` collecting the warnings raised while it runs.
pub(crate) async fn collect<F: Future>(fut: F) -> (F::Output, Vec<String>) {
    WARNINGS
        .scope(RefCell::new(Vec::new()), async {
            let out = fut.await;
            (out, WARNINGS.with(|w| w.take()))
        })
        .await
}

/// Adds `warnings` to `resp` as `Warning` headers.
pub(crate) fn attach<B>(resp: &mut Response<B>, warnings: Vec<String>) {
    for w in warnings {
        let text = format!("299 - {}", serde_json::Value::String(w));
        if let Ok(v) = HeaderValue::from_str(&text) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
}
