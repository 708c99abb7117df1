//! How a [`Decision`] becomes response headers and denial responses.
//!
//! Every limited response carries, for the *constraining* window (the one
//! with the fewest requests remaining; ties go to the shorter window, then
//! to the user's own before a route-wide one):
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

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use crate::rules::{ietf_name, HeaderMode, Policy};
use crate::store::Decision;

/// `x-ratelimit-limit`
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `x-ratelimit-remaining`
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `x-ratelimit-reset`
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// Numbers below this are header values of static text.
const SMALL_NUMBERS: usize = 10_000;

/// The decimal text of 0 to 9,999, one after the other, written at
/// compile time: 1 digit each below 10, 2 below 100, 3 below 1,000, 4 up
/// to 9,999, so a number's text starts at an offset computed without a
/// table.
const DIGITS: &str = match std::str::from_utf8(&DIGIT_BYTES) {
    Ok(text) => text,
    Err(_) => panic!("digits are ASCII"),
};

/// [`DIGITS`]' bytes.
static DIGIT_BYTES: [u8; 10 + 2 * 90 + 3 * 900 + 4 * 9000] = {
    let mut out = [0u8; 10 + 2 * 90 + 3 * 900 + 4 * 9000];
    let mut at = 0;
    let mut n = 0;
    while n < SMALL_NUMBERS {
        let width = small_width(n);
        let mut rest = n;
        let mut i = width;
        while i > 0 {
            i -= 1;
            out[at + i] = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        at += width;
        n += 1;
    }
    out
};

/// How many digits `n` (below [`SMALL_NUMBERS`]) has.
const fn small_width(n: usize) -> usize {
    1 + (n >= 10) as usize + (n >= 100) as usize + (n >= 1000) as usize
}

/// Where `n`'s text starts in [`DIGITS`].
const fn small_offset(n: usize) -> usize {
    match small_width(n) {
        1 => n,
        2 => 10 + 2 * (n - 10),
        3 => 190 + 3 * (n - 100),
        _ => 2890 + 4 * (n - 1000),
    }
}

/// A header value for a number. Small ones (the common case) are static
/// text: a value that points into [`DIGITS`], with no allocation, no
/// reference count for the threads to share, and no memory read but the
/// digits themselves (which the server reads anyway to write them).
pub(crate) fn number(n: u64) -> HeaderValue {
    match small_text(n) {
        // (Digits only: `from_static`'s check of each byte passes.)
        Some(text) => HeaderValue::from_static(text),
        None => big_number(n),
    }
}

/// The static text of `n` if it is below [`SMALL_NUMBERS`].
fn small_text(n: u64) -> Option<&'static str> {
    let i = usize::try_from(n).ok().filter(|&i| i < SMALL_NUMBERS)?;
    let start = small_offset(i);
    DIGITS.get(start..start + small_width(i))
}

/// The text of a rule's limit, made when the rules are built (never on a
/// request's path: it may take a lock): static whatever the number, so that each response's header costs no
/// allocation and no reference count that every thread's requests would
/// share (a cache line passed between cores), and a response future holds
/// it in 16 bytes where a header value takes 40. Limits from 10,000 up
/// are written once per distinct number and kept for the process's life,
/// however often rules are rebuilt.
pub(crate) fn limit_text(n: u32) -> &'static str {
    if let Some(text) = small_text(u64::from(n)) {
        return text;
    }
    static WRITTEN: OnceLock<Mutex<HashMap<u32, &'static str>>> = OnceLock::new();
    let mut written = WRITTEN
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    written
        .entry(n)
        .or_insert_with(|| Box::leak(n.to_string().into_boxed_str()))
}

/// A header value formatted on the spot (out of line: rare). Its digits
/// are written on the stack by `itoa`, the code hyper already runs for
/// every response's `Content-Length` (so a request touches no formatting
/// code of its own: 14 fewer hot lines of code per request than a digit
/// loop here, round 22 in benches/HISTORY.md), and copied once into a
/// buffer of their exact size: one allocation, where
/// `HeaderValue::from(u64)` makes two (a growable buffer, then a shared one
/// when it is frozen). The copy goes through `HeaderValue::from_str`, whose
/// check the compiler inlines here.
#[inline(never)]
fn big_number(n: u64) -> HeaderValue {
    HeaderValue::from_str(itoa::Buffer::new().format(n))
        .unwrap_or_else(|_| HeaderValue::from_static("0"))
}

/// `n` seconds in a header's 32 bits (136 years at most).
fn saturate(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Whole seconds in `d`, rounded up.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// The `Retry-After` seconds for a wait of `d`: rounded up, at least 1.
pub fn retry_after_secs(d: Duration) -> u64 {
    ceil_secs(d).max(1)
}

/// `ratelimit-policy` (draft-ietf-httpapi-ratelimit-headers-10)
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `ratelimit` (draft-ietf-httpapi-ratelimit-headers-10)
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The rate-limit headers of one decision, computed before the inner
/// service runs and added to its response afterwards (to a response the
/// layer writes, at once). Kept as numbers and static text until then, in
/// 40 bytes, so the response future stays small to move.
#[derive(Clone, Debug, Default)]
pub(crate) struct RateHeaders {
    /// `X-RateLimit-Limit` (the rule's static text: see [`limit_text`]);
    /// `None`: no `X-RateLimit-*` headers.
    limit: Option<&'static str>,
    /// A constraining window's limit the rule has no text for, written
    /// when the headers are (in place of `limit`'s text); 0 for none. Only
    /// a store whose decision has windows its check did not have gives
    /// one: never the crate's own.
    unlisted: u32,
    remaining: u32,
    /// Seconds (saturated: 136 years).
    reset: u32,
    /// `Retry-After` seconds; 0 for none (a wait is at least 1 s).
    retry_after: u32,
    /// The headers of the other modes (IETF, per window).
    extra: Option<Box<Extra>>,
}

/// Headers beyond the `X-RateLimit-*` three (boxed in [`RateHeaders`], so
/// that the usual response's future stays small to move).
#[derive(Clone, Debug)]
enum Extra {
    /// `RateLimit-Policy` and `RateLimit`.
    Ietf([HeaderValue; 2]),
    /// Each window's own limit and remaining ([`HeaderMode::XWindows`]).
    Windows(Vec<(HeaderName, HeaderValue)>),
}

impl RateHeaders {
    /// The headers of `decision` on `policy`, in `mode`, for a request of
    /// `cost`; a denial gets `Retry-After`, unless the request costs more
    /// than a limit and can never pass.
    // (Inlined into `on_decision`, with it into `on_identity`.)
    #[inline(always)]
    pub(crate) fn new(decision: &Decision, policy: &Policy, mode: HeaderMode, cost: u32) -> Self {
        // (A denial gets one, at least 1 s: a store that gave no wait still
        // said no. Not one that never passes: its wait is the whole window
        // the stores report, not a time it may pass.)
        let retry_after = if decision.allowed() {
            0
        } else {
            crate::cold_path();
            match decision.exceeds_limit(cost) {
                true => 0,
                false => saturate(retry_after_secs(decision.retry_after().unwrap_or_default())),
            }
        };
        let Some((index, w)) = decision
            .constraining_index()
            .and_then(|i| Some((i, decision.windows().get(i)?)))
        else {
            return Self {
                retry_after,
                ..Self::default()
            };
        };
        // (The constraining window's own reset, on a denial too: when
        // another window also denies, as when two are both spent, it frees
        // a slot before the request may pass, which `Retry-After` tells.)
        let reset = saturate(ceil_secs(decision.reset_after()));
        let x_headers = matches!(
            mode,
            HeaderMode::X | HeaderMode::Both | HeaderMode::XWindows
        );
        let (limit, unlisted) = match (x_headers, policy.limits.get(index)) {
            (false, _) => (None, 0),
            (true, Some(&text)) => (Some(text), 0),
            // (Each window of a policy has its text: this is for a
            // decision with windows the check did not have.)
            (true, None) => (Some(""), w.window().limit()),
        };
        let extra = match (mode, &policy.ietf_policy) {
            (HeaderMode::Ietf | HeaderMode::Both, Some(p)) => {
                ietf_headers(decision, policy, p, u64::from(reset))
            }
            (HeaderMode::XWindows, _) => window_headers(decision, policy),
            _ => None,
        };
        Self {
            limit,
            unlisted,
            remaining: w.remaining,
            reset,
            retry_after,
            extra,
        }
    }

    /// Whether the headers show every window's remaining (the IETF and
    /// per-window modes), not the constraining window's alone.
    pub(crate) fn shows_every_window(&self) -> bool {
        self.extra.is_some()
    }

    /// Without `Retry-After` (shadow mode lets a would-be denial through).
    pub(crate) fn without_retry(mut self) -> Self {
        self.retry_after = 0;
        self
    }

    #[inline]
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        let Self {
            limit,
            unlisted,
            remaining,
            reset,
            retry_after,
            extra,
        } = self;
        if let Some(limit) = limit {
            let limit = match unlisted {
                0 => HeaderValue::from_static(limit),
                n => number(u64::from(n)),
            };
            headers.insert(X_RATELIMIT_LIMIT, limit);
            headers.insert(X_RATELIMIT_REMAINING, number(u64::from(remaining)));
            headers.insert(X_RATELIMIT_RESET, number(u64::from(reset)));
        }
        if extra.is_some() || retry_after > 0 {
            apply_others(extra, retry_after, headers);
        }
    }
}

/// The other modes' headers and `Retry-After` of [`RateHeaders::apply`].
/// (Out of line: the common response, allowed with the `X-RateLimit-*`
/// headers, stays compact in the instruction cache.)
#[inline(never)]
fn apply_others(extra: Option<Box<Extra>>, retry_after: u32, headers: &mut HeaderMap) {
    match extra.map(|extra| *extra) {
        Some(Extra::Ietf([policy, state])) => {
            headers.insert(RATELIMIT_POLICY, policy);
            headers.insert(RATELIMIT, state);
        }
        Some(Extra::Windows(windows)) => {
            for (name, value) in windows {
                headers.insert(name, value);
            }
        }
        None => {}
    }
    if retry_after > 0 {
        headers
            .entry(RETRY_AFTER)
            .or_insert_with(|| number(u64::from(retry_after)));
    }
}

/// `RateLimit-Policy` and `RateLimit` (out of line: most services send only
/// the `X-RateLimit-*` headers).
#[inline(never)]
fn ietf_headers(
    decision: &Decision,
    policy: &Policy,
    ietf_policy: &HeaderValue,
    reset: u64,
) -> Option<Box<Extra>> {
    let value = ietf_ratelimit(decision, policy, reset)?;
    Some(Box::new(Extra::Ietf([ietf_policy.clone(), value])))
}

/// Each window's `X-RateLimit-Limit-<Window>` and
/// `X-RateLimit-Remaining-<Window>` (out of line, as the IETF headers).
#[inline(never)]
fn window_headers(decision: &Decision, policy: &Policy) -> Option<Box<Extra>> {
    let mut out = Vec::with_capacity(2 * decision.windows().len());
    for (i, w) in decision.windows().iter().enumerate() {
        let (Some(Some((limit_name, remaining_name))), Some(limit)) =
            (policy.window_headers.get(i), policy.limits.get(i))
        else {
            continue;
        };
        out.push((limit_name.clone(), HeaderValue::from_static(limit)));
        out.push((remaining_name.clone(), number(u64::from(w.remaining))));
    }
    Some(Box::new(Extra::Windows(out)))
}

/// `RateLimit`: one item per window with its remaining quota (`r`); the
/// constraining window also carries its reset (`t`).
fn ietf_ratelimit(decision: &Decision, policy: &Policy, reset: u64) -> Option<HeaderValue> {
    let constraining = decision.constraining_index();
    let user_windows = policy.windows.len();
    let mut out = String::with_capacity(24 * decision.windows().len());
    for (i, w) in decision.windows().iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(
            out,
            "\"{}\";r={}",
            ietf_name(&w.window(), i, user_windows),
            w.remaining
        );
        if constraining == Some(i) {
            let _ = write!(out, ";t={reset}");
        }
    }
    HeaderValue::from_str(&out).ok()
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

/// The default answer to a request that costs more than one of its
/// windows' limits: denied, and never to be allowed (no `Retry-After`).
pub(crate) fn too_costly() -> Response<Bytes> {
    problem(
        StatusCode::TOO_MANY_REQUESTS,
        "This request costs more than the rate limit allows; it can never be allowed.",
    )
}

/// The wait a client is told when the store is unavailable and the layer
/// fails closed.
pub(crate) const STORE_RETRY: Duration = Duration::from_secs(1);

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
    fn numbers_become_their_digits() {
        for n in [
            0,
            9,
            10,
            99,
            100,
            101,
            4095,
            4096,
            9_999,
            10_000,
            999_999,
            1_000_000_007,
            u64::MAX,
        ] {
            assert_eq!(number(n).to_str().unwrap(), n.to_string(), "{n}");
            assert_eq!(big_number(n).to_str().unwrap(), n.to_string(), "{n}");
            if let Ok(n) = u32::try_from(n) {
                assert_eq!(limit_text(n), n.to_string(), "{n}");
            }
        }
        // Every number with static text.
        for n in 0..SMALL_NUMBERS as u64 {
            assert_eq!(number(n).to_str().unwrap(), n.to_string(), "{n}");
        }
        // (A limit written once is the same static value after.)
        assert!(std::ptr::eq(
            limit_text(1_000_000_007),
            limit_text(1_000_000_007)
        ));
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

    /// A gRPC pushback is whole milliseconds, rounded up, and stays a
    /// 32-bit number for waits of a month or a year (a larger one, which
    /// some clients cannot read, would tell them never to retry).
    #[test]
    fn grpc_pushbacks_round_up_and_fit_in_32_bits() {
        let pushback = |retry| {
            let r = grpc(
                &HeaderMap::new(),
                GrpcStatus::ResourceExhausted,
                "slow down",
                Pushback::After(retry),
            );
            let ms = r.headers().get(GRPC_RETRY_PUSHBACK_MS).unwrap();
            let secs = r.headers().get(RETRY_AFTER).unwrap();
            (
                ms.to_str().unwrap().to_owned(),
                secs.to_str().unwrap().to_owned(),
            )
        };
        assert_eq!(
            pushback(Duration::from_micros(1_500)),
            ("2".into(), "1".into())
        );
        let month = Duration::from_secs(30 * 86_400);
        assert_eq!(pushback(month), ("2147483647".into(), "2592000".into()));
        let ten_years = Duration::from_secs(3_650 * 86_400);
        assert_eq!(pushback(ten_years).0, "2147483647");
    }
}

/// gRPC status codes the layer answers with.
#[derive(Clone, Copy, Debug)]
pub(crate) enum GrpcStatus {
    InvalidArgument = 3,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl GrpcStatus {
    /// The gRPC answer to an identity error of HTTP `status`: 401 (the
    /// default) is `UNAUTHENTICATED`, 403 `PERMISSION_DENIED`; 429, 502, 503
    /// and 504 are `UNAVAILABLE` (retryable), as gRPC's own HTTP-to-gRPC
    /// mapping has them; any other server error (such as a peer address the
    /// server did not record) is `INTERNAL`, any other client error
    /// `INVALID_ARGUMENT`.
    pub(crate) fn of_identity_error(status: StatusCode) -> Self {
        match status.as_u16() {
            401 => Self::Unauthenticated,
            403 => Self::PermissionDenied,
            429 | 502 | 503 | 504 => Self::Unavailable,
            s if s >= 500 => Self::Internal,
            _ => Self::InvalidArgument,
        }
    }
}

/// What a gRPC answer tells the client about retrying.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Pushback {
    /// Nothing (the client's retry policy decides).
    Unsaid,
    /// Retry after this long: `retry-after` (seconds, rounded up) and
    /// `grpc-retry-pushback-ms`.
    After(Duration),
    /// Do not retry: the request can never pass (a negative pushback, which
    /// gRPC clients read as "do not retry").
    Never,
}

/// A gRPC "trailers-only" answer: HTTP 200, `grpc-status` and
/// `grpc-message` (percent-encoded) in the headers, no body, and the
/// `pushback`. Its content type is the request's when that is gRPC-Web's
/// (`application/grpc-web*`), so a gRPC-Web client reads the answer too.
pub(crate) fn grpc(
    request: &HeaderMap,
    status: GrpcStatus,
    message: &str,
    pushback: Pushback,
) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    let content_type = request
        .get(CONTENT_TYPE)
        .filter(|v| starts_with_any_case(v.as_bytes(), b"application/grpc-web"))
        .cloned()
        .unwrap_or(HeaderValue::from_static("application/grpc"));
    headers.insert(CONTENT_TYPE, content_type);
    headers.insert(GRPC_STATUS, HeaderValue::from(status as u16));
    if let Ok(message) = HeaderValue::from_str(&grpc_message(message)) {
        headers.insert(GRPC_MESSAGE, message);
    }
    match pushback {
        Pushback::Unsaid => {}
        Pushback::After(retry) => {
            headers.insert(RETRY_AFTER, number(retry_after_secs(retry)));
            headers.insert(
                GRPC_RETRY_PUSHBACK_MS,
                HeaderValue::from(pushback_ms(retry)),
            );
        }
        Pushback::Never => {
            headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
        }
    }
    response
}

/// `grpc-retry-pushback-ms` for a wait of `retry`: whole milliseconds,
/// rounded up, at most `i32::MAX` (24.8 days): clients that read it as a
/// 32-bit number (grpc-java) take a larger one as unreadable, which gRFC
/// A6 says means "do not retry at all"; a longer wait is denied again
/// with the rest of it.
fn pushback_ms(retry: Duration) -> i32 {
    i32::try_from(retry.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
}

/// `message` percent-encoded as `grpc-message` wants it: every byte of its
/// UTF-8 outside printable ASCII (0x20 to 0x7E), and `%` itself, as `%XX`.
fn grpc_message(message: &str) -> Cow<'_, str> {
    let plain = |b: u8| (0x20..=0x7e).contains(&b) && b != b'%';
    if message.bytes().all(plain) {
        return Cow::Borrowed(message);
    }
    let mut out = String::with_capacity(message.len() + 16);
    for b in message.bytes() {
        if plain(b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    Cow::Owned(out)
}

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// Whether a request is gRPC: `content-type: application/grpc`, alone or
/// followed by `+` (a codec), `;` (parameters) or `-` (gRPC-Web's
/// `application/grpc-web*`), in any case (a media type's case does not
/// matter, and Tonic serves `Application/GRPC` too).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    headers.get(CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        starts_with_any_case(v, GRPC)
            && matches!(v.get(GRPC.len()), None | Some(b'+' | b';' | b'-'))
    })
}

/// Whether `bytes` starts with `prefix`, ASCII letters in either case.
fn starts_with_any_case(bytes: &[u8], prefix: &[u8]) -> bool {
    bytes
        .get(..prefix.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
}
