//! The little HTTP/1.1 the issuer speaks: one request per connection,
//! read whole (headers, then a `Content-Length` body), one answer, close.
//! Its clients (librdkafka's libcurl, Java's `HttpURLConnection`, jose4j,
//! the relay) all send that shape; no chunked bodies, no keep-alive.

use std::io::{BufRead, BufReader, Read, Write};

use anyhow::{bail, Context};

/// The largest request head or body the issuer reads.
const MAX_LEN: usize = 64 * 1024;

/// A request, as the endpoints need it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Request {
    pub method: String,
    /// The path without a query.
    pub path: String,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// An answer: a status and a JSON body.
#[derive(Debug, PartialEq)]
pub(crate) struct Response {
    pub status: u16,
    pub body: serde_json::Value,
}

impl Response {
    pub(crate) fn json(status: u16, body: serde_json::Value) -> Response {
        Response { status, body }
    }
}

/// Reads one request from `stream`.
pub(crate) fn read_request(stream: impl Read) -> anyhow::Result<Request> {
    let mut reader = BufReader::new(stream.take(2 * MAX_LEN as u64));
    let mut line = String::new();
    reader.read_line(&mut line).context("the request line")?;
    let mut words = line.split_whitespace();
    let (Some(method), Some(target)) = (words.next(), words.next()) else {
        bail!("a malformed request line {line:?}");
    };
    let mut request = Request {
        method: method.to_owned(),
        path: target.split('?').next().unwrap_or(target).to_owned(),
        ..Request::default()
    };
    let mut head_len = line.len();
    loop {
        line.clear();
        reader.read_line(&mut line).context("a header line")?;
        head_len += line.len();
        if head_len > MAX_LEN {
            bail!("a request head over {MAX_LEN} bytes");
        }
        let trimmed = line.trim_end_matches(['\r', '\n']);
        if trimmed.is_empty() {
            break;
        }
        if let Some((name, value)) = trimmed.split_once(':') {
            request
                .headers
                .push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    let len: usize = match request.header("content-length") {
        Some(v) => v.parse().context("Content-Length")?,
        None => 0,
    };
    if len > MAX_LEN {
        bail!("a request body of {len} bytes");
    }
    request.body = vec![0; len];
    reader.read_exact(&mut request.body).context("the body")?;
    Ok(request)
}

/// Writes `response` and ends the exchange (`Connection: close`).
pub(crate) fn write_response(mut stream: impl Write, response: &Response) -> anyhow::Result<()> {
    let body = response.body.to_string();
    let reason = match response.status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Error",
    };
    let mut head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nConnection: close\r\n",
        response.status,
        body.len()
    );
    if response.status == 401 {
        head.push_str("WWW-Authenticate: Basic realm=\"walrelay-test-issuer\"\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()?;
    Ok(())
}

/// `application/x-www-form-urlencoded` pairs (`+` is a space, `%XX` a
/// byte), as RFC 6749 also encodes the Basic credentials' parts.
pub(crate) fn form_pairs(text: &str) -> Vec<(String, String)> {
    text.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (form_decode(k), form_decode(v))
        })
        .collect()
}

pub(crate) fn form_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(hi), Some(lo)) => {
                    out.push(hi << 4 | lo);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(digit: u8) -> Option<u8> {
    (digit as char).to_digit(16).map(|d| d as u8)
}

/// `application/x-www-form-urlencoded` encoding of one value (for the
/// test kit's own token requests).
pub(crate) fn form_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => {
                (b as char).to_string()
            }
            b' ' => "+".to_owned(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_read_with_its_headers_and_body() {
        let raw = b"POST /token?x=1 HTTP/1.1\r\nHost: a\r\nContent-Type: x\r\n\
                    Content-Length: 9\r\nAuthorization: Basic YTpi\r\n\r\nbody=1&23";
        let r = read_request(&raw[..]).unwrap();
        assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/token"));
        assert_eq!(r.header("authorization"), Some("Basic YTpi"));
        assert_eq!(r.header("Content-Type"), Some("x"));
        assert_eq!(r.body, b"body=1&23");
        assert!(read_request(&b"GARBAGE\r\n\r\n"[..]).is_err());
        assert!(read_request(&b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab"[..]).is_err());
    }

    #[test]
    fn a_response_has_its_length_and_closes() {
        let mut out = Vec::new();
        write_response(&mut out, &Response::json(401, serde_json::json!({"e": 1}))).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{text}");
        assert!(text.contains("Content-Length: 7\r\n") && text.contains("Connection: close"));
        assert!(text.ends_with("\r\n\r\n{\"e\":1}"), "{text}");
    }

    #[test]
    fn forms_decode_and_encode() {
        assert_eq!(
            form_pairs("grant_type=client_credentials&scope=a+b%3Ac&empty=&flag"),
            [
                ("grant_type".into(), "client_credentials".into()),
                ("scope".into(), "a b:c".into()),
                ("empty".into(), String::new()),
                ("flag".into(), String::new()),
            ]
        );
        assert_eq!(form_decode("100%"), "100%");
        assert_eq!(form_decode("%zz%41"), "%zzA");
        let odd = "s3cr:t &=+/é";
        assert_eq!(form_decode(&form_encode(odd)), odd);
    }
}
