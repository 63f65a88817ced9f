//! Refusals that happen before a handler runs, answered in the API's JSON
//! error shape (`{"error": "..."}`) with what is wrong and how to fix it.
//!
//! Two places refuse a request before Fathom's handlers see it:
//!
//! - hyper, while parsing HTTP/1: a URL with a raw `"` or space, an
//!   over-long URL, oversized headers. hyper then writes a bodyless `400`
//!   (or `414`, `431`, `505`) itself and closes the connection. [`Listener`]
//!   wraps every accepted connection in [`Explaining`], which keeps the last
//!   bytes read and swaps such a response for one with a JSON body that
//!   names the offending byte or limit. hyper's own error responses are told
//!   from Fathom's by their shape: a 4xx/505 whose only headers are
//!   `content-length: 0`, `date` and `connection` (every Fathom error has a
//!   JSON body; axum's rejections have a text body).
//! - axum, in extractors and routing: a query string that does not decode,
//!   a path parameter that is not UTF-8, a method a route does not take.
//!   [`json_errors`] turns those text or empty 4xx answers into the same JSON
//!   shape.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Request, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// How many of the most recent bytes read on a connection are kept to say
/// what hyper refused (a request line longer than this is reported as too
/// long to show).
const KEEP: usize = 16 * 1024;

/// The longest axum rejection body turned into JSON; longer ones (none
/// today) pass through unchanged.
const MAX_REJECTION_BODY: usize = 64 * 1024;

/// A TCP listener whose connections explain hyper's refusals (and send
/// without Nagle's delay).
pub(crate) struct Listener(pub(crate) TcpListener);

impl axum::serve::Listener for Listener {
    type Io = Explaining<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((stream, addr)) => {
                    // Responses go out as soon as they are written: with
                    // Nagle's algorithm a gRPC or Flight answer's last small
                    // frame waits for the peer's delayed ACK (up to 40 ms
                    // on Linux) before it is sent.
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(error = %e, "TCP_NODELAY not set");
                    }
                    return (Explaining::new(stream), addr);
                }
                // The peer gave up before we accepted: nothing to do.
                Err(e) if is_connection_error(&e) => continue,
                // Out of file descriptors and the like: wait for some to be
                // freed instead of spinning.
                Err(e) => {
                    tracing::error!(error = %e, "accepting a connection failed; retrying in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// A connection that keeps its last [`KEEP`] bytes read and rewrites hyper's
/// bodyless error responses (see the module docs).
pub(crate) struct Explaining<S> {
    inner: S,
    recent: Vec<u8>,
    /// A rewritten response being written: its bytes, how many are out,
    /// and the length of hyper's buffer it stands for.
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl<S> Explaining<S> {
    pub(crate) fn new(inner: S) -> Self {
        Explaining {
            inner,
            recent: Vec::new(),
            pending: None,
        }
    }
}

impl<S: AsyncWrite + Unpin> Explaining<S> {
    /// Writes the pending rewrite; `Ready(Ok(n))` with hyper's length once
    /// all of it is out.
    fn drive_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        while let Some((bytes, done, stands_for)) = &mut self.pending {
            if *done == bytes.len() {
                let n = *stands_for;
                self.pending = None;
                return Poll::Ready(Ok(n));
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*done..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *done += n;
        }
        Poll::Ready(Ok(0))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Explaining<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let new = &buf.filled()[before..];
        if new.len() >= KEEP {
            this.recent.clear();
            this.recent.extend_from_slice(&new[new.len() - KEEP..]);
        } else {
            let overflow = (this.recent.len() + new.len()).saturating_sub(KEEP);
            this.recent.drain(..overflow);
            this.recent.extend_from_slice(new);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Explaining<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.pending.is_none() {
            match rewrite(buf, &this.recent) {
                Some(bytes) => this.pending = Some((bytes, 0, buf.len())),
                None => return Pin::new(&mut this.inner).poll_write(cx, buf),
            }
        }
        this.drive_pending(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.pending.is_none() {
            // hyper's error response is a head alone, in one slice.
            let mut nonempty = bufs.iter().filter(|b| !b.is_empty());
            let only = match (nonempty.next(), nonempty.next()) {
                (Some(first), None) => Some(&**first),
                _ => None,
            };
            match only.and_then(|b| rewrite(b, &this.recent).map(|r| (r, b.len()))) {
                Some((bytes, len)) => this.pending = Some((bytes, 0, len)),
                None => return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs),
            }
        }
        this.drive_pending(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pending.is_some() {
            ready!(this.drive_pending(cx))?;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pending.is_some() {
            ready!(this.drive_pending(cx))?;
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// hyper's bodyless error response in `out`, rewritten with a JSON body
/// that explains it from the request bytes in `read`; `None` for anything
/// else.
fn rewrite(out: &[u8], read: &[u8]) -> Option<Vec<u8>> {
    let head = std::str::from_utf8(out).ok()?;
    let head = head.strip_suffix("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let rest = status_line.strip_prefix("HTTP/1.")?;
    let (version, rest) = rest.split_once(' ')?;
    let code: u16 = rest.get(..3)?.parse().ok()?;
    if !matches!(code, 400 | 414 | 431 | 505) {
        return None;
    }
    let mut bodyless = false;
    let mut keep = Vec::new();
    for l in lines {
        let (name, value) = l.split_once(':')?;
        match name.to_ascii_lowercase().as_str() {
            "content-length" if value.trim() == "0" => bodyless = true,
            "date" | "connection" => keep.push(l),
            _ => return None,
        }
    }
    if !bodyless {
        return None;
    }
    let body = serde_json::json!({ "error": explain(code, read) }).to_string();
    let mut r = format!(
        "HTTP/1.{version} {status_line_rest}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len(),
        status_line_rest = rest,
    );
    for l in keep {
        r.push_str(l);
        r.push_str("\r\n");
    }
    if !r.to_ascii_lowercase().contains("\r\nconnection:") {
        r.push_str("connection: close\r\n");
    }
    r.push_str("\r\n");
    r.push_str(&body);
    Some(r.into_bytes())
}

/// What was wrong with the request hyper refused with `code`, found in the
/// last bytes read on the connection.
fn explain(code: u16, read: &[u8]) -> String {
    match code {
        414 => "the URL is too long: send fewer or shorter query parameters (or POST the \
                request body where the endpoint takes one)"
            .into(),
        431 => {
            "the request's headers are too large or too many: send fewer or smaller headers".into()
        }
        505 => "unsupported HTTP version: use HTTP/1.1 or HTTP/2".into(),
        _ => match request_line(read) {
            Some(line) => explain_request_line(&line),
            None => {
                "malformed HTTP request: the request line or a header could not be parsed".into()
            }
        },
    }
}

/// The last request line in `read`: a line that starts with a method and a
/// space.
fn request_line(read: &[u8]) -> Option<Vec<u8>> {
    let mut found = None;
    let mut start = 0;
    for (i, w) in read.windows(2).enumerate() {
        if w == b"\r\n" {
            start = i + 2;
            continue;
        }
        if i == start && starts_request(&read[start..]) {
            found = Some(start);
        }
    }
    let s = found?;
    let end = read[s..]
        .windows(2)
        .position(|w| w == b"\r\n")
        .map_or(read.len(), |e| s + e);
    Some(read[s..end].to_vec())
}

fn starts_request(b: &[u8]) -> bool {
    const METHODS: [&[u8]; 9] = [
        b"GET ",
        b"POST ",
        b"PUT ",
        b"DELETE ",
        b"HEAD ",
        b"OPTIONS ",
        b"PATCH ",
        b"CONNECT ",
        b"TRACE ",
    ];
    METHODS.iter().any(|m| b.starts_with(m))
}

/// Names the first byte of the request target that HTTP refuses, and says
/// how to send it.
fn explain_request_line(line: &[u8]) -> String {
    let Some(sp) = line.iter().position(|&b| b == b' ') else {
        return "malformed request line".into();
    };
    let rest = &line[sp + 1..];
    // The target ends at the last space (before `HTTP/1.x`); a target with
    // spaces in it is itself the problem.
    let target_end = rest
        .windows(6)
        .rposition(|w| w == b" HTTP/")
        .unwrap_or(rest.len());
    let target = &rest[..target_end];
    let mut in_query = false;
    for (i, &b) in target.iter().enumerate() {
        if b == b'?' {
            in_query = true;
        }
        let ok = if in_query {
            allowed_in_query(b)
        } else {
            allowed_in_path(b)
        };
        if !ok {
            let shown = if b.is_ascii_graphic() {
                format!("`{}`", b as char)
            } else {
                format!("byte 0x{b:02x}")
            };
            return format!(
                "the URL has {shown} at position {i}, which HTTP does not allow unencoded: \
                 percent-encode the query (for a selector such as \
                 query=cpu{{service_name=\"app\"}}, use curl -G --data-urlencode 'query=...'; \
                 `\"` is %22, a space %20, `{{` %7B, `}}` %7D)"
            );
        }
    }
    "malformed HTTP request: the request line or a header could not be parsed".into()
}

/// Bytes HTTP accepts unencoded in a query (the WHATWG query state, as the
/// `http` crate checks it).
fn allowed_in_query(b: u8) -> bool {
    matches!(b, 0x21 | 0x24..=0x3B | 0x3D | 0x3F..=0x7E)
}

/// Bytes accepted unencoded in a path (plus the `"{}` that clients send and
/// the `http` crate tolerates).
fn allowed_in_path(b: u8) -> bool {
    matches!(b, 0x21 | 0x24..=0x3B | 0x3D | 0x40..=0x5F | 0x61..=0x7A | 0x7C | 0x7E)
        || matches!(b, b'"' | b'{' | b'}')
}

/// Middleware: a 4xx answer that is not JSON (axum's extractor and routing
/// rejections) becomes `{"error": "..."}` with its text, or with a message
/// for the status when it had none.
pub(crate) async fn json_errors(req: Request<Body>, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let resp = next.run(req).await;
    let status = resp.status();
    if !status.is_client_error() {
        return resp;
    }
    let ctype = resp.headers().get(header::CONTENT_TYPE);
    let is_text = ctype.is_none_or(|v| v.as_bytes().starts_with(b"text/plain"));
    // gRPC answers errors in trailers with their own content type.
    if !is_text {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_REJECTION_BODY).await else {
        let e = "the request was refused (its explanation was too long to show)";
        return (status, axum::Json(serde_json::json!({ "error": e }))).into_response();
    };
    let text = String::from_utf8_lossy(&bytes).trim().to_owned();
    let msg = if !text.is_empty() {
        text
    } else if status == axum::http::StatusCode::METHOD_NOT_ALLOWED {
        let allowed = parts
            .headers
            .get(header::ALLOW)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("another method");
        format!("{path} does not take {method}: use {allowed}")
    } else {
        format!(
            "{} {path}: {}",
            method,
            status.canonical_reason().unwrap_or("refused")
        )
    };
    let body = serde_json::json!({ "error": msg }).to_string();
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Accepted connections send without Nagle's delay (a Flight answer's
    /// last frame would otherwise wait for the client's delayed ACK).
    #[tokio::test]
    async fn accepted_connections_do_not_wait_for_acks() {
        use axum::serve::Listener as _;
        let mut l = Listener(TcpListener::bind("127.0.0.1:0").await.unwrap());
        let addr = l.local_addr().unwrap();
        let client = tokio::spawn(TcpStream::connect(addr));
        let (io, _) = l.accept().await;
        assert!(io.inner.nodelay().unwrap());
        client.await.unwrap().unwrap();
    }

    const HYPER_400: &[u8] =
        b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: Mon, 23 Nov 2026 10:00:00 GMT\r\n\r\n";

    fn body_of(r: &[u8]) -> serde_json::Value {
        let s = std::str::from_utf8(r).unwrap();
        let (head, body) = s.split_once("\r\n\r\n").unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(len, body.len());
        assert!(head.contains("content-type: application/json"));
        serde_json::from_str(body).unwrap()
    }

    #[test]
    fn a_raw_quote_in_the_query_is_named() {
        let read =
            b"GET /api/v1/query?query=cpu{service_name=\"myapp\"} HTTP/1.1\r\nhost: x\r\n\r\n";
        let r = rewrite(HYPER_400, read).expect("rewritten");
        assert!(r.starts_with(b"HTTP/1.1 400 Bad Request\r\n"));
        let e = body_of(&r)["error"].as_str().unwrap().to_owned();
        assert!(e.contains("`\"` at position 37"), "{e}");
        assert!(e.contains("--data-urlencode"), "{e}");
    }

    #[test]
    fn the_last_request_on_a_kept_alive_connection_is_the_one_explained() {
        let read = b"GET /ready HTTP/1.1\r\nhost: x\r\n\r\nGET /a?b=<c> HTTP/1.1\r\n";
        let e = body_of(&rewrite(HYPER_400, read).unwrap())["error"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(e.contains("`<` at position 5"), "{e}");
    }

    #[test]
    fn limits_are_named() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n";
        let r = rewrite(head, b"GET / HTTP/1.1\r\n").unwrap();
        assert!(r.starts_with(b"HTTP/1.1 431 "));
        assert!(body_of(&r)["error"].as_str().unwrap().contains("headers"));
        let head = b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n\r\n";
        assert!(
            body_of(&rewrite(head, b"").unwrap())["error"]
                .as_str()
                .unwrap()
                .contains("URL is too long")
        );
    }

    #[test]
    fn responses_with_bodies_or_other_headers_pass_through() {
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n";
        assert!(rewrite(ours, b"").is_none());
        let with_body = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n";
        assert!(rewrite(with_body, b"").is_none());
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert!(rewrite(ok, b"").is_none());
        assert!(rewrite(b"some body bytes", b"").is_none());
    }

    #[test]
    fn garbage_without_a_request_line_still_gets_a_message() {
        let e = explain(400, b"\x16\x03\x01\x02\x00garbage");
        assert!(e.contains("malformed HTTP request"), "{e}");
    }
}
