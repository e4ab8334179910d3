//! HTTP/1.1 as bytes on a TCP socket, for what a well-behaved client or
//! server library will not do: malformed and hostile requests, answers that
//! break off, and reading exactly what came back.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One request as a raw server read it.
pub struct RawRequest {
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl RawRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One answer as a raw client read it.
pub struct RawAnswer {
    pub status: u16,
    pub body: Vec<u8>,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The start line and headers of a message whose head ends at `end`.
fn head(bytes: &[u8]) -> (String, Vec<(String, String)>) {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or_default().to_owned();
    let headers = lines
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_owned(), v.trim().to_owned()))
        })
        .collect();
    (first, headers)
}

/// A chunked body at the start of `bytes`: the data and the bytes it took,
/// or `None` while it is incomplete (or malformed).
fn dechunk(bytes: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut data = Vec::new();
    let mut at = 0;
    loop {
        let line_end = at + find(&bytes[at..], b"\r\n")?;
        let size_text = String::from_utf8_lossy(&bytes[at..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        at = line_end + 2;
        if size == 0 {
            // No trailers from anyone the battery talks to.
            if bytes.len() < at + 2 {
                return None;
            }
            return Some((data, at + 2));
        }
        if bytes.len() < at + size + 2 {
            return None;
        }
        data.extend_from_slice(&bytes[at..at + size]);
        at += size + 2;
    }
}

/// A message at the start of `bytes` whose head is parsed: its body and
/// the bytes it took, or `None` while incomplete. Without a length the
/// body runs to the end (`closed` says the connection ended).
fn body_of(
    headers: &[(String, String)],
    rest: &[u8],
    closed: bool,
    request: bool,
) -> Option<(Vec<u8>, usize)> {
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    if get("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        return dechunk(rest);
    }
    match get("content-length").and_then(|v| v.parse::<usize>().ok()) {
        Some(n) if rest.len() >= n => Some((rest[..n].to_vec(), n)),
        Some(_) => None,
        None if request => Some((Vec::new(), 0)),
        None if closed => Some((rest.to_vec(), rest.len())),
        None => None,
    }
}

/// Reads one request from `stream`, keeping what follows it in `buf` for the
/// next; `None` when the connection ends first.
pub async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<RawRequest> {
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            let (first, headers) = head(&buf[..end]);
            // The body is read (so the next request starts right) and not kept.
            if let Some((_, used)) = body_of(&headers, &buf[end + 4..], false, true) {
                buf.drain(..end + 4 + used);
                let path = first.split(' ').nth(1).unwrap_or_default().to_owned();
                return Some(RawRequest { path, headers });
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The complete answers at the start of `bytes`, in order.
pub fn parse_answers(bytes: &[u8], closed: bool) -> Vec<RawAnswer> {
    let mut answers = Vec::new();
    let mut at = 0;
    while let Some(end) = find(&bytes[at..], b"\r\n\r\n").map(|e| at + e) {
        let (first, headers) = head(&bytes[at..end]);
        let Some(status) = first
            .strip_prefix("HTTP/1.")
            .and_then(|r| r.get(2..5))
            .and_then(|s| s.parse().ok())
        else {
            break;
        };
        let Some((body, used)) = body_of(&headers, &bytes[end + 4..], closed, false) else {
            break;
        };
        answers.push(RawAnswer { status, body });
        at = end + 4 + used;
    }
    answers
}

/// What came back for bytes written to a fresh connection.
pub struct Exchange {
    pub answers: Vec<RawAnswer>,
    /// The hub closed the connection (or reset it).
    pub closed: bool,
}

impl Exchange {
    /// The first answer's status, or 0 for none.
    pub fn status(&self) -> u16 {
        self.answers.first().map_or(0, |a| a.status)
    }

    /// `413 closed` and the like, for a figure.
    pub fn summary(&self) -> String {
        let statuses: Vec<String> = self.answers.iter().map(|a| a.status.to_string()).collect();
        let statuses = if statuses.is_empty() {
            "none".to_owned()
        } else {
            statuses.join("+")
        };
        if self.closed {
            format!("{statuses},closed")
        } else {
            statuses
        }
    }
}

/// Writes `request` on a new connection to `addr`, then reads until the
/// connection ends, `want` answers are complete, or `wait` has passed.
pub async fn exchange(
    addr: SocketAddr,
    request: &[u8],
    want: usize,
    wait: Duration,
) -> Result<Exchange, String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    // The hub may stop reading early (a body past its limit): what it
    // answered is read all the same.
    let _ = stream.write_all(request).await;
    read_answers(&mut stream, want, wait).await
}

/// Reads from `stream` as [`exchange`] does.
pub async fn read_answers(
    stream: &mut TcpStream,
    want: usize,
    wait: Duration,
) -> Result<Exchange, String> {
    let deadline = Instant::now() + wait;
    let mut bytes = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut closed = false;
    loop {
        if want > 0 && parse_answers(&bytes, false).len() >= want {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match tokio::time::timeout(left, stream.read(&mut chunk)).await {
            Err(_) => break,
            Ok(Ok(0) | Err(_)) => {
                closed = true;
                break;
            }
            Ok(Ok(n)) => bytes.extend_from_slice(&chunk[..n]),
        }
    }
    Ok(Exchange {
        answers: parse_answers(&bytes, closed),
        closed,
    })
}

/// A POST of `body` to `path` with the given extra header lines; the
/// framing headers are the caller's.
pub fn post(path: &str, framing: &str, extra: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         Content-Type: application/json; charset=utf-8\r\n{framing}{extra}\r\n"
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// A POST of `body` with its Content-Length.
pub fn post_sized(path: &str, extra: &str, body: &[u8]) -> Vec<u8> {
    post(
        path,
        &format!("Content-Length: {}\r\n", body.len()),
        extra,
        body,
    )
}

/// The path part of an `http://host:port/path` URL.
pub fn path_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.find('/')
        .map_or("/".to_owned(), |i| rest[i..].to_owned())
}
