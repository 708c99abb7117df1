//! The client IP behind reverse proxies you trust.

use std::collections::VecDeque;
use std::future::{ready, Ready};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::request::Parts;
use http::HeaderMap;

use super::{no_peer, ready_identity, ClientIp, Identify, Identity, IdentityError};
use crate::error::{ConfigError, ConfigErrorKind, Location};

/// The most hops read from the right of a forwarding chain; a longer chain
/// of trusted proxies is not believed past this point.
const MAX_HOPS: usize = 32;

/// An IP network: an address and a prefix length (`10.0.0.0/8`, `::1/128`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    /// Parses `addr/prefix`, or a single address.
    ///
    /// An IPv4-mapped network is the IPv4 one (`::ffff:10.0.0.0/104` is
    /// `10.0.0.0/8`), so its prefix must be 96 or more.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a.parse::<IpAddr>().ok()?, Some(p.parse::<u8>().ok()?)),
            None => (text.parse::<IpAddr>().ok()?, None),
        };
        let prefix = match (addr, prefix) {
            (IpAddr::V6(v6), Some(prefix)) if v6.to_ipv4_mapped().is_some() => {
                Some(prefix.checked_sub(96)?)
            }
            _ => prefix,
        };
        let addr = canonical(addr);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        (prefix <= max).then_some(Self { addr, prefix })
    }

    /// Whether `ip` is in the network. IPv4-mapped IPv6 counts as IPv4,
    /// and IPv4 as IPv4-mapped IPv6 (`::ffff:a.b.c.d`): an IPv6 network
    /// that holds `::ffff:0:0/96` (`::/0`, or any `::/N` with N at most 80)
    /// holds every IPv4 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), ip) => {
                let ip = match ip {
                    IpAddr::V6(v6) => v6,
                    IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                };
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            (IpAddr::V4(_), IpAddr::V6(_)) => false,
        }
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The client IP as seen through trusted reverse proxies, in group
/// `"default"`. As [`ClientIp`], it needs the peer address (without it,
/// every limited request is answered 500).
///
/// The peer address (see [`ClientIp`]) is the client, unless the peer is a
/// trusted proxy: then the forwarding chain your proxies write
/// (`X-Forwarded-For`, or with [`rfc7239`](Self::rfc7239) `Forwarded`) is
/// read **from the right**, skipping hops that are trusted proxies, and the
/// first hop that is not is the client. Entries left of it were written by
/// the client or by proxies you do not control, so a spoofed header can only
/// ever add hops that are ignored. The other header is never read: a client
/// could send it, and most proxies pass it through untouched. An empty hop
/// (an empty header, a trailing comma, a `Forwarded` element without
/// `for=`) names no one: the nearest trusted hop is then the client, as
/// when the header is missing.
///
/// A hop is an address (`1.2.3.4`, `1.2.3.4:80`, `[2001:db8::1]:80`; an
/// IPv6 address's zone, `fe80::1%eth0`, is left out, as it names an
/// interface of the proxy's, for trust as for the budget) or a token
/// (`unknown`, `_hidden`): a token is the user `token:<token>`, so every
/// client a proxy writes as `for=unknown` shares one budget. A port after either, a number or RFC 7239's
/// obfuscated one (`_k3x9`), is left out too: it changes with every
/// connection, and would give each its own budget. Proxies must bracket an
/// IPv6 address that has a port (`[2001:db8::1]:443`, as RFC 7239
/// requires): unbracketed, `2001:db8::1:443` is read as the address it
/// spells, another /64 than the client's (only an address of eight groups
/// and a port, `2001:db8:1:2:3:4:5:6:443`, is told apart).
///
/// A `Forwarded` line is read whole and strictly (RFC 7239): one that is
/// not well-formed (a quote left open, a pair that is not `name=value`,
/// such as `garbage` or `for=`), or an element with two `for=`, cannot
/// say which part
/// a proxy wrote, and names an anonymous client, [`Client::Token`] of an
/// empty string (every such request shares that one budget, apart from the
/// proxy's). A proxy must escape what it copies from a request into
/// `Forwarded` (a `host="…"` from the client's `Host`): one that copies it
/// unescaped lets the client write whole elements of its own, which no
/// parser can tell from the proxy's.
///
/// ```
/// use tower_ratelimit::identity::ForwardedIp;
///
/// // A load balancer in 10.0.0.0/8 and a local sidecar.
/// let identity = ForwardedIp::new(["10.0.0.0/8", "127.0.0.1"])?;
/// // Proxies that write RFC 7239's `Forwarded` instead.
/// let identity = ForwardedIp::new(["10.0.0.0/8"])?.rfc7239();
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ForwardedIp {
    trusted: Arc<[Network]>,
    /// Reads `Forwarded` (RFC 7239) instead of `X-Forwarded-For`.
    rfc7239: bool,
    /// The bits of an IPv6 client's network that name it (64 by default).
    ipv6_prefix: u8,
    /// Whether the warning about the other header was logged.
    warned: Arc<AtomicBool>,
}

impl ForwardedIp {
    /// Trusts the proxies in `networks` (CIDR notation, or single addresses).
    /// An entry that does not parse is an error naming it.
    pub fn new<S: AsRef<str>>(networks: impl IntoIterator<Item = S>) -> Result<Self, ConfigError> {
        let mut trusted = Vec::new();
        for (i, text) in networks.into_iter().enumerate() {
            let text = text.as_ref();
            let network = Network::parse(text).ok_or_else(|| {
                ConfigError::new(
                    Location::field(format!("trusted_proxies[{i}]")),
                    ConfigErrorKind::InvalidNetwork(text.to_owned()),
                )
            })?;
            trusted.push(network);
        }
        Ok(Self {
            trusted: trusted.into(),
            rfc7239: false,
            ipv6_prefix: 64,
            warned: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Reads the chain from the `Forwarded` header (RFC 7239's `for=`
    /// values) instead of `X-Forwarded-For`: for proxies that write that
    /// one. Only the header your proxies write may be read; the other is
    /// the client's to forge.
    #[must_use]
    pub fn rfc7239(mut self) -> Self {
        self.rfc7239 = true;
        self
    }

    /// Counts an IPv6 client by its network of `bits` bits instead of its
    /// /64 (see [`Identity::from_ip_with_prefix`]): 56 or 48 for
    /// providers that delegate that much to each subscriber.
    ///
    /// ```
    /// use tower_ratelimit::identity::ForwardedIp;
    ///
    /// let identity = ForwardedIp::new(["10.0.0.0/8"])?.ipv6_prefix(56);
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }

    /// Logs once when a trusted proxy's request carries the header this
    /// does not read: perhaps the proxies write that one (then configure
    /// it, or clients pick their own identity), perhaps a client sent it.
    fn warn_of_the_other_header(&self, headers: &HeaderMap) {
        let (read, other) = if self.rfc7239 {
            ("Forwarded", "x-forwarded-for")
        } else {
            ("X-Forwarded-For", "forwarded")
        };
        if !self.warned.load(Ordering::Relaxed)
            && headers.contains_key(other)
            && !self.warned.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                read,
                ignored = other,
                "a request from a trusted proxy carries a forwarding header this identity does not read; if your proxies write that one, configure ForwardedIp to read it (rfc7239() for Forwarded), else clients choose their own identity (logged once)"
            );
        }
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(ip))
    }

    /// The client of a request from `peer` with `headers`: an address, or
    /// the raw token a trusted proxy wrote where it could not give one
    /// (RFC 7239's `unknown` or an obfuscated identifier).
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> Client {
        if !self.trusts(peer) {
            return Client::Ip(peer);
        }
        self.warn_of_the_other_header(headers);
        let mut nearest = Client::Ip(peer);
        for hop in hops(headers, self.rfc7239) {
            match parse_hop(&hop) {
                Some(ip) if self.trusts(ip) => nearest = Client::Ip(ip),
                Some(ip) => return Client::Ip(ip),
                // An empty hop (an empty header, a trailing comma, a
                // `Forwarded` element without `for=`) says nothing, as no
                // header does: the nearest trusted hop is the client (what
                // lies left of it no trusted proxy vouched for).
                None if hop.is_empty() => return nearest,
                None if hop == MALFORMED => return Client::Token(String::new()),
                // (Without a port: it changes with every connection.)
                None => return Client::Token(without_port(&hop).to_owned()),
            }
        }
        nearest
    }
}

/// Who a [`ForwardedIp`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Client {
    /// An address.
    Ip(IpAddr),
    /// A token a trusted proxy wrote in place of an address.
    Token(String),
}

/// The hops of the forwarding chain, rightmost (nearest) first: with
/// `rfc7239`, `Forwarded`'s `for=` values, else `X-Forwarded-For`'s
/// entries. Several header lines are one list, in order. A line is decoded
/// byte by byte (an invalid byte becomes U+FFFD): a client's bad byte, left
/// of what a proxy appended, spoils only the client's own hop.
/// At most [`MAX_HOPS`], read from the right: the lines left of them are
/// not decoded, nor their hops split, and of a longer line only the last
/// hops are kept (a `Forwarded` line is still read whole, to check it), so
/// a chain of any length takes no more memory than one of that many hops.
fn hops(headers: &HeaderMap, rfc7239: bool) -> Vec<String> {
    let name = match rfc7239 {
        true => http::header::FORWARDED,
        false => http::HeaderName::from_static("x-forwarded-for"),
    };
    let mut hops = Vec::new();
    for value in headers.get_all(name).iter().rev() {
        let left = MAX_HOPS - hops.len();
        let line = String::from_utf8_lossy(value.as_bytes());
        if rfc7239 {
            match elements(&line, left) {
                Some(elements) => hops.extend(elements.into_iter().rev().map(for_value)),
                // (Not well-formed: which element is whose cannot be told.)
                None => hops.push(MALFORMED.to_owned()),
            }
        } else {
            hops.extend(line.rsplit(',').take(left).map(|hop| hop.trim().to_owned()));
        }
        if hops.len() >= MAX_HOPS {
            break;
        }
    }
    hops
}

/// The hop of a `Forwarded` line or element that cannot be read (a NUL,
/// which no header value holds): an anonymous client, `Client::Token("")`.
const MALFORMED: &str = "\0";

/// A `Forwarded` line's elements, split at the commas outside quoted
/// strings (RFC 7230 `quoted-string`, with `\` escapes), or `None` when the
/// line is not well-formed: a quote that does not open a parameter's value,
/// one left open, a backslash outside quotes, text after a closing quote.
/// Read whole and strictly: a quote a client leaves open, or one a proxy
/// copies unescaped from a client's `Host`, would otherwise run a client's
/// element into the proxy's, read either way. Only the last `keep`
/// elements are returned (and kept while reading: a line of many commas
/// takes no more memory than one of `keep` elements).
fn elements<'a>(line: &'a str, keep: usize) -> Option<VecDeque<&'a str>> {
    let mut parts = VecDeque::with_capacity(keep.min(4));
    let push = |parts: &mut VecDeque<&'a str>, part: &'a str| {
        if parts.len() == keep {
            parts.pop_front();
        }
        parts.push_back(part);
    };
    let mut start = 0;
    let mut last = None;
    let mut chars = line.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' if last == Some('=') => {
                loop {
                    match chars.next()?.1 {
                        '\\' => {
                            chars.next()?;
                        }
                        '"' => break,
                        _ => {}
                    }
                }
                while chars.next_if(|&(_, c)| c == ' ' || c == '\t').is_some() {}
                if chars.peek().is_some_and(|&(_, c)| c != ';' && c != ',') {
                    return None;
                }
                last = Some('"');
            }
            '"' | '\\' => return None,
            ',' => {
                push(&mut parts, &line[start..i]);
                start = i + 1;
                last = Some(',');
            }
            ' ' | '\t' => {}
            c => last = Some(c),
        }
    }
    push(&mut parts, &line[start..]);
    Some(parts)
}

/// The parts of `text` (a well-formed `Forwarded` element) between the
/// `separator`s outside its quoted strings.
fn split_unquoted(text: &str, separator: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == separator && !quoted => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// The `for=` value of one `Forwarded` element (`for=1.2.3.4;proto=http`),
/// unquoted and unescaped; empty without one, or with more than one (RFC
/// 7239 allows one: two are elements run together, a client's and a
/// proxy's, by a quote the proxy left unescaped in a value it copied, and
/// neither can be told). Pairs are split outside quoted strings, so a
/// `for=` inside another pair's quoted value (a `host="x;for=6.6.6.6"` a
/// client wrote and a proxy copied) is no pair.
/// An element with a pair that is not `name=value` (`garbage`, `for`,
/// `=x`: RFC 7239's `token "=" value`, the name a token), or with an empty
/// `for=`, is not well-formed either: its hop is malformed. Empty pairs
/// (`;;`) and other parameters left empty are allowed: proxies fill them
/// from what a request may lack (nginx's `host=$http_host` is `host=` for
/// a request without `Host`), which must not let a client drop its own
/// address.
fn for_value(element: &str) -> String {
    // (One pass over the pairs: each checked, the `for=` kept.)
    let mut found = None;
    for pair in split_unquoted(element, ';') {
        let pair = pair.trim();
        if pair.is_empty() {
            continue;
        }
        let (name, value) = pair.split_once('=').unwrap_or(("", ""));
        let (name, value) = (name.trim_end(), value.trim_start());
        let is_for = name.eq_ignore_ascii_case("for");
        if !is_token(name) || (is_for && (value.is_empty() || found.is_some())) {
            return MALFORMED.to_owned();
        }
        if is_for {
            found = Some(value);
        }
    }
    found.map_or_else(String::new, |value| unquote(value.trim()))
}

/// Whether `text` is an RFC 7230 token: one or more `tchar`s.
fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A token as it is, a quoted string without its quotes and escapes.
fn unquote(value: &str) -> String {
    let Some(inner) = value
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
    else {
        return value.to_owned();
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

/// An address from a hop: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`,
/// `[2001:db8::1]`, `[2001:db8::1]:80`, and with RFC 7239's obfuscated
/// port (`1.2.3.4:_k3x9`); an IPv6 address's zone (`fe80::1%eth0`) is left
/// out, as it names the proxy's interface, not the client. (A proxy that
/// writes an IPv6 address and a port without brackets is read as well as
/// it can be: `2001:db8:1:2:3:4:5:6:443` is an address of eight groups and
/// a port, `2001:db8::1:443` the address it spells.)
fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip);
    }
    let unzoned = |addr: &str| -> Option<IpAddr> {
        let (addr, _zone) = addr.split_once('%').unwrap_or((addr, ""));
        addr.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6)
    };
    if let Some(rest) = hop.strip_prefix('[') {
        let (inner, after) = rest.split_once(']')?;
        if !after.is_empty() && !after.strip_prefix(':').is_some_and(is_port) {
            return None;
        }
        return inner.parse().ok().or_else(|| unzoned(inner));
    }
    let host = without_port(hop);
    host.parse().ok().or_else(|| unzoned(host))
}

/// `hop` without the port after its node (`1.2.3.4:80`, `unknown:4711`,
/// `_hidden:_p1`), if it has one.
fn without_port(hop: &str) -> &str {
    match hop.rsplit_once(':') {
        Some((node, port)) if !node.is_empty() && is_port(port) => node,
        _ => hop,
    }
}

/// A port number, or RFC 7239's obfuscated port: `_` and letters, digits,
/// `.`, `_` or `-`.
fn is_port(port: &str) -> bool {
    let digits = !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit());
    match port.strip_prefix('_') {
        _ if digits => port.parse::<u16>().is_ok(),
        Some(rest) => {
            !rest.is_empty()
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        }
        None => false,
    }
}

impl ForwardedIp {
    fn decide(&self, head: &Parts) -> Result<Identity, IdentityError> {
        let peer = ClientIp::peer(head).ok_or_else(no_peer)?;
        Ok(match self.client(peer.ip(), &head.headers) {
            Client::Ip(ip) => Identity::from_ip_with_prefix(ip, self.ipv6_prefix),
            // Prefixed so a token can never equal an address's user.
            Client::Token(token) => Identity::new(format!("token:{token}")),
        })
    }
}

impl Identify for ForwardedIp {
    ready_identity!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(*k, HeaderValue::from_str(v).unwrap());
        }
        map
    }

    /// An empty hop is no client: the nearest trusted hop is, as with no
    /// header at all (not one `token:` budget shared by every such client,
    /// and not the unvouched hops left of it).
    #[test]
    fn an_empty_hop_is_the_nearest_trusted_hop() {
        let f = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        let proxy = ip("10.0.0.1");
        for value in ["", " ", "6.6.6.6,", "6.6.6.6, "] {
            let h = headers(&[("x-forwarded-for", value)]);
            assert_eq!(f.client(proxy, &h), Client::Ip(proxy), "{value:?}");
        }
        let h = headers(&[("x-forwarded-for", "6.6.6.6, , 10.0.0.2")]);
        assert_eq!(f.client(proxy, &h), Client::Ip(ip("10.0.0.2")));
        let r = ForwardedIp::new(["10.0.0.0/8"]).unwrap().rfc7239();
        let h = headers(&[("forwarded", "for=6.6.6.6, by=10.0.0.1;proto=https")]);
        assert_eq!(r.client(proxy, &h), Client::Ip(proxy));
        // A real token is still a token.
        let h = headers(&[("forwarded", "for=_hidden")]);
        assert_eq!(r.client(proxy, &h), Client::Token("_hidden".to_owned()));
    }

    #[test]
    fn networks_parse_and_match() {
        let n = Network::parse("10.0.0.0/8").unwrap();
        assert!(n.contains(ip("10.200.3.4")) && !n.contains(ip("11.0.0.1")));
        assert!(n.contains(ip("::ffff:10.1.1.1")));
        let v6 = Network::parse("2001:db8::/32").unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")) && !v6.contains(ip("2001:db9::1")));
        assert!(Network::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        for bad in ["10.0.0.0/33", "nope", "10.0.0.0/", "::/129", ""] {
            assert!(Network::parse(bad).is_none(), "{bad}");
        }
        let err = ForwardedIp::new(["10.0.0.0/8", "10.0.0/8"]).unwrap_err();
        assert!(
            err.to_string()
                .contains("field `trusted_proxies[1]`: `10.0.0/8` is not an IP address"),
            "{err}"
        );
    }

    #[test]
    fn untrusted_peers_cannot_forward() {
        let f = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        let h = headers(&[("x-forwarded-for", "1.1.1.1")]);
        assert_eq!(
            f.client(ip("203.0.113.9"), &h),
            Client::Ip(ip("203.0.113.9"))
        );
    }

    #[test]
    fn the_rightmost_untrusted_hop_is_the_client() {
        let f = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        // The client wrote "6.6.6.6" itself; the trusted proxy appended the
        // real address.
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 198.51.100.7")]);
        assert_eq!(f.client(ip("10.0.0.1"), &h), Client::Ip(ip("198.51.100.7")));
        // Two trusted proxies in a row.
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.1.1.1")]);
        assert_eq!(f.client(ip("10.0.0.1"), &h), Client::Ip(ip("198.51.100.7")));
        // Split over several lines, with ports and brackets.
        let h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "[2001:db8::7]:4711, 10.2.2.2:80"),
        ]);
        assert_eq!(f.client(ip("10.0.0.1"), &h), Client::Ip(ip("2001:db8::7")));
        // Nothing but trusted hops: the farthest one.
        let h = headers(&[("x-forwarded-for", "10.9.9.9, 10.1.1.1")]);
        assert_eq!(f.client(ip("10.0.0.1"), &h), Client::Ip(ip("10.9.9.9")));
        // No header: the proxy itself.
        assert_eq!(
            f.client(ip("10.0.0.1"), &HeaderMap::new()),
            Client::Ip(ip("10.0.0.1"))
        );
    }

    #[test]
    fn forwarded_is_read_when_configured() {
        let f = ForwardedIp::new(["10.0.0.0/8"]).unwrap().rfc7239();
        let h = headers(&[(
            "forwarded",
            r#"for=6.6.6.6, for="[2001:db8:cafe::17]:4711";proto=https, for=10.3.3.3;by=10.0.0.1"#,
        )]);
        assert_eq!(
            f.client(ip("10.0.0.1"), &h),
            Client::Ip(ip("2001:db8:cafe::17"))
        );
        let h = headers(&[("forwarded", "for=unknown, for=10.3.3.3")]);
        assert_eq!(
            f.client(ip("10.0.0.1"), &h),
            Client::Token("unknown".into())
        );
        // Configured for `Forwarded`, a client's X-Forwarded-For is ignored.
        let h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("forwarded", "for=198.51.100.7"),
        ]);
        assert_eq!(f.client(ip("10.0.0.1"), &h), Client::Ip(ip("198.51.100.7")));
    }

    /// Quoted strings are values, not structure: a `for=` a client hides in
    /// another parameter's quoted value (a `host` a proxy copies into its
    /// own element), or behind a quote it leaves open left of the proxy's
    /// element, never names the client.
    #[test]
    fn a_for_inside_a_quoted_string_is_no_hop() {
        let f = ForwardedIp::new(["10.0.0.0/8"]).unwrap().rfc7239();
        let client = |line: &str| f.client(ip("10.0.0.1"), &headers(&[("forwarded", line)]));
        for line in [
            r#"proto=http;host="x;for=6.6.6.1";for=198.51.100.7"#,
            r#"for=198.51.100.7;host="x,for=6.6.6.2""#,
            r#"host="x\";for=6.6.6.3";for=198.51.100.7"#,
            r#"host="a\",for=6.6.6.5";for=198.51.100.7"#,
            r#"host="a\"b", for=198.51.100.7"#,
        ] {
            assert_eq!(client(line), Client::Ip(ip("198.51.100.7")), "{line}");
        }
        // A line that is not well-formed (a quote a client left open, or a
        // client's Host a proxy copied unescaped, `a\` or `a"`, which runs
        // the client's element into the proxy's), or an element with two
        // `for=`, names an anonymous client: neither the client's choice
        // nor the proxy's own address.
        for line in [
            r#"for=6.6.6.6;x="z", for=1.2.3.4;host="a\""#,
            r#"for=6.6.6.6;x="z", for=1.2.3.4;host="a"""#,
            r#"for="6.6.6.4, for=198.51.100.7"#,
            r#"for=6.6.6.6;for=198.51.100.7"#,
            // Pairs that are not `name=value`: neither the proxy's own
            // address (as a line without `for=` would be) nor a client's.
            "garbage",
            "for",
            "for=",
            "=198.51.100.7",
            "garbage;;;==",
            "for=198.51.100.7;proto",
            "fo r=198.51.100.7",
            "host=x;for=",
        ] {
            assert_eq!(client(line), Client::Token(String::new()), "{line}");
        }
        // Empty pairs and elements, and pairs without `for=`, are allowed:
        // the nearest hop a proxy vouched for is the client.
        for (line, client_ip) in [
            ("for=198.51.100.7;;proto=http", "198.51.100.7"),
            // (A parameter a proxy fills from what a request may lack,
            // left empty: the client cannot drop its own address.)
            ("for=198.51.100.7;host=;proto=http", "198.51.100.7"),
            ("for=198.51.100.7;host=;proto=", "198.51.100.7"),
            ("proto=https;host=example.com", "10.0.0.1"),
            ("for=198.51.100.7, ", "10.0.0.1"),
            ("for = 198.51.100.7", "198.51.100.7"),
        ] {
            assert_eq!(client(line), Client::Ip(ip(client_ip)), "{line}");
        }
        // A quoted value is unquoted and unescaped.
        assert_eq!(
            client(r#"for="[2001:db8::1]:80";host="a;b""#),
            Client::Ip(ip("2001:db8::1"))
        );
        assert_eq!(client(r#"for="_hid\den""#), Client::Token("_hidden".into()));
    }

    #[test]
    fn a_forged_header_of_the_other_kind_is_never_read() {
        // The proxy writes X-Forwarded-For and passes the client's own
        // `Forwarded` through: that one must not name the client.
        let f = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        let h = headers(&[
            ("forwarded", "for=6.6.6.6"),
            ("x-forwarded-for", "198.51.100.7"),
        ]);
        assert_eq!(f.client(ip("10.0.0.1"), &h), Client::Ip(ip("198.51.100.7")));
        let h = headers(&[("forwarded", "for=6.6.6.6")]);
        assert_eq!(f.client(ip("10.0.0.1"), &h), Client::Ip(ip("10.0.0.1")));
    }

    #[test]
    fn a_clients_bad_byte_spoils_only_its_own_hop() {
        // nginx appends the peer to the client's line: `<client's>, <peer>`.
        let f = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        let mut h = HeaderMap::new();
        h.append(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"\xff6.6.6.6, 198.51.100.7").unwrap(),
        );
        assert_eq!(f.client(ip("10.0.0.1"), &h), Client::Ip(ip("198.51.100.7")));
        // Nearest to the proxy, an undecodable hop is a token, never the
        // proxy's own address.
        let mut h = HeaderMap::new();
        h.append(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"1.2.3.4\xff").unwrap(),
        );
        assert!(matches!(f.client(ip("10.0.0.1"), &h), Client::Token(_)));
    }

    #[test]
    fn an_ipv6_zone_is_left_out() {
        let f = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        for hop in ["fe80::1%eth0", "[fe80::1%eth0]:80", "[fe80::1%25eth0]"] {
            let h = headers(&[("x-forwarded-for", hop)]);
            assert_eq!(
                f.client(ip("10.0.0.1"), &h),
                Client::Ip(ip("fe80::1")),
                "{hop}"
            );
        }
    }

    /// A port, a number or an obfuscated one, is never part of the client:
    /// it changes with every connection.
    #[test]
    fn a_hops_port_is_left_out() {
        let f = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        let r = ForwardedIp::new(["10.0.0.0/8"]).unwrap().rfc7239();
        let proxy = ip("10.0.0.1");
        let xff = |hop: &str| f.client(proxy, &headers(&[("x-forwarded-for", hop)]));
        let fwd = |line: &str| r.client(proxy, &headers(&[("forwarded", line)]));
        assert_eq!(
            fwd(r#"for="198.51.100.7:_k3x9""#),
            Client::Ip(ip("198.51.100.7"))
        );
        assert_eq!(
            fwd(r#"for="[2001:db8::7]:_p-1.x""#),
            Client::Ip(ip("2001:db8::7"))
        );
        assert_eq!(
            fwd(r#"for="unknown:4711""#),
            Client::Token("unknown".into())
        );
        assert_eq!(fwd(r#"for="_hidden:_p1""#), Client::Token("_hidden".into()));
        assert_eq!(fwd("for=_hidden"), Client::Token("_hidden".into()));
        // An IPv6 address and a port without brackets, as some proxies
        // write them.
        assert_eq!(
            xff("2001:db8:1:2:3:4:5:6:443"),
            Client::Ip(ip("2001:db8:1:2:3:4:5:6"))
        );
        assert_eq!(
            xff("::ffff:198.51.100.7:443"),
            Client::Ip(ip("::ffff:198.51.100.7"))
        );
        assert_eq!(xff("fe80::1%eth0:443"), Client::Ip(ip("fe80::1")));
        // What is not a port stays: the hop is a token, whole.
        for hop in [
            "1.2.3.4:65536",
            "1.2.3.4:_",
            "1.2.3.4:_a b",
            "[2001:db8::1]junk",
        ] {
            assert_eq!(xff(hop), Client::Token(hop.to_owned()), "{hop}");
        }
    }

    #[test]
    fn ipv4_mapped_networks_are_ipv4_networks() {
        let mapped = Network::parse("::ffff:10.0.0.0/104").unwrap();
        assert_eq!(mapped, Network::parse("10.0.0.0/8").unwrap());
        assert!(mapped.contains(ip("10.1.2.3")) && !mapped.contains(ip("11.0.0.1")));
        assert!(Network::parse("::ffff:0:0/96")
            .unwrap()
            .contains(ip("8.8.8.8")));
        // A prefix that cuts into the mapping's 96 bits is a mistake.
        assert!(Network::parse("::ffff:10.0.0.0/8").is_none());
        // `::/0` holds every address, IPv4 ones included.
        let all = Network::parse("::/0").unwrap();
        for addr in ["8.8.8.8", "::ffff:8.8.8.8", "2001:db8::1"] {
            assert!(all.contains(ip(addr)), "{addr}");
        }
        assert!(!Network::parse("2001:db8::/32")
            .unwrap()
            .contains(ip("8.8.8.8")));
    }

    #[test]
    fn an_ipv6_client_is_its_network_of_the_prefix_given() {
        let head = |peer: &str, hop: &str| {
            let mut request = http::Request::builder()
                .header("x-forwarded-for", hop)
                .body(())
                .unwrap();
            let peer: std::net::SocketAddr = (ip(peer), 4000).into();
            request.extensions_mut().insert(peer);
            request.into_parts().0
        };
        let user = |f: &ForwardedIp, hop: &str| f.decide(&head("10.0.0.1", hop)).unwrap();
        let by64 = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        let by56 = ForwardedIp::new(["10.0.0.0/8"]).unwrap().ipv6_prefix(56);
        let (a, b) = ("2001:db8:0:1::7", "2001:db8:0:ff::1");
        assert_ne!(user(&by64, a), user(&by64, b));
        assert_eq!(user(&by56, a), user(&by56, b));
        assert_eq!(user(&by56, a).user(), b"2001:db8::/56");
        assert_eq!(user(&by56, "192.0.2.1"), user(&by64, "192.0.2.1"));
    }

    #[test]
    fn huge_chains_are_bounded() {
        let f = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        let chain = vec!["10.0.0.2"; 100_000].join(", ");
        let h = headers(&[("x-forwarded-for", &chain)]);
        assert_eq!(f.client(ip("10.0.0.1"), &h), Client::Ip(ip("10.0.0.2")));
        // A `Forwarded` line of many elements keeps only the last ones.
        let line = format!("for=6.6.6.6{}, for=198.51.100.7", ",".repeat(100_000));
        let elements = elements(&line, 3).unwrap();
        assert_eq!(elements, ["", "", " for=198.51.100.7"]);
        assert!(elements.capacity() < 8, "{}", elements.capacity());
        let r = ForwardedIp::new(["10.0.0.0/8"]).unwrap().rfc7239();
        let h = headers(&[("forwarded", &line)]);
        assert_eq!(r.client(ip("10.0.0.1"), &h), Client::Ip(ip("198.51.100.7")));
    }
}
