//! How a [`Decision`] becomes response headers and denial responses.
//!
//! Every limited response carries, for the *constraining* window (the one
//! with the fewest requests remaining; ties go to the shorter window):
//!
//! | header | value |
//! |---|---|
//! | `X-RateLimit-Limit` | the window's limit |
//! | `X-RateLimit-Remaining` | requests left in it, after counting this one |
//! | `X-RateLimit-Reset` | seconds, rounded up, until it frees a slot |
//!
//! A denied request is answered `429 Too Many Requests` with the same
//! headers, `Retry-After` (RFC 9110 §10.2.3: seconds until this request
//! would be allowed, rounded **up**, at least 1, the largest wait among the
//! windows that deny), and an RFC 9457 `application/problem+json` body.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use crate::store::Decision;

/// `x-ratelimit-limit`
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `x-ratelimit-remaining`
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `x-ratelimit-reset`
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// Whole seconds in `d`, rounded up.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The `Retry-After` seconds for a wait of `d`: rounded up, at least 1.
pub fn retry_after_secs(d: Duration) -> u64 {
    ceil_secs(d).max(1)
}

/// The rate-limit headers of one decision, computed before the inner
/// service runs and added to its response afterwards.
#[derive(Clone, Debug)]
pub(crate) struct RateHeaders {
    limit: HeaderValue,
    remaining: HeaderValue,
    reset: HeaderValue,
    retry_after: Option<HeaderValue>,
}

impl RateHeaders {
    pub(crate) fn new(decision: &Decision) -> Option<Self> {
        let w = decision.constraining()?;
        Some(Self {
            limit: HeaderValue::from(w.window.limit()),
            remaining: HeaderValue::from(w.remaining),
            reset: HeaderValue::from(ceil_secs(decision.reset_after())),
            retry_after: decision
                .retry_after()
                .filter(|_| !decision.allowed())
                .map(|d| HeaderValue::from(retry_after_secs(d))),
        })
    }

    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        headers.insert(X_RATELIMIT_LIMIT, self.limit);
        headers.insert(X_RATELIMIT_REMAINING, self.remaining);
        headers.insert(X_RATELIMIT_RESET, self.reset);
        if let Some(retry) = self.retry_after {
            headers.entry(RETRY_AFTER).or_insert(retry);
        }
    }
}

/// An RFC 9457 problem response.
pub(crate) fn problem(status: StatusCode, detail: &str) -> Response<Bytes> {
    let title = status.canonical_reason().unwrap_or("Error");
    let mut body = String::with_capacity(80 + detail.len());
    body.push_str(r#"{"type":"about:blank","title":""#);
    push_json_escaped(&mut body, title);
    body.push_str(r#"","status":"#);
    body.push_str(status.as_str());
    body.push_str(r#","detail":""#);
    push_json_escaped(&mut body, detail);
    body.push_str("\"}");
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    response
}

/// The default answer to a denied request (headers are added by the layer).
pub(crate) fn too_many_requests() -> Response<Bytes> {
    const BODY: &str = r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"Rate limit exceeded; retry after the number of seconds in the Retry-After header."}"#;
    let mut response = Response::new(Bytes::from_static(BODY.as_bytes()));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    response.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    response
}

/// The answer when the store failed and the layer fails closed.
pub(crate) fn store_unavailable() -> Response<Bytes> {
    let mut response = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "The rate limiter's store is unavailable.",
    );
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

fn push_json_escaped(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_and_is_at_least_one() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_micros(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
    }

    #[test]
    fn problem_bodies_are_valid_json() {
        let r = problem(StatusCode::UNAUTHORIZED, "bad \"key\"\n\\");
        let body = std::str::from_utf8(r.body()).unwrap();
        assert_eq!(
            body,
            r#"{"type":"about:blank","title":"Unauthorized","status":401,"detail":"bad \"key\"\u000a\\"}"#
        );
    }
}
