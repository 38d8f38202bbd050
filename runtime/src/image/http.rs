//! A small blocking HTTP/1.1 client for registries: one connection per request, plain TCP or
//! TLS (rustls with the ring provider, roots only from the PEM bundle the caller names),
//! Content-Length / chunked / close-delimited bodies read as a stream, redirects followed with
//! credentials (`Authorization`) sent only to the first request's origin (scheme, host, port) and
//! never from `https` to plain `http`; socket timeouts on connect, read and write.
//!
//! Blocking on purpose: pulls run in the single-threaded runtime process or on a blocking thread
//! of the agent, and need no async executor (see `crate::server` on why the runtime process has
//! no threads).
//!
//! Why not `ureq` 3 (blocking, rustls/ring, no tokio): it was tried with `rustls-no-provider`,
//! our roots and ring provider, no proxy from the environment, no pool (a pooled connection the
//! registry had closed failed the next request), redirects followed by us; it passed this
//! module's and `registry`'s unit tests, but made the node binary about 180 KB larger (musl
//! release, bytes: x86_64 7,674,832 → 7,863,280, aarch64 6,390,144 → 6,559,904; new crates
//! `ureq`, `ureq-proto`, a second `base64`, `percent-encoding`, `utf8-zero`), over the ~150 KB
//! budget for replacing this ~460-line module. Revisit when the node links a blocking HTTP
//! client anyway.

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
    #[error("CA bundle: {0}")]
    CaBundle(String),
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("{0:?} is not a valid TLS server name")]
    ServerName(String),
    #[error("{url}: {source}")]
    Io { url: String, source: io::Error },
    #[error("{url}: malformed response: {reason}")]
    Protocol { url: String, reason: String },
    #[error("{url}: too many redirects")]
    Redirects { url: String },
    #[error("{from}: refusing the redirect to plain HTTP {to}")]
    Downgrade { from: String, to: String },
    #[error("header {0} contains a line break")]
    Header(String),
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
        } else if location.starts_with('/') && !location.starts_with("//") {
            Ok(Url {
                path: location.to_string(),
                ..self.clone()
            })
        } else {
            Err(HttpError::Url(location.to_string()))
        }
    }

    /// Scheme, host and port: what decides where credentials may go.
    fn origin(&self) -> (bool, &str, u16) {
        (self.tls, &self.host, self.port)
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
            let cert = cert.map_err(|e| HttpError::CaBundle(e.to_string()))?;
            roots.add(cert).map_err(|e| HttpError::CaBundle(e.to_string()))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Client { tls: Arc::new(tls) })
    }

    /// A client trusting the system bundle when there is one.
    pub fn with_system_roots() -> Result<Self, HttpError> {
        Client::new(&std::fs::read(DEFAULT_CA_BUNDLE).unwrap_or_default())
    }

    /// Sends a request and follows redirects. `Authorization` goes only to the first request's
    /// origin; a redirect from `https` to `http` is refused.
    pub fn request(
        &self,
        method: &str,
        url: &Url,
        headers: &[(&str, String)],
    ) -> Result<Response, HttpError> {
        let mut url = url.clone();
        let first = url.clone();
        for _ in 0..=MAX_REDIRECTS {
            let same_origin = url.origin() == first.origin();
            let hs: Vec<(&str, String)> = headers
                .iter()
                .filter(|(k, _)| same_origin || !k.eq_ignore_ascii_case("authorization"))
                .cloned()
                .collect();
            let resp = self.once(method, &url, &hs)?;
            if matches!(resp.status, 301 | 302 | 303 | 307 | 308)
                && let Some(loc) = resp.header("location")
            {
                let next = url.join(loc)?;
                if url.tls && !next.tls {
                    return Err(HttpError::Downgrade {
                        from: url.to_string(),
                        to: next.to_string(),
                    });
                }
                url = next;
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
        let name =
            ServerName::try_from(url.host.clone()).map_err(|_| HttpError::ServerName(url.host.clone()))?;
        let conn = rustls::ClientConnection::new(self.tls.clone(), name)?;
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
                return Err(HttpError::Header(k.to_string()));
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
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;

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
        assert!(Url::parse("http://x/a b").is_err());
        assert_eq!(
            u.join("/v2/b").expect("join").to_string(),
            "http://[::1]:5000/v2/b"
        );
        assert!(
            u.join("//elsewhere/x").is_err(),
            "scheme-relative locations are refused"
        );
        assert!(u.join("relative").is_err());
    }

    /// Reads one request head from a connection.
    fn read_head(s: &std::net::TcpStream) -> String {
        let mut r = BufReader::new(s);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        head
    }

    /// A listener on loopback and its port.
    fn listen() -> (TcpListener, u16) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        (l, port)
    }

    /// Answers each connection with the next of `answers`; returns the request heads received.
    fn run(l: TcpListener, answers: Vec<String>) -> std::thread::JoinHandle<Vec<String>> {
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            for a in answers {
                let (mut s, _) = l.accept().expect("accept");
                seen.push(read_head(&s));
                let _ = s.write_all(a.as_bytes());
            }
            seen
        })
    }

    fn get(client: &Client, url: &str, headers: &[(&str, String)]) -> Result<Response, HttpError> {
        client.request("GET", &Url::parse(url).expect("url"), headers)
    }

    #[test]
    fn reads_chunked_and_detects_truncation() {
        let client = Client::new(b"").expect("client");
        let (l, port) = listen();
        let h = run(
            l,
            vec![
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n"
                    .into(),
                "HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nshort".into(),
                "HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\n0123456789".into(),
            ],
        );
        let url = format!("http://127.0.0.1:{port}/x");
        let resp = get(&client, &url, &[("Accept", "a/b".into())]).expect("request");
        assert_eq!(resp.read_limited(100).expect("body"), b"abcde");
        let resp = get(&client, &url, &[]).expect("request");
        let err = resp.read_limited(100).expect_err("truncated body");
        assert!(
            err.to_string().contains("closed before the body was complete"),
            "{err}"
        );
        let resp = get(&client, &url, &[]).expect("request");
        let err = resp.read_limited(5).expect_err("limit enforced");
        assert!(err.to_string().contains("body larger than 5 bytes"), "{err}");
        let seen = h.join().expect("server");
        assert!(seen[0].starts_with("GET /x HTTP/1.1\r\n"), "{}", seen[0]);
        let lower = seen[0].to_ascii_lowercase();
        assert!(
            lower.contains("\r\naccept: a/b\r\n"),
            "the caller's Accept is sent: {}",
            seen[0]
        );
        assert!(lower.contains("user-agent: nodeos-runtime"), "{}", seen[0]);
        assert!(
            !lower.contains("accept-encoding"),
            "bodies are never compressed: {}",
            seen[0]
        );
    }

    /// Redirects: credentials follow to the same origin only, a different port is another
    /// origin, and a redirect loop ends.
    #[test]
    fn redirects_keep_credentials_on_their_origin() {
        let client = Client::new(b"").expect("client");
        let (other, other_port) = listen();
        let (l, port) = listen();
        let h = run(
            l,
            vec![
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: /same\r\nContent-Length: 0\r\n\r\n".into(),
                format!(
                    "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{other_port}/blob\r\nContent-Length: 0\r\n\r\n"
                ),
            ],
        );
        let o = run(
            other,
            vec!["HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".into()],
        );
        let url = format!("http://127.0.0.1:{port}/start");
        let resp = get(&client, &url, &[("Authorization", "Bearer secret".into())]).expect("request");
        assert_eq!(
            resp.url.to_string(),
            format!("http://127.0.0.1:{other_port}/blob")
        );
        assert_eq!(resp.read_limited(10).expect("body"), b"ok");
        let seen = h.join().expect("server");
        assert!(seen[0].contains("Bearer secret"), "{}", seen[0]);
        assert!(seen[1].starts_with("GET /same "), "{}", seen[1]);
        assert!(
            seen[1].contains("Bearer secret"),
            "same origin keeps credentials: {}",
            seen[1]
        );
        let seen = o.join().expect("other server");
        assert!(
            !seen[0].to_ascii_lowercase().contains("authorization"),
            "{}",
            seen[0]
        );

        let (l, port) = listen();
        let answer = "HTTP/1.1 302 Found\r\nLocation: /again\r\nContent-Length: 0\r\n\r\n".to_string();
        let h = run(l, vec![answer; MAX_REDIRECTS + 1]);
        let err = get(&client, &format!("http://127.0.0.1:{port}/again"), &[]).expect_err("loop");
        assert!(matches!(err, HttpError::Redirects { .. }), "{err}");
        h.join().expect("server");
    }

    /// A TLS server on loopback for `localhost` with a certificate from a fresh CA; answers one
    /// connection with `answer`. Returns the CA (PEM) and the port.
    fn tls_server(answer: String) -> (String, u16, std::thread::JoinHandle<()>) {
        let mut ca_params = rcgen::CertificateParams::new(Vec::new()).expect("ca params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = rcgen::KeyPair::generate().expect("ca key");
        let ca = ca_params.self_signed(&ca_key).expect("ca");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .expect("params")
            .signed_by(&key, &ca, &ca_key)
            .expect("cert");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .expect("server config");
        let config = Arc::new(config);
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let h = std::thread::spawn(move || {
            let (tcp, _) = l.accept().expect("accept");
            let conn = rustls::ServerConnection::new(config).expect("conn");
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            let mut r = BufReader::new(&mut tls);
            let mut line = String::new();
            while r.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                line.clear();
            }
            let _ = tls.write_all(answer.as_bytes());
            let _ = tls.flush();
        });
        (ca.pem(), port, h)
    }

    #[test]
    fn tls_trusts_only_the_given_roots_and_never_downgrades() {
        let (ca, port, h) = tls_server("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello".into());
        let client = Client::new(ca.as_bytes()).expect("client");
        let resp = get(&client, &format!("https://localhost:{port}/v2/"), &[]).expect("TLS request");
        assert_eq!(resp.read_limited(10).expect("body"), b"hello");
        h.join().expect("server");

        let (_, port, h) = tls_server(String::new());
        let err = get(
            &Client::new(b"").expect("client"),
            &format!("https://localhost:{port}/v2/"),
            &[],
        )
        .expect_err("no roots, no trust");
        assert!(err.to_string().contains("UnknownIssuer"), "{err}");
        h.join().expect("server");

        let (ca, port, h) = tls_server(
            "HTTP/1.1 302 Found\r\nLocation: http://localhost:1/blob\r\nContent-Length: 0\r\n\r\n".into(),
        );
        let client = Client::new(ca.as_bytes()).expect("client");
        let err = get(&client, &format!("https://localhost:{port}/v2/"), &[]).expect_err("downgrade");
        assert!(matches!(err, HttpError::Downgrade { .. }), "{err}");
        h.join().expect("server");

        assert!(matches!(
            Client::new(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
            Err(HttpError::CaBundle(_))
        ));
    }
}
