//! A small blocking HTTP/1.1 client for registries: one connection per request, plain TCP or
//! TLS (rustls, roots from a PEM bundle), Content-Length / chunked / close-delimited bodies read
//! as a stream, redirects followed (credentials are not sent to another host).
//!
//! Blocking on purpose: pulls run in the single-threaded runtime process or on a blocking thread
//! of the agent, and need no async executor (see `crate::server` on why the runtime process has
//! no threads).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};

/// Socket read/write timeout: a stalled registry fails the pull instead of hanging it.
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_HEADER_BYTES: usize = 64 * 1024;
const MAX_REDIRECTS: usize = 5;

/// HTTP failures.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("bad URL {0:?}")]
    Url(String),
    #[error("connecting to {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    #[error("TLS: {0}")]
    Tls(String),
    #[error("{url}: {source}")]
    Io { url: String, source: io::Error },
    #[error("{url}: malformed response: {reason}")]
    Protocol { url: String, reason: String },
    #[error("{url}: too many redirects")]
    Redirects { url: String },
}

/// A parsed `scheme://host[:port]/path?query`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl Url {
    pub fn parse(s: &str) -> Result<Self, HttpError> {
        let bad = || HttpError::Url(s.to_string());
        let (tls, rest) = if let Some(r) = s.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = s.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(bad());
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
                (h, p.parse::<u16>().map_err(|_| bad())?)
            }
            _ => (authority, if tls { 443 } else { 80 }),
        };
        if host.is_empty()
            || path
                .bytes()
                .any(|c| c.is_ascii_whitespace() || c.is_ascii_control())
        {
            return Err(bad());
        }
        Ok(Url {
            tls,
            host: host.trim_matches(['[', ']']).to_string(),
            port,
            path: path.to_string(),
        })
    }

    /// Resolves a `Location` header against this URL.
    pub fn join(&self, location: &str) -> Result<Url, HttpError> {
        if location.starts_with("http://") || location.starts_with("https://") {
            Url::parse(location)
        } else if location.starts_with('/') {
            Ok(Url {
                path: location.to_string(),
                ..self.clone()
            })
        } else {
            Err(HttpError::Url(location.to_string()))
        }
    }

    fn authority(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if (self.tls && self.port == 443) || (!self.tls && self.port == 80) {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}://{}{}",
            if self.tls { "https" } else { "http" },
            self.authority(),
            self.path
        )
    }
}

trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// A response whose body is read on demand.
pub struct Response {
    pub status: u16,
    pub url: Url,
    headers: Vec<(String, String)>,
    body: Body,
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Response")
            .field("status", &self.status)
            .field("url", &self.url)
            .finish()
    }
}

impl Response {
    /// The first header with this (case-insensitive) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length").and_then(|v| v.trim().parse().ok())
    }

    /// Reads the whole body, failing when it is longer than `limit`.
    pub fn read_limited(mut self, limit: u64) -> Result<Vec<u8>, HttpError> {
        let mut out = Vec::new();
        let url = self.url.to_string();
        (&mut self.body)
            .take(limit + 1)
            .read_to_end(&mut out)
            .map_err(|source| HttpError::Io {
                url: url.clone(),
                source,
            })?;
        if out.len() as u64 > limit {
            return Err(HttpError::Protocol {
                url,
                reason: format!("body larger than {limit} bytes"),
            });
        }
        Ok(out)
    }

    /// The body as a stream.
    pub fn body(&mut self) -> &mut dyn Read {
        &mut self.body
    }
}

enum Body {
    Length {
        inner: BufReader<Box<dyn Stream>>,
        left: u64,
    },
    Chunked {
        inner: BufReader<Box<dyn Stream>>,
        left: u64,
        done: bool,
    },
    Eof(BufReader<Box<dyn Stream>>),
    Empty,
}

fn truncated() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "connection closed before the body was complete",
    )
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Body::Empty => Ok(0),
            Body::Eof(r) => r.read(buf),
            Body::Length { inner, left } => {
                if *left == 0 || buf.is_empty() {
                    return Ok(0);
                }
                let want = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                let n = inner.read(&mut buf[..want])?;
                if n == 0 {
                    return Err(truncated());
                }
                *left -= n as u64;
                Ok(n)
            }
            Body::Chunked { inner, left, done } => {
                if *done || buf.is_empty() {
                    return Ok(0);
                }
                if *left == 0 {
                    let mut line = String::new();
                    if inner.by_ref().take(1024).read_line(&mut line)? == 0 {
                        return Err(truncated());
                    }
                    let size = line.trim().split(';').next().unwrap_or("");
                    *left = u64::from_str_radix(size, 16)
                        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"))?;
                    if *left == 0 {
                        // Trailers until the empty line.
                        loop {
                            line.clear();
                            if inner.by_ref().take(8192).read_line(&mut line)? == 0 || line.trim().is_empty()
                            {
                                break;
                            }
                        }
                        *done = true;
                        return Ok(0);
                    }
                }
                let want = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                let n = inner.read(&mut buf[..want])?;
                if n == 0 {
                    return Err(truncated());
                }
                *left -= n as u64;
                if *left == 0 {
                    let mut crlf = [0u8; 2];
                    inner.read_exact(&mut crlf)?;
                }
                Ok(n)
            }
        }
    }
}

/// The client: TLS roots and nothing else (no pooling).
#[derive(Clone)]
pub struct Client {
    tls: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

/// Where TLS trust comes from when the caller names no bundle.
pub const DEFAULT_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

impl Client {
    /// A client trusting the certificates in `ca_pem` (may be empty: then only plain HTTP works).
    pub fn new(ca_pem: &[u8]) -> Result<Self, HttpError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem) {
            let cert = cert.map_err(|e| HttpError::Tls(format!("CA bundle: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| HttpError::Tls(format!("CA bundle: {e}")))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| HttpError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Client { tls: Arc::new(tls) })
    }

    /// A client trusting the system bundle when there is one.
    pub fn with_system_roots() -> Result<Self, HttpError> {
        Client::new(&std::fs::read(DEFAULT_CA_BUNDLE).unwrap_or_default())
    }

    /// Sends a request and follows redirects. `headers` go to the first host only when they
    /// carry credentials (`Authorization`).
    pub fn request(
        &self,
        method: &str,
        url: &Url,
        headers: &[(&str, String)],
    ) -> Result<Response, HttpError> {
        let mut url = url.clone();
        let first_host = (url.host.clone(), url.port);
        for _ in 0..=MAX_REDIRECTS {
            let same_host = (url.host.clone(), url.port) == first_host;
            let hs: Vec<(&str, String)> = headers
                .iter()
                .filter(|(k, _)| same_host || !k.eq_ignore_ascii_case("authorization"))
                .cloned()
                .collect();
            let resp = self.once(method, &url, &hs)?;
            if matches!(resp.status, 301 | 302 | 303 | 307 | 308)
                && let Some(loc) = resp.header("location")
            {
                url = url.join(loc)?;
                continue;
            }
            return Ok(resp);
        }
        Err(HttpError::Redirects { url: url.to_string() })
    }

    fn connect(&self, url: &Url) -> Result<Box<dyn Stream>, HttpError> {
        let addr = format!("{}:{}", url.host, url.port);
        let connect_err = |source| HttpError::Connect {
            addr: addr.clone(),
            source,
        };
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        let mut stream = None;
        for a in (url.host.as_str(), url.port)
            .to_socket_addrs()
            .map_err(connect_err)?
        {
            match TcpStream::connect_timeout(&a, IO_TIMEOUT) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let tcp = stream.ok_or_else(|| connect_err(last))?;
        tcp.set_read_timeout(Some(IO_TIMEOUT)).map_err(connect_err)?;
        tcp.set_write_timeout(Some(IO_TIMEOUT)).map_err(connect_err)?;
        let _ = tcp.set_nodelay(true);
        if !url.tls {
            return Ok(Box::new(tcp));
        }
        let name = ServerName::try_from(url.host.clone()).map_err(|e| HttpError::Tls(e.to_string()))?;
        let conn = rustls::ClientConnection::new(self.tls.clone(), name)
            .map_err(|e| HttpError::Tls(e.to_string()))?;
        Ok(Box::new(rustls::StreamOwned::new(conn, tcp)))
    }

    fn once(&self, method: &str, url: &Url, headers: &[(&str, String)]) -> Result<Response, HttpError> {
        let io_err = |source| HttpError::Io {
            url: url.to_string(),
            source,
        };
        let mut stream = self.connect(url)?;
        let mut req = format!(
            "{method} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: nodeos-runtime\r\nConnection: close\r\n",
            url.path,
            url.authority()
        );
        for (k, v) in headers {
            if v.contains(['\r', '\n']) {
                return Err(HttpError::Url(format!("header {k} contains a line break")));
            }
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        stream.write_all(req.as_bytes()).map_err(io_err)?;
        stream.flush().map_err(io_err)?;
        let mut reader = BufReader::with_capacity(64 * 1024, stream);
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let n = reader.by_ref().take(1).read_to_end(&mut head).map_err(io_err)?;
            if n == 0 {
                return Err(HttpError::Protocol {
                    url: url.to_string(),
                    reason: "connection closed in the headers".into(),
                });
            }
            if head.len() > MAX_HEADER_BYTES {
                return Err(HttpError::Protocol {
                    url: url.to_string(),
                    reason: "headers too large".into(),
                });
            }
        }
        let mut raw = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Response::new(&mut raw);
        parsed.parse(&head).map_err(|e| HttpError::Protocol {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
        let status = parsed.code.unwrap_or(0);
        let headers: Vec<(String, String)> = parsed
            .headers
            .iter()
            .map(|h| (h.name.to_string(), String::from_utf8_lossy(h.value).into_owned()))
            .collect();
        let mut resp = Response {
            status,
            url: url.clone(),
            headers,
            body: Body::Empty,
        };
        let chunked = resp
            .header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        resp.body = if method == "HEAD" || status == 204 || status == 304 {
            Body::Empty
        } else if chunked {
            Body::Chunked {
                inner: reader,
                left: 0,
                done: false,
            }
        } else if let Some(n) = resp.content_length() {
            Body::Length {
                inner: reader,
                left: n,
            }
        } else {
            Body::Eof(reader)
        };
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let u = Url::parse("http://10.0.2.100:5000/v2/").expect("url");
        assert_eq!(
            (u.tls, u.host.as_str(), u.port, u.path.as_str()),
            (false, "10.0.2.100", 5000, "/v2/")
        );
        let u = Url::parse("https://registry.example/v2/x?y=1").expect("url");
        assert_eq!((u.tls, u.port, u.path.as_str()), (true, 443, "/v2/x?y=1"));
        let u = Url::parse("http://[::1]:5000/v2/").expect("url");
        assert_eq!((u.host.as_str(), u.port), ("::1", 5000));
        assert_eq!(u.to_string(), "http://[::1]:5000/v2/");
        assert!(Url::parse("ftp://x/").is_err());
        assert!(Url::parse("http://:80/").is_err());
        assert_eq!(
            u.join("/v2/b").expect("join").to_string(),
            "http://[::1]:5000/v2/b"
        );
    }

    /// A one-shot server on loopback that answers with `raw` and returns what it received.
    fn serve(raw: &'static [u8]) -> (String, std::thread::JoinHandle<String>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            let _ = s.write_all(raw);
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        (format!("http://{addr}/x"), h)
    }

    #[test]
    fn reads_chunked_and_detects_truncation() {
        let client = Client::new(b"").expect("client");
        let (url, h) = serve(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
        );
        let resp = client
            .request("GET", &Url::parse(&url).expect("url"), &[])
            .expect("request");
        assert_eq!(resp.read_limited(100).expect("body"), b"abcde");
        assert!(h.join().expect("server").starts_with("GET /x HTTP/1.1\r\n"));

        let (url, h) = serve(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort");
        let resp = client
            .request("GET", &Url::parse(&url).expect("url"), &[])
            .expect("request");
        let err = resp.read_limited(100).expect_err("truncated body");
        assert!(
            err.to_string().contains("closed before the body was complete"),
            "{err}"
        );
        h.join().expect("server");

        let (url, h) = serve(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789");
        let resp = client
            .request("GET", &Url::parse(&url).expect("url"), &[])
            .expect("request");
        assert!(resp.read_limited(5).is_err(), "limit enforced");
        h.join().expect("server");
    }
}
