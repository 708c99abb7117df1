//! Budget keys: how a (route or zone, user) pair becomes one store key.
//!
//! A budget key is `<policy>:<user>` where both parts are encoded so that
//! they only contain `[A-Za-z0-9-._~@+=%#]` (a policy part may also hold one
//! `/` before an encoded group, which no encoding contains):
//!
//! - bytes outside the unreserved set (`-._~@+=` and alphanumerics) become
//!   `%XX`, so `:`, `{`, `}`, spaces, newlines and non-UTF-8 bytes can never
//!   split a key, close a Redis hash tag, or collide with another user;
//! - an encoded part longer than [`MAX_ENCODED`] bytes is replaced by `#`
//!   followed by 32 hex digits of its SHA-256, so a megabyte-long identity
//!   costs the store a fixed 33 bytes. `#` never appears in an encoded part,
//!   so a hashed part never equals a literal one.
//!
//! The encoding is injective: two different users always get two different
//! keys (up to SHA-256 collisions for parts longer than [`MAX_ENCODED`]).

use std::fmt::Write;

use arrayvec::ArrayString;
use sha2::{Digest, Sha256};

/// Encoded parts longer than this many bytes are hashed.
pub const MAX_ENCODED: usize = 128;

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Bytes written as they are, as a bit set over ASCII (bit `b` for byte
/// `b`); every other byte is percent-encoded. (Two words the code holds as
/// constants: a check per byte reads no memory, where a 256-byte table
/// cost each request a cache miss or two; round 21 in benches/HISTORY.md.)
const UNRESERVED: u128 = {
    let mut set = 0u128;
    let mut b = 0u8;
    while b < 128 {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'@' | b'+' | b'=')
        {
            set |= 1 << b;
        }
        b += 1;
    }
    set
};

fn unreserved(b: u8) -> bool {
    b < 128 && (UNRESERVED >> b) & 1 == 1
}

/// The length `bytes` has once percent-encoded.
fn encoded_len(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .map(|&b| if unreserved(b) { 1 } else { 3 })
        .sum()
}

/// Appends the encoding of `bytes` to `out` (see the module docs). The
/// writers used here (a `String`, or an `ArrayString` sized for the
/// longest key) cannot fail.
#[inline]
pub(crate) fn push_encoded(out: &mut impl Write, bytes: &[u8]) {
    // The common case (an IP address, an API key): nothing to escape.
    if bytes.len() <= MAX_ENCODED && bytes.iter().all(|&b| unreserved(b)) {
        if let Ok(plain) = std::str::from_utf8(bytes) {
            let _ = out.write_str(plain);
            return;
        }
    }
    push_escaped(out, bytes);
}

/// [`push_encoded`] for bytes that need escaping or hashing. (Out of line:
/// the common case stays compact in the instruction cache.)
#[inline(never)]
fn push_escaped(out: &mut impl Write, bytes: &[u8]) {
    if encoded_len(bytes) > MAX_ENCODED {
        let digest = Sha256::digest(bytes);
        let _ = out.write_char('#');
        for b in &digest[..16] {
            let _ = write!(out, "{b:02x}");
        }
        return;
    }
    // Runs of unreserved bytes (all of a typical identity) go in one write.
    let mut rest = bytes;
    while !rest.is_empty() {
        let run = rest
            .iter()
            .position(|&b| !unreserved(b))
            .unwrap_or(rest.len());
        let (plain, tail) = rest.split_at(run);
        if let Ok(plain) = std::str::from_utf8(plain) {
            let _ = out.write_str(plain);
        }
        if let Some((&b, tail)) = tail.split_first() {
            let _ = out.write_char('%');
            let _ = out.write_char(char::from(HEX[usize::from(b >> 4)]));
            let _ = out.write_char(char::from(HEX[usize::from(b & 0xf)]));
            rest = tail;
        } else {
            rest = tail;
        }
    }
}

/// The encoding of `bytes` as a key part (see the module docs): what a user
/// becomes in `<policy>:<user>`.
///
/// ```
/// use tower_ratelimit::key::encode;
///
/// assert_eq!(encode(b"alice@example.com"), "alice@example.com");
/// assert_eq!(encode(b"a:b{c}"), "a%3Ab%7Bc%7D");
/// ```
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(encoded_len(bytes).min(MAX_ENCODED + 1));
    push_encoded(&mut out, bytes);
    out
}

/// `<policy>:<encoded user>`, allocated once.
#[cfg(test)]
pub(crate) fn budget_key(policy: &str, user: &[u8]) -> std::sync::Arc<str> {
    std::sync::Arc::from(KeyBuf::new().write(policy, user))
}

/// Room for a budget key on the stack: a policy part is at most a zone's
/// encoding (MAX_ENCODED + 1 bytes) plus a letter, a user part at most
/// MAX_ENCODED + 1 bytes. Only a longer policy part goes to the heap.
pub(crate) struct KeyBuf {
    stack: ArrayString<{ 2 * MAX_ENCODED + 8 }>,
    heap: String,
}

impl KeyBuf {
    #[inline]
    pub(crate) fn new() -> Self {
        Self {
            stack: ArrayString::new(),
            heap: String::new(),
        }
    }

    /// Writes `<policy>:<encoded user>` and returns it.
    pub(crate) fn write(&mut self, policy: &str, user: &[u8]) -> &str {
        self.stack.clear();
        // The encoded user takes at most MAX_ENCODED + 1 bytes.
        if policy.len() + 2 + MAX_ENCODED <= self.stack.capacity() {
            self.stack.push_str(policy);
            self.stack.push(':');
            push_encoded(&mut self.stack, user);
            return &self.stack;
        }
        self.heap.clear();
        self.heap.reserve(policy.len() + 1 + MAX_ENCODED + 1);
        self.heap.push_str(policy);
        self.heap.push(':');
        push_encoded(&mut self.heap, user);
        &self.heap
    }
}

/// A string kept inline when it has at most `N` bytes (so comparing it
/// reads no memory but its holder's, and making it allocates nothing), on
/// the heap beyond.
#[derive(Clone)]
pub(crate) enum ShortStr<const N: usize> {
    Inline { len: u8, bytes: [u8; N] },
    Heap(Box<str>),
}

impl<const N: usize> ShortStr<N> {
    pub(crate) fn new(text: &str) -> Self {
        let mut bytes = [0; N];
        match (bytes.get_mut(..text.len()), u8::try_from(text.len())) {
            (Some(to), Ok(len)) => {
                to.copy_from_slice(text.as_bytes());
                ShortStr::Inline { len, bytes }
            }
            _ => ShortStr::Heap(text.into()),
        }
    }

    /// Whether this is `text`.
    #[inline]
    pub(crate) fn is(&self, text: &str) -> bool {
        self.bytes() == text.as_bytes()
    }

    fn bytes(&self) -> &[u8] {
        match self {
            ShortStr::Inline { len, bytes } => bytes.get(..usize::from(*len)).unwrap_or_default(),
            ShortStr::Heap(text) => text.as_bytes(),
        }
    }

    /// The text (checked again: off the hot path).
    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(self.bytes()).unwrap_or_default()
    }
}

impl<const N: usize> std::fmt::Debug for ShortStr<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

/// A short stable name for a route pattern: 16 hex digits of its SHA-256.
pub(crate) fn pattern_id(pattern: &str) -> String {
    let digest = Sha256::digest(pattern.as_bytes());
    let mut out = String::with_capacity(17);
    out.push('r');
    for b in &digest[..8] {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unreserved_set_is_exactly_rfc_3986s_plus_at_plus_equals() {
        for b in 0..=255u8 {
            let expected = b.is_ascii_alphanumeric()
                || matches!(b, b'-' | b'.' | b'_' | b'~' | b'@' | b'+' | b'=');
            assert_eq!(unreserved(b), expected, "{b}");
        }
    }

    #[test]
    fn short_strings_compare_by_content_inline_or_not() {
        let inline = ShortStr::<8>::new("default");
        let heap = ShortStr::<8>::new("a longer group");
        assert!(matches!(inline, ShortStr::Inline { .. }));
        assert!(matches!(heap, ShortStr::Heap(_)));
        assert!(inline.is("default") && !inline.is("defaults") && !inline.is("defaul"));
        assert!(heap.is("a longer group") && !heap.is("a longer"));
        assert_eq!(inline.as_str(), "default");
        assert_eq!(heap.as_str(), "a longer group");
        assert!(ShortStr::<8>::new("").is(""));
        assert!(ShortStr::<8>::new("12345678").is("12345678"));
        assert!(matches!(ShortStr::<8>::new("123456789"), ShortStr::Heap(_)));
    }

    #[test]
    fn safe_identities_stay_readable() {
        assert_eq!(encode(b"alice@example.com"), "alice@example.com");
        assert_eq!(encode(b"10.0.0.1"), "10.0.0.1");
    }

    #[test]
    fn key_syntax_is_escaped() {
        assert_eq!(encode(b"a:b{c}d e\n%#"), "a%3Ab%7Bc%7Dd%20e%0A%25%23");
        assert_eq!(encode(&[0xff, 0x00]), "%FF%00");
    }

    #[test]
    fn long_identities_are_hashed_to_a_fixed_size() {
        let long = vec![b'x'; 1 << 20];
        let key = encode(&long);
        assert_eq!(key.len(), 33);
        assert!(key.starts_with('#'));
        assert_ne!(encode(&long[1..]), key);
    }

    #[test]
    fn boundary_between_literal_and_hashed() {
        let at = vec![b'a'; MAX_ENCODED];
        assert_eq!(encode(&at).len(), MAX_ENCODED);
        let over = vec![b'a'; MAX_ENCODED + 1];
        assert!(encode(&over).starts_with('#'));
    }

    #[test]
    fn budget_keys_do_not_collide_across_the_separator() {
        // "a" + ":" + "b:c" must differ from "a:b" + ":" + "c".
        assert_ne!(budget_key("a", b"b:c"), budget_key("a:b", b"c"));
        assert_eq!(&*budget_key("r1", b"b:c"), "r1:b%3Ac");
        let long_policy = "z".repeat(400);
        assert!(budget_key(&long_policy, b"u").ends_with(":u"));
        let long_user = vec![0xffu8; 1000];
        assert_eq!(budget_key("r1", &long_user).len(), 3 + 33);
    }
}
