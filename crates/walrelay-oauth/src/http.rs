//! The HTTP/1.1 that token endpoints, AWS STS and the EC2 instance
//! metadata service need, and no more: one request per connection
//! (`Connection: close`), a body by `Content-Length` or chunked, a bounded
//! answer. Pure: [`Request::encode`] and [`parse_response`] are tested
//! byte for byte; [`super::transport`] moves the bytes.
//!
//! Why not an HTTP client crate: walrelay makes a few such requests an
//! hour, each from a blocking thread (librdkafka's token callback runs on
//! its own thread, walrelay's own Kafka connections are blocking), so an
//! async client (hyper's, reqwest) would bring a runtime hand-off and a
//! dependency tree for a request a simple one does as well.

use std::fmt;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;

/// The largest answer read (token answers are a few kilobytes).
pub const MAX_RESPONSE: usize = 256 * 1024;

/// An `http://` or `https://` URL, parsed as far as a request needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub https: bool,
    /// The host, IPv6 addresses without brackets.
    pub host: String,
    pub port: u16,
    /// The path and query, at least `/`.
    pub target: String,
}

impl Url {
    /// Parses `url`; refuses credentials in it (`user:pw@`, they would be
    /// logged with it) and fragments.
    pub fn parse(url: &str) -> Result<Url, String> {
        let (https, rest) = if let Some(rest) = url.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(format!("`{url}` is not an http:// or https:// URL"));
        };
        if url.contains('#') {
            return Err(format!("`{url}` has a fragment (#...)"));
        }
        let (authority, target) = match rest.find(['/', '?']) {
            Some(i) if rest[i..].starts_with('?') => (&rest[..i], format!("/{}", &rest[i..])),
            Some(i) => (&rest[..i], rest[i..].to_owned()),
            None => (rest, "/".to_owned()),
        };
        if authority.contains('@') {
            return Err(
                "the URL holds credentials (user@host); give them in their own \
                 settings"
                    .to_owned(),
            );
        }
        let (host, port) = split_host_port(authority)?;
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| format!("`{url}`: port `{p}` is not a number"))?,
            None if https => 443,
            None => 80,
        };
        if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!("`{url}` names no valid host"));
        }
        if target.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "`{url}`: the path holds spaces or control characters"
            ));
        }
        Ok(Url {
            https,
            host: host.to_owned(),
            port,
            target,
        })
    }

    /// `host` or `host:port` as the `Host` header wants it.
    #[must_use]
    pub fn authority(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == if self.https { 443 } else { 80 } {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }

    /// The URL without its query: how errors name it (a query may hold a
    /// token).
    #[must_use]
    pub fn shown(&self) -> String {
        let path = self.target.split('?').next().unwrap_or("/");
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}{path}", self.authority())
    }

    /// Whether the host is this machine (plain HTTP is acceptable there).
    #[must_use]
    pub fn is_loopback(&self) -> bool {
        self.host == "localhost"
            || self
                .host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

fn split_host_port(authority: &str) -> Result<(&str, Option<&str>), String> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("`{authority}`: an IPv6 address without its `]`"))?;
        return match after {
            "" => Ok((host, None)),
            _ => after
                .strip_prefix(':')
                .map(|p| (host, Some(p)))
                .ok_or_else(|| format!("`{authority}` is not host:port")),
        };
    }
    Ok(match authority.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    })
}

/// One request. `Debug` hides header values that carry credentials and
/// the body (a form may hold a secret or a web identity token).
#[derive(Clone, PartialEq, Eq)]
pub struct Request {
    pub method: &'static str,
    pub url: Url,
    /// Headers besides `Host`, `Connection` and `Content-Length`.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(name, value)| {
                let shown = if is_credential_header(name) {
                    crate::REDACTED
                } else {
                    value.as_str()
                };
                (name.as_str(), shown)
            })
            .collect();
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("url", &self.url.shown())
            .field("headers", &headers)
            .field("body", &format_args!("<{} bytes>", self.body.len()))
            .finish()
    }
}

fn is_credential_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name == "authorization" || name.contains("token")
}

impl Request {
    /// The request's bytes.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut head = format!(
            "{} {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
            self.method,
            self.url.target,
            self.url.authority()
        );
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if !self.body.is_empty() || self.method != "GET" {
            head.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        head.push_str("\r\n");
        let mut out = head.into_bytes();
        out.extend_from_slice(&self.body);
        out
    }
}

/// An answer: the status and the body (headers are not needed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// The answer in `bytes` once it is complete (`None`: read on); `eof`:
/// the server closed, so a body without a length ends here.
pub fn parse_response(bytes: &[u8], eof: bool) -> Result<Option<Response>, String> {
    let Some(head_end) = find(bytes, b"\r\n\r\n") else {
        return if eof {
            Err("the connection closed before the answer's headers ended".to_owned())
        } else {
            Ok(None)
        };
    };
    let head = std::str::from_utf8(&bytes[..head_end])
        .map_err(|_| "the answer's headers are not text".to_owned())?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| format!("`{}` is not an HTTP/1.x status line", excerpt(status_line)))?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| format!("Content-Length `{}`", excerpt(value)))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        }
    }
    let rest = &bytes[head_end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(n) = length {
        (rest.len() >= n).then(|| rest[..n].to_vec())
    } else if eof || status == 204 || status == 304 {
        Some(rest.to_vec())
    } else {
        None
    };
    match body {
        Some(body) => Ok(Some(Response { status, body })),
        None if eof => Err("the connection closed before the answer's body ended".to_owned()),
        None => Ok(None),
    }
}

/// A chunked body, once its last chunk is there.
fn dechunk(mut rest: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut body = Vec::new();
    loop {
        let Some(line_end) = find(rest, b"\r\n") else {
            return Ok(None);
        };
        let size_text = std::str::from_utf8(&rest[..line_end]).unwrap_or("?");
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("chunk size `{}`", excerpt(size_text)))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(Some(body));
        }
        if rest.len() < size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn excerpt(text: &str) -> String {
    super::error::excerpt(text, 60)
}

/// `application/x-www-form-urlencoded` encoding of one name or value
/// (the HTML URL standard's set: letters, digits and `*-._` stay, space
/// becomes `+`, every other byte `%XX`).
#[must_use]
pub fn form_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' => {
                out.push(char::from(b));
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A form body from its pairs.
#[must_use]
pub fn form(pairs: &[(&str, &str)]) -> Vec<u8> {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
        .into_bytes()
}

/// HTTP Basic credentials (RFC 6749 section 2.3.1: the client id and
/// secret each form-encoded first, then `id:secret` in base64).
#[must_use]
pub fn basic_auth(user: &str, password: &str) -> String {
    let pair = format!("{}:{}", form_encode(user), form_encode(password));
    format!("Basic {}", BASE64.encode(pair))
}

#[cfg(test)]
mod tests;
