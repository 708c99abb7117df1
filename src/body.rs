//! The response body of [`RateLimit`](crate::RateLimit): the inner
//! service's body, or the layer's own (a 429, 401 or 503 answer).
//!
//! By default the service wraps both in a [`RateLimitBody`], which works
//! with any inner body whose chunks are [`Bytes`] (`Body<Data = Bytes>`,
//! as axum's, hyper's `Incoming` and tonic's are). An inner body that can be made from [`Bytes`]
//! (axum's `Body`, `http_body_util::Full<Bytes>`) can keep its own type
//! instead ([`RateLimitLayer::same_body`](crate::RateLimitLayer::same_body)):
//! axum then has no foreign body to box on every response.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// Either the inner service's body or a body the layer wrote.
    pub struct RateLimitBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> RateLimitBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

/// An empty body (as `tower-http`'s `Cors` and `Timeout` layers make for
/// the answers they write themselves), whatever the inner body type is.
///
/// ```
/// use http_body::Body as _;
/// use tower_ratelimit::RateLimitBody;
///
/// let body = RateLimitBody::<http_body_util::Empty<bytes::Bytes>>::default();
/// assert!(body.is_end_stream());
/// ```
impl<B> Default for RateLimitBody<B> {
    fn default() -> Self {
        Self::full(Bytes::new())
    }
}

impl<B> fmt::Debug for RateLimitBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("RateLimitBody::Inner"),
            Kind::Full { data } => f.debug_tuple("RateLimitBody::Full").field(data).finish(),
        }
    }
}

impl<B> Body for RateLimitBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// How [`RateLimit`](crate::RateLimit) types its response body: a body it
/// wraps ([`Wrapped`], the default, for any inner body) or the inner
/// service's own body type ([`SameBody`], for bodies made from bytes).
///
/// Sealed: the layer picks one with
/// [`RateLimitLayer::same_body`](crate::RateLimitLayer::same_body).
pub trait BodyMode<B>: sealed::Sealed {
    /// The response body of the service.
    type Body;

    /// The inner service's body, as the service's.
    #[doc(hidden)]
    fn inner(body: B) -> Self::Body;

    /// A body the layer wrote (a 429, 401 or 503 answer).
    #[doc(hidden)]
    fn written(data: Bytes) -> Self::Body;
}

/// The default [`BodyMode`]: responses carry a [`RateLimitBody`], which
/// holds the inner service's body or the layer's own, whatever the inner
/// body type is.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct Wrapped;

/// The [`BodyMode`] of
/// [`RateLimitLayer::same_body`](crate::RateLimitLayer::same_body):
/// responses keep the inner service's body type `B`, and the layer's own
/// answers are made with `B::from(Bytes)`. Under axum this spares a
/// `Box` per response: axum boxes every body type but its own
/// `axum::body::Body`.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct SameBody;

impl<B> BodyMode<B> for Wrapped {
    type Body = RateLimitBody<B>;

    fn inner(body: B) -> Self::Body {
        RateLimitBody::inner(body)
    }

    fn written(data: Bytes) -> Self::Body {
        RateLimitBody::full(data)
    }
}

impl<B: From<Bytes>> BodyMode<B> for SameBody {
    type Body = B;

    fn inner(body: B) -> B {
        body
    }

    fn written(data: Bytes) -> B {
        B::from(data)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Wrapped {}
    impl Sealed for super::SameBody {}
}
