//! Who is asking: the user a request's budget belongs to, and their group.
//!
//! An identity source implements [`Identify`]. Any closure
//! `Fn(&http::request::Parts) -> impl Future<Output = Result<Identity, IdentityError>>`
//! does, as long as its future does not borrow the request head (copy what
//! it needs out of the head first, then `async move`; and name the
//! parameter's type, `|head: &Parts|`, which Rust does not infer for a
//! closure passed to a generic method). The examples here
//! key users by an `x-api-key` header as it comes; a real service keys them
//! by a key it has verified (a client that sends a new key with every
//! request is otherwise a new user with a fresh budget every time):
//!
//! ```
//! use http::request::Parts;
//! use tower_ratelimit::identity::{Identity, IdentityError};
//!
//! let identify = |head: &Parts| {
//!     let key = head.headers.get("x-api-key").map(|v| v.as_bytes().to_vec());
//!     async move {
//!         match key {
//!             Some(key) if key == b"admin-key" => Ok(Identity::new(key).with_group("admin")),
//!             Some(key) => Ok(Identity::new(key)),
//!             None => Err(IdentityError::new("missing x-api-key")),
//!         }
//!     }
//! };
//! # let _ = tower_ratelimit::RateLimitLayer::new(
//! #     tower_ratelimit::Rules::builder().build().unwrap(),
//! #     tower_ratelimit::MemoryStore::new(),
//! # ).identify(identify);
//! ```
//!
//! A named function does as well, written the same way: it copies out of
//! the head, and returns a future that does not capture the head's
//! lifetime. Since the 2024 edition, a returned `impl Future` captures
//! every lifetime of the arguments unless told otherwise, so the return
//! type says `use<>` (an `async fn` taking `&Parts` always borrows it, and
//! is refused with "one type is more general than the other": make it a
//! function like this one, or box its future):
//!
//! ```
//! use std::future::Future;
//! use http::request::Parts;
//! use tower_ratelimit::identity::{Identity, IdentityError};
//!
//! fn identify(
//!     head: &Parts,
//! ) -> impl Future<Output = Result<Identity, IdentityError>> + Send + use<> {
//!     let key = head.headers.get("x-api-key").map(|v| v.as_bytes().to_vec());
//!     async move { key.map(Identity::new).ok_or_else(|| IdentityError::new("missing x-api-key")) }
//! }
//! # let _ = tower_ratelimit::RateLimitLayer::new(
//! #     tower_ratelimit::Rules::builder().build().unwrap(),
//! #     tower_ratelimit::MemoryStore::new(),
//! # ).identify(identify);
//! ```
//!
//! Built-ins: [`ClientIp`] (the peer address), [`ForwardedIp`] (the client
//! behind trusted reverse proxies), [`HeaderKey`] (a verified header, such
//! as an API key a gateway has checked)
//! and [`Global`] (one budget for everyone). Identities are
//! arbitrary bytes of any length: the layer encodes them into store keys so
//! that no identity can reach another user's budget (see
//! [the crate docs](crate#keys)).
//!
//! The layer cannot know that a closure's future is ready before it polls
//! it, so it holds the request for it (one allocation and a clone of the
//! inner service per limited request). An identity that never waits (it
//! reads the head, nothing else) should say so with [`immediate`]: on a
//! store that answers at once (the memory store) the layer then decides at
//! once, as it does with the built-ins. (A request waiting for Redis is
//! held either way.)
//!
//! Users are their bytes and nothing else. An identity function that
//! returns users of several kinds (an API key when there is one, else the
//! client's IP) should give each kind a prefix the others cannot have, or
//! a key that reads `203.0.113.7` is the client at that address and spends
//! its budget:
//!
//! ```
//! use http::request::Parts;
//! use tower_ratelimit::identity::{self, ClientIp, Identity, IdentityError};
//!
//! let identify = identity::immediate(|head: &Parts| {
//!     // (A key sent twice is a 400: see `single_header`.)
//!     match (identity::single_header(&head.headers, "x-api-key")?, ClientIp::peer(head)) {
//!         // (No IP's text starts with "key:".)
//!         (Some(key), _) => Ok(Identity::new([b"key:".as_slice(), key.as_bytes()].concat())),
//!         (None, Some(peer)) => Ok(Identity::from_ip(peer.ip())),
//!         (None, None) => Err(IdentityError::new("no api key and no peer address")),
//!     }
//! });
//! # let _ = tower_ratelimit::RateLimitLayer::new(
//! #     tower_ratelimit::Rules::builder().build().unwrap(),
//! #     tower_ratelimit::MemoryStore::new(),
//! # ).identify(identify);
//! ```

use std::borrow::Cow;
use std::fmt;
use std::future::{ready, Future, Ready};
use std::net::SocketAddr;

use arrayvec::ArrayVec;
use http::header::AsHeaderName;
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::rules::DEFAULT_GROUP;

mod forwarded;
pub use forwarded::{Client, ForwardedIp, Network};

/// A user and the group whose rules apply to them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    user: User,
    group: Cow<'static, str>,
}

/// A user's bytes: inline when short (IP addresses, and short users given
/// by reference: no allocation).
#[derive(Clone, Debug)]
enum User {
    Inline(ArrayVec<u8, 46>),
    Heap(Vec<u8>),
}

/// (The same bytes are the same user, wherever they are kept.)
impl PartialEq for User {
    fn eq(&self, other: &Self) -> bool {
        self.bytes() == other.bytes()
    }
}

impl Eq for User {}

impl User {
    fn bytes(&self) -> &[u8] {
        match self {
            User::Inline(bytes) => bytes,
            User::Heap(bytes) => bytes,
        }
    }
}

impl Identity {
    /// The user `user`, in group `"default"`.
    pub fn new(user: impl Into<Vec<u8>>) -> Self {
        Self {
            user: User::Heap(user.into()),
            group: Cow::Borrowed(DEFAULT_GROUP),
        }
    }

    /// The user `user`, copied, in group `"default"`: kept inline, with no
    /// allocation, when at most 46 bytes long (an API key, a user id, a
    /// header's value), else on the heap.
    ///
    /// ```
    /// use tower_ratelimit::identity::Identity;
    ///
    /// let key = b"api-key-0123456789";
    /// assert_eq!(Identity::from_slice(key), Identity::new(&key[..]));
    /// ```
    pub fn from_slice(user: &[u8]) -> Self {
        Self {
            user: match ArrayVec::try_from(user) {
                Ok(inline) => User::Inline(inline),
                Err(_) => User::Heap(user.to_vec()),
            },
            group: Cow::Borrowed(DEFAULT_GROUP),
        }
    }

    /// The user named by an IP address, in group `"default"`; IPv6
    /// addresses stand for their /64 (one host commonly owns a whole /64),
    /// IPv4-mapped IPv6 addresses (`::ffff:192.0.2.1`) and those of the
    /// RFC 6052 well-known prefix (`64:ff9b::192.0.2.1`: an IPv4 client
    /// through a stateless translator, SIIT, reaching an IPv6-only server)
    /// for the IPv4 address they hold.
    ///
    /// ```
    /// use tower_ratelimit::identity::Identity;
    ///
    /// let ip = |text: &str| Identity::from_ip(text.parse().unwrap());
    /// assert_eq!(ip("2001:db8:1:2::7"), ip("2001:db8:1:2:ffff::1"));
    /// assert_eq!(ip("64:ff9b::192.0.2.1"), ip("192.0.2.1"));
    /// assert_ne!(ip("64:ff9b::192.0.2.1"), ip("64:ff9b::192.0.2.2"));
    /// ```
    pub fn from_ip(ip: std::net::IpAddr) -> Self {
        Self::from_ip_with_prefix(ip, 64)
    }

    /// [`from_ip`](Self::from_ip), an IPv6 address standing for its network
    /// of `ipv6_prefix` bits instead of its /64 (at most 128: a larger
    /// number counts as 128, each address its own user). For clients whose
    /// provider delegates a whole /56 or /48 to each subscriber, who would
    /// otherwise hold 256 or 65,536 budgets.
    ///
    /// ```
    /// use tower_ratelimit::identity::Identity;
    ///
    /// let ip = |text: &str| Identity::from_ip_with_prefix(text.parse().unwrap(), 56);
    /// assert_eq!(ip("2001:db8:0:1::7"), ip("2001:db8:0:ff::1"));
    /// assert_ne!(ip("2001:db8:0:1::7"), ip("2001:db8:0:100::1"));
    /// // IPv4 clients are their address, whatever the prefix.
    /// assert_eq!(ip("192.0.2.1"), Identity::from_ip("192.0.2.1".parse().unwrap()));
    /// ```
    pub fn from_ip_with_prefix(ip: std::net::IpAddr, ipv6_prefix: u8) -> Self {
        Self {
            user: User::Inline(ip_user(ip, ipv6_prefix)),
            group: Cow::Borrowed(DEFAULT_GROUP),
        }
    }

    /// Puts the user in `group`. A group no rule of a matching route names
    /// is not limited there (as a group with no limits), so a misspelled
    /// group is unlimited: [`Config::groups_without_rules`](crate::Config::groups_without_rules)
    /// finds a config file's.
    #[must_use]
    pub fn with_group(mut self, group: impl Into<Cow<'static, str>>) -> Self {
        self.group = group.into();
        self
    }

    /// The user: any bytes.
    pub fn user(&self) -> &[u8] {
        self.user.bytes()
    }

    /// The group.
    pub fn group(&self) -> &str {
        &self.group
    }
}

/// Why a request could not be identified; becomes a response through
/// [`RateLimitLayer::on_identity_error`](crate::RateLimitLayer::on_identity_error)
/// (by default `401` with a problem+json body, and the
/// [challenge](Self::with_challenge) if the error has one).
///
/// A `401` should tell the client how to authenticate: RFC 9110 §11.6.1
/// asks for a `WWW-Authenticate` header, which the default response sends
/// when the error names a challenge. Without one, a `403`
/// ([`with_status`](Self::with_status)) may say it better.
///
/// ```
/// use http::{HeaderValue, StatusCode};
/// use tower_ratelimit::identity::IdentityError;
///
/// let missing = IdentityError::new("no API key")
///     .with_challenge(HeaderValue::from_static(r#"Bearer realm="api""#));
/// assert_eq!(missing.status(), StatusCode::UNAUTHORIZED);
/// let down = IdentityError::new("key lookup failed").with_status(StatusCode::SERVICE_UNAVAILABLE);
/// assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
/// // Not an error status: ignored (a 200 would tell the client it succeeded).
/// let odd = IdentityError::new("?").with_status(StatusCode::OK);
/// assert_eq!(odd.status(), StatusCode::UNAUTHORIZED);
/// ```
#[derive(Clone, Debug)]
pub struct IdentityError {
    message: Cow<'static, str>,
    status: StatusCode,
    challenge: Option<http::HeaderValue>,
    /// For the operator: logged with a server error's warning, never sent
    /// to the client (how to set the server up, say).
    hint: Option<&'static str>,
}

impl IdentityError {
    /// An error answered with `401 Unauthorized`. The message is the
    /// response's detail, sent to the client, and logged (at `debug`, and
    /// at `warn` for a server error): keep secrets out of it.
    pub fn new(message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            message: message.into(),
            status: StatusCode::UNAUTHORIZED,
            challenge: None,
            hint: None,
        }
    }

    /// Answers with `status` instead: a client error (4xx) or a server
    /// error (5xx); any other status is ignored, since the request was not
    /// served (and a redirect, to a login page say, needs a `Location`:
    /// build that response with
    /// [`on_identity_error`](crate::RateLimitLayer::on_identity_error)).
    #[must_use]
    pub fn with_status(mut self, status: StatusCode) -> Self {
        if status.is_client_error() || status.is_server_error() {
            self.status = status;
        }
        self
    }

    /// The `WWW-Authenticate` challenge the default `401` response sends
    /// (for instance `Bearer realm="api"`).
    #[must_use]
    pub fn with_challenge(mut self, challenge: http::HeaderValue) -> Self {
        self.challenge = Some(challenge);
        self
    }

    /// The status the default response uses.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The `WWW-Authenticate` challenge, if any.
    pub fn challenge(&self) -> Option<&http::HeaderValue> {
        self.challenge.as_ref()
    }

    /// The message (it goes into the default response's `detail`).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// With a hint for the operator (see [`hint`](Self::hint)).
    pub(crate) fn with_hint(mut self, hint: &'static str) -> Self {
        self.hint = Some(hint);
        self
    }

    /// What the operator should do about it, logged with a server error's
    /// warning and not sent to the client: a built-in identity's error
    /// carries one when the server's setup is at fault (say, a server that
    /// does not record the peer address [`ClientIp`] needs).
    pub fn hint(&self) -> Option<&str> {
        self.hint
    }
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for IdentityError {}

/// Tells who sent a request. See the [module docs](self).
///
/// Closures returning a future implement it (awaited: the layer holds the
/// request meanwhile), and so does [`immediate`] around a closure that
/// answers at once.
///
/// An identity that cannot tell the user answers an [`IdentityError`]
/// (answered `401`, or the status it carries), never a panic: the layer
/// does not catch one, which unwinds through the service as a panicking
/// handler's does (hyper then drops that connection, or that HTTP/2
/// stream).
pub trait Identify: Send + Sync + 'static {
    /// The future of one identification.
    type Future: Future<Output = Result<Identity, IdentityError>> + Send + 'static;

    /// Identifies the sender of the request whose head is `head`.
    fn identify(&self, head: &Parts) -> Self::Future;

    /// The identity, when it can be told without waiting (the built-ins
    /// can): the layer then decides without holding the request. `None`
    /// (the default) means "call [`identify`](Self::identify)".
    fn identify_now(&self, head: &Parts) -> Option<Result<Identity, IdentityError>> {
        let _ = head;
        None
    }
}

/// Implements `identify` through a synchronous `identify_now`.
macro_rules! ready_identity {
    () => {
        type Future = Ready<Result<Identity, IdentityError>>;

        fn identify(&self, head: &Parts) -> Self::Future {
            ready(self.decide(head))
        }

        #[inline]
        fn identify_now(&self, head: &Parts) -> Option<Result<Identity, IdentityError>> {
            Some(self.decide(head))
        }
    };
}
pub(crate) use ready_identity;

impl<F, Fut> Identify for F
where
    F: Fn(&Parts) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Identity, IdentityError>> + Send + 'static,
{
    type Future = Fut;

    fn identify(&self, head: &Parts) -> Fut {
        self(head)
    }
}

/// An identity function that answers at once, without a future: see
/// [`immediate`].
#[derive(Clone)]
pub struct Immediate<F>(F);

impl<F> fmt::Debug for Immediate<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Immediate(..)")
    }
}

/// An identity function that never waits: `f` reads the request's head and
/// returns the identity. On a store that answers at once (the memory
/// store), the layer decides such a request at once, as it does with the
/// built-in identities, where a closure returning a future (even a ready
/// one) makes it hold the request until the future is polled (one
/// allocation and a clone of the inner service per limited request).
///
/// ```
/// use http::request::Parts;
/// use tower_ratelimit::identity::{self, Identity};
/// use tower_ratelimit::{MemoryStore, RateLimitLayer, Rule, Rules};
///
/// let rules = Rules::builder().route("^/", [Rule::new().second(10)]).build()?;
/// let layer = RateLimitLayer::new(rules, MemoryStore::new()).identify(identity::immediate(
///     |head: &Parts| {
///         Ok(match head.headers.get("x-api-key") {
///             Some(key) => Identity::new([b"key:".as_slice(), key.as_bytes()].concat()),
///             None => Identity::new("anonymous"),
///         })
///     },
/// ));
/// # let _ = layer;
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
pub fn immediate<F>(f: F) -> Immediate<F>
where
    F: Fn(&Parts) -> Result<Identity, IdentityError> + Send + Sync + 'static,
{
    Immediate(f)
}

impl<F> Immediate<F>
where
    F: Fn(&Parts) -> Result<Identity, IdentityError> + Send + Sync + 'static,
{
    fn decide(&self, head: &Parts) -> Result<Identity, IdentityError> {
        (self.0)(head)
    }
}

impl<F> Identify for Immediate<F>
where
    F: Fn(&Parts) -> Result<Identity, IdentityError> + Send + Sync + 'static,
{
    ready_identity!();
}

/// The peer's IP address, in group `"default"`.
///
/// Read from axum's `ConnectInfo<SocketAddr>` (with the `axum` feature,
/// on by default; serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`; in tests,
/// `MockConnectInfo`), from tonic's `TcpConnectInfo` (with the `tonic`
/// feature; tonic records it on every request it serves over TCP without
/// TLS), or from a plain [`SocketAddr`] request extension (insert one in a
/// hyper service). A request with neither is answered `500`: the server is
/// misconfigured, and failing loudly beats putting everyone in one budget.
///
/// IPv6 peers are grouped by their /64 prefix, since one host commonly owns
/// a whole /64 and could otherwise rotate through 2^64 budgets; an
/// IPv4-mapped address, or one of the RFC 6052 well-known prefix, is the
/// IPv4 client it holds (see [`Identity::from_ip`]). Another grouping is
/// an identity of your own:
///
/// ```
/// use tower_ratelimit::identity::{self, ClientIp, Identity, IdentityError};
///
/// // An IPv6 client is its /56.
/// let identify = identity::immediate(|head| {
///     ClientIp::peer(head)
///         .map(|peer| Identity::from_ip_with_prefix(peer.ip(), 56))
///         .ok_or_else(|| IdentityError::new("no peer address"))
/// });
/// ```
///
/// This never reads `X-Forwarded-For`: behind a proxy every request would
/// come from the proxy.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClientIp;

impl ClientIp {
    /// The peer address of a request, if the server recorded one.
    pub fn peer(head: &Parts) -> Option<SocketAddr> {
        #[cfg(feature = "axum")]
        if let Some(info) = head
            .extensions
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
        {
            return Some(info.0);
        }
        Self::peer_elsewhere(head)
    }

    /// [`peer`](Self::peer) from what other servers (and axum's tests)
    /// record. (Out of line: axum's `ConnectInfo`, the common case, stays
    /// compact in the instruction cache.)
    #[inline(never)]
    fn peer_elsewhere(head: &Parts) -> Option<SocketAddr> {
        #[cfg(feature = "axum")]
        if let Some(mock) = head
            .extensions
            .get::<axum::extract::connect_info::MockConnectInfo<SocketAddr>>()
        {
            return Some(mock.0);
        }
        #[cfg(feature = "tonic")]
        if let Some(addr) = head
            .extensions
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(tonic::transport::server::TcpConnectInfo::remote_addr)
        {
            return Some(addr);
        }
        head.extensions.get::<SocketAddr>().copied()
    }
}

/// The bytes of an IP address as a budget user (IPv6 truncated to its
/// `ipv6_prefix` bits), written on the stack.
fn ip_user(ip: std::net::IpAddr, ipv6_prefix: u8) -> ArrayVec<u8, 46> {
    let mut out = ArrayVec::<u8, 46>::new();
    // The longest text is "ffff:ffff:ffff:ffff::/64" (24 bytes) or
    // "255.255.255.255" (15): the buffer always has room.
    match ip {
        std::net::IpAddr::V4(v4) => push_v4(&mut out, v4),
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped().or_else(|| nat64(v6)) {
            Some(v4) => push_v4(&mut out, v4),
            None => push_v6_prefix(&mut out, v6, ipv6_prefix),
        },
    }
    out
}

/// The IPv4 address in an address of RFC 6052's well-known prefix,
/// `64:ff9b::/96`.
fn nat64(v6: std::net::Ipv6Addr) -> Option<std::net::Ipv4Addr> {
    let bits = u128::from(v6);
    (bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000).then(|| std::net::Ipv4Addr::from(bits as u32))
}

/// An IPv6 address's /64 prefix (out of line: IPv4 peers are the common
/// case, and this path uses the formatting machinery).
#[inline(never)]
fn push_v6_prefix(out: &mut ArrayVec<u8, 46>, v6: std::net::Ipv6Addr, prefix: u8) {
    use std::io::Write as _;
    let s = v6.segments();
    if prefix == 64 {
        // (Written so since the first release: the /64's budgets keep
        // their keys.)
        let _ = write!(out, "{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3]);
        return;
    }
    // The longest text, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128", has
    // 43 bytes.
    let prefix = prefix.min(128);
    let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
    let network = std::net::Ipv6Addr::from(u128::from(v6) & mask);
    let _ = write!(out, "{network}/{prefix}");
}

/// Each octet's decimal digits followed by a dot, from a table made at
/// compile time (the unused bytes are zeros).
const OCTET_TEXT: [[u8; 4]; 256] = {
    let mut table = [[0u8; 4]; 256];
    let mut i = 0;
    while i < 256 {
        let o = i as u8;
        let mut text = [0u8; 4];
        let mut len = 0;
        if o >= 100 {
            text[len] = b'0' + o / 100;
            len += 1;
        }
        if o >= 10 {
            text[len] = b'0' + o / 10 % 10;
            len += 1;
        }
        text[len] = b'0' + o % 10;
        text[len + 1] = b'.';
        table[i] = text;
        i += 1;
    }
    table
};

/// Dotted decimal, as `Ipv4Addr`'s `Display` writes it, without the
/// formatting machinery (this runs on every request keyed by IP): each
/// octet's text and dot are copied from a table as one 4-byte word. (A
/// table lookup rather than digit arithmetic: the code is a third of the
/// size, and a request's cost follows its code's footprint; round 21 in
/// benches/HISTORY.md.)
fn push_v4(out: &mut ArrayVec<u8, 46>, ip: std::net::Ipv4Addr) {
    // Written into a local buffer, then appended at once: one capacity
    // check instead of one per byte. Before the last octet the text is at
    // most 12 bytes, so `len & 15` is `len` and the 4 bytes written from
    // it end within the buffer: indices the compiler sees are in bounds.
    let mut text = [0u8; 20];
    let mut len = 0;
    for octet in ip.octets() {
        text[len & 15..][..4].copy_from_slice(&OCTET_TEXT[usize::from(octet)]);
        len += 2 + usize::from(octet >= 10) + usize::from(octet >= 100);
    }
    // (Without the last dot.)
    let _ = out.try_extend_from_slice(&text[..(len - 1).min(16)]);
}

impl ClientIp {
    fn decide(&self, head: &Parts) -> Result<Identity, IdentityError> {
        match Self::peer(head) {
            Some(addr) => Ok(Identity::from_ip(addr.ip())),
            None => Err(no_peer()),
        }
    }
}

/// The error of an identity that needs the peer address and has none.
pub(crate) fn no_peer() -> IdentityError {
    IdentityError::new("the server could not tell the client's address")
        .with_status(StatusCode::INTERNAL_SERVER_ERROR)
        .with_hint(NO_PEER)
}

/// (The operator's hint, logged, not sent: one text whatever the features,
/// as the server's kind is unknown here.)
const NO_PEER: &str = "the server did not record the peer address: under axum, serve with \
     ConnectInfo (into_make_service_with_connect_info::<SocketAddr>(), tower-ratelimit's \
     `axum` feature); under tonic over TCP without TLS, enable tower-ratelimit's `tonic` \
     feature; otherwise insert the peer's SocketAddr as a request extension";

impl Identify for ClientIp {
    ready_identity!();
}

/// The value of one request header (for example `x-api-key`), in group
/// `"default"`. A request without the header, or with an empty value (or
/// one of spaces), is answered `401`, with the `WWW-Authenticate`
/// challenge given to [`challenge`](Self::challenge) (RFC 9110 asks a
/// `401` for one); a request that sends the header more than once is
/// answered `400` (see [`single_header`]).
///
/// The value is taken as it is: **use it only for a header your service
/// has already verified** (a gateway that authenticated the key, or a
/// layer before this one that answers unknown keys itself). Otherwise a
/// client escapes its limit by sending a new value with every request,
/// each a user with a fresh budget. For keys you must look up first, give
/// the layer your own identity function (see [`Identify`]), which can
/// answer an unknown key with an [`IdentityError`] or fall back to the
/// client IP.
///
/// ```
/// use tower_ratelimit::identity::HeaderKey;
///
/// // Behind a gateway that lets only valid keys through; a request
/// // without a key is told how to authenticate.
/// let identity = HeaderKey::new(http::HeaderName::from_static("x-api-key"))
///     .challenge(http::HeaderValue::from_static(r#"ApiKey header="x-api-key""#));
/// ```
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
    challenge: Option<http::HeaderValue>,
}

impl HeaderKey {
    /// Identifies users by the header `name`.
    pub fn new(name: HeaderName) -> Self {
        Self {
            name,
            challenge: None,
        }
    }

    /// The `WWW-Authenticate` challenge of the `401` a request without the
    /// header gets (see [`IdentityError::with_challenge`]); none unless
    /// given.
    #[must_use]
    pub fn challenge(mut self, challenge: http::HeaderValue) -> Self {
        self.challenge = Some(challenge);
        self
    }

    fn decide(&self, head: &Parts) -> Result<Identity, IdentityError> {
        match single_header(&head.headers, &self.name)? {
            Some(value) if !value.as_bytes().trim_ascii().is_empty() => {
                Ok(Identity::from_slice(value.as_bytes()))
            }
            _ => {
                let error = IdentityError::new(format!("missing or empty `{}` header", self.name));
                Err(match &self.challenge {
                    Some(challenge) => error.with_challenge(challenge.clone()),
                    None => error,
                })
            }
        }
    }
}

/// The one value of header `name` in `headers`: `None` without it, and an
/// [`IdentityError`] answered `400 Bad Request` when the request sends it
/// more than once.
///
/// Give your identity function a header's value through it: of `x-api-key:
/// alice` then `x-api-key: bob`, a gateway before your service may have
/// checked either (or both), so taking the first (as
/// [`HeaderMap::get`] does) could let a client spend another user's budget,
/// or pick a fresh one, with a value nothing verified. [`HeaderKey`] uses
/// it.
///
/// ```
/// use http::{HeaderMap, HeaderValue, StatusCode};
/// use tower_ratelimit::identity::single_header;
///
/// let mut headers = HeaderMap::new();
/// assert!(single_header(&headers, "x-api-key").unwrap().is_none());
/// headers.append("x-api-key", HeaderValue::from_static("alice"));
/// assert_eq!(single_header(&headers, "x-api-key").unwrap().unwrap(), "alice");
/// headers.append("x-api-key", HeaderValue::from_static("bob"));
/// let error = single_header(&headers, "x-api-key").unwrap_err();
/// assert_eq!(error.status(), StatusCode::BAD_REQUEST);
/// assert_eq!(error.message(), "more than one `x-api-key` header");
/// ```
pub fn single_header<K: AsHeaderName + Copy + fmt::Display>(
    headers: &HeaderMap,
    name: K,
) -> Result<Option<&HeaderValue>, IdentityError> {
    let mut values = headers.get_all(name).into_iter();
    let first = values.next();
    match values.next() {
        Some(_) => Err(more_than_one(name)),
        None => Ok(first),
    }
}

/// The error of a header sent more than once (out of line: the common
/// path stays compact). Named in lower case, as HTTP/2 writes names.
#[cold]
#[inline(never)]
fn more_than_one(name: impl fmt::Display) -> IdentityError {
    let name = name.to_string().to_ascii_lowercase();
    IdentityError::new(format!("more than one `{name}` header"))
        .with_status(StatusCode::BAD_REQUEST)
}

// (At once, as the other built-ins: the layer decides without holding the
// request.)
impl Identify for HeaderKey {
    ready_identity!();
}

/// Everyone is the same user: one budget per route for the whole service.
/// (To limit a route as a whole *and* each user, keep a per-user identity
/// and give the route a route-wide budget,
/// [`Route::global`](crate::Route::global), checked with each user's in one
/// call.)
#[derive(Clone, Copy, Debug, Default)]
pub struct Global;

impl Global {
    fn decide(&self, _head: &Parts) -> Result<Identity, IdentityError> {
        Ok(Identity::from_slice(b"*"))
    }
}

impl Identify for Global {
    ready_identity!();
}

#[cfg(test)]
mod tests {
    /// A user as the default /64 grouping writes it.
    fn ip64(ip: std::net::IpAddr) -> ArrayVec<u8, 46> {
        super::ip_user(ip, 64)
    }

    use super::*;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    #[test]
    fn the_header_identity_answers_at_once() {
        // (The layer decides without holding the request only for an
        // identity that answers at once.)
        let identity = HeaderKey::new(HeaderName::from_static("x-user"));
        let (mut with, _) = http::Request::new(()).into_parts();
        with.headers
            .insert("x-user", http::HeaderValue::from_static("alice"));
        let (without, _) = http::Request::new(()).into_parts();
        let user = identity
            .identify_now(&with)
            .and_then(Result::ok)
            .map(|i| i.user().to_vec());
        assert_eq!(user, Some(b"alice".to_vec()));
        assert!(matches!(identity.identify_now(&without), Some(Err(_))));
    }

    #[test]
    fn short_users_given_by_reference_are_kept_inline() {
        let short = Identity::from_slice(&[7; 46]);
        assert!(matches!(short.user, User::Inline(_)));
        assert_eq!(short.user(), &[7; 46][..]);
        let long = Identity::from_slice(&[7; 47]);
        assert!(matches!(long.user, User::Heap(_)));
        assert_eq!(long.user(), &[7; 47][..]);
        // The same bytes are the same user, inline or not.
        assert_eq!(Identity::from_slice(b"abc"), Identity::new("abc"));
        assert_ne!(Identity::from_slice(b"abc"), Identity::new("abd"));
    }

    #[test]
    fn ip_users_are_written_as_display_writes_them() {
        for octets in [
            [0, 0, 0, 0],
            [255, 255, 255, 255],
            [10, 1, 2, 3],
            [100, 20, 3, 199],
            [9, 10, 99, 100],
        ] {
            let v4 = Ipv4Addr::from(octets);
            assert_eq!(&ip64(IpAddr::V4(v4))[..], v4.to_string().as_bytes());
            let mapped = IpAddr::V6(v4.to_ipv6_mapped());
            assert_eq!(&ip64(mapped)[..], v4.to_string().as_bytes());
        }
        // Every octet value, in every position.
        for value in 0..=255u8 {
            for position in 0..4 {
                let mut octets = [1, 22, 133, 4];
                octets[position] = value;
                let v4 = Ipv4Addr::from(octets);
                assert_eq!(&ip64(IpAddr::V4(v4))[..], v4.to_string().as_bytes());
            }
        }
        let v6: Ipv6Addr = "2001:db8:ab:c0:1:2:3:4".parse().unwrap();
        assert_eq!(&ip64(IpAddr::V6(v6))[..], b"2001:db8:ab:c0::/64");
    }

    #[test]
    fn ipv6_is_grouped_by_its_64_prefix() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(ip64(a), ip64(b));
        assert_ne!(ip64(a), ip64(c));
        assert_eq!(&ip64(a)[..], b"2001:db8:1:2::/64");
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(&ip64(mapped)[..], b"10.1.2.3");
        let nat64: IpAddr = "64:ff9b::10.1.2.3".parse().unwrap();
        assert_eq!(&ip64(nat64)[..], b"10.1.2.3");
        // Only the well-known /96: an address outside it is IPv6.
        let beside: IpAddr = "64:ff9b:0:1::10.1.2.3".parse().unwrap();
        assert_eq!(&ip64(beside)[..], b"64:ff9b:0:1::/64");
        // Other prefixes: the network, masked, in the usual text.
        let at = |prefix| ip_user(a, prefix);
        assert_eq!(&at(56)[..], b"2001:db8:1::/56");
        assert_eq!(&at(48)[..], b"2001:db8:1::/48");
        assert_eq!(&at(128)[..], b"2001:db8:1:2:aaaa::1/128");
        assert_eq!(&at(200)[..], b"2001:db8:1:2:aaaa::1/128");
        assert_eq!(&at(0)[..], b"::/0");
        assert_eq!(at(56), ip_user(c, 56));
        assert_eq!(&ip_user(mapped, 56)[..], b"10.1.2.3");
        let longest: IpAddr = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".parse().unwrap();
        assert_eq!(ip_user(longest, 128).len(), 43);
        let widest: IpAddr = "ffff:ffff:ffff:ffff:ffff::1".parse().unwrap();
        assert_eq!(&ip64(widest)[..], b"ffff:ffff:ffff:ffff::/64");
        // The same user whichever way it was made.
        assert_eq!(
            Identity::from_ip(mapped).user(),
            Identity::new("10.1.2.3").user()
        );
    }
}
