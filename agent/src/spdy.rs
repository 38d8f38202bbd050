//! SPDY/3.1 framing, the part of it Kubernetes' streams use: the kubelet's port-forward endpoint
//! speaks it (kubectl sends it raw after `Upgrade: SPDY/3.1`, or tunnelled in WebSocket binary
//! messages as `SPDY/3.1+portforward.k8s.io`).
//!
//! Written here because the one SPDY/3.1 crate found (`spdy-mux` 0.1, 2026) is a client: it
//! opens stream pairs over a pool of WebSocket transports and has no server side that accepts
//! the peer's streams, which is all this endpoint does. The subset: SYN_STREAM in, SYN_REPLY,
//! DATA (with FIN), RST_STREAM, PING echo and GOAWAY; SETTINGS, WINDOW_UPDATE, HEADERS and
//! unknown control frames are read and ignored (Go's spdystream, kubectl's side, does no flow
//! control). Header blocks are zlib streams over the whole connection with the SPDY/3
//! dictionary (flate2 on zlib-rs, which can take a preset dictionary).

use bytes::{BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// SPDY's version in every control frame.
const VERSION: u16 = 3;
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
/// The FIN flag of DATA and SYN frames.
const FLAG_FIN: u8 = 0x01;

/// Largest control frame accepted (header blocks of a few stream headers are ~100 bytes).
const MAX_CONTROL: usize = 64 << 10;
/// Largest DATA frame accepted (Go's spdystream writes what one `Write` got: io.Copy's 32 KiB).
const MAX_DATA: usize = 1 << 20;
/// Largest decompressed header block.
const MAX_HEADER_BLOCK: usize = 64 << 10;

/// RST_STREAM status: the stream was refused before any processing.
pub const REFUSED_STREAM: u32 = 3;

/// Why a connection cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("SPDY version {0} is not supported (only 3)")]
    Version(u16),
    #[error("SPDY frame of {len} bytes is over the limit of {limit}")]
    TooLarge { len: usize, limit: usize },
    #[error("malformed SPDY {0} frame")]
    Malformed(&'static str),
    #[error("SPDY header block: {0}")]
    Headers(String),
}

/// A frame the peer sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        id: u32,
        fin: bool,
        headers: Vec<(String, String)>,
    },
    Data {
        id: u32,
        fin: bool,
        data: Bytes,
    },
    RstStream {
        id: u32,
        status: u32,
    },
    Ping {
        id: u32,
    },
    GoAway,
    /// SETTINGS, WINDOW_UPDATE, HEADERS, SYN_REPLY or a type this side does not know: nothing to
    /// do (the spec has unknown control frames ignored).
    Ignored,
}

/// The SPDY/3 header compression dictionary (SPDY/3 §2.6.10.1): length-prefixed header names
/// and values, then a run of status lines, dates and media types.
pub(crate) fn dictionary() -> Vec<u8> {
    const WORDS: [&str; 59] = [
        "options",
        "head",
        "post",
        "put",
        "delete",
        "trace",
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "accept-ranges",
        "age",
        "allow",
        "authorization",
        "cache-control",
        "connection",
        "content-base",
        "content-encoding",
        "content-language",
        "content-length",
        "content-location",
        "content-md5",
        "content-range",
        "content-type",
        "date",
        "etag",
        "expect",
        "expires",
        "from",
        "host",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "last-modified",
        "location",
        "max-forwards",
        "pragma",
        "proxy-authenticate",
        "proxy-authorization",
        "range",
        "referer",
        "retry-after",
        "server",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "vary",
        "via",
        "warning",
        "www-authenticate",
        "method",
        "get",
        "status",
        "200 OK",
        "version",
    ];
    const MORE: [&str; 5] = ["HTTP/1.1", "url", "public", "set-cookie", "keep-alive"];
    const TAIL: &str = "origin100101201202205206300302303304305306307402405406407408409410411412413414\
        415416417502504505203 Non-Authoritative Information204 No Content301 Moved Permanently\
        400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error\
        501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov \
        Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,\
        image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,text/javascript,\
        publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.";
    let mut d = Vec::with_capacity(1423);
    for w in WORDS.iter().chain(MORE.iter()) {
        d.extend_from_slice(&(w.len() as u32).to_be_bytes());
        d.extend_from_slice(w.as_bytes());
    }
    // "origin" is the last length-prefixed word; the rest follows without lengths.
    d.extend_from_slice(&6u32.to_be_bytes());
    d.extend_from_slice(TAIL.as_bytes());
    d
}

/// Reads frames from the peer, inflating header blocks with the connection's one zlib stream.
pub struct FrameReader<R> {
    io: R,
    inflate: Decompress,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(io: R) -> Self {
        Self {
            io,
            inflate: Decompress::new(true),
        }
    }

    /// The next frame; `None` when the peer closed the connection between frames.
    pub async fn next(&mut self) -> Result<Option<Frame>, SpdyError> {
        let mut head = [0u8; 8];
        match self.io.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let first = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let flags = head[4];
        let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
        let control = first & 0x8000_0000 != 0;
        let limit = if control { MAX_CONTROL } else { MAX_DATA };
        if len > limit {
            return Err(SpdyError::TooLarge { len, limit });
        }
        let mut payload = vec![0u8; len];
        self.io.read_exact(&mut payload).await?;
        if !control {
            return Ok(Some(Frame::Data {
                id: first & 0x7fff_ffff,
                fin: flags & FLAG_FIN != 0,
                data: Bytes::from(payload),
            }));
        }
        let version = ((first >> 16) & 0x7fff) as u16;
        if version != VERSION {
            return Err(SpdyError::Version(version));
        }
        let word = |at: usize| -> Option<u32> {
            let b = payload.get(at..at + 4)?;
            Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        };
        let frame = match (first & 0xffff) as u16 {
            SYN_STREAM => {
                let id = word(0).ok_or(SpdyError::Malformed("SYN_STREAM"))? & 0x7fff_ffff;
                let block = payload.get(10..).ok_or(SpdyError::Malformed("SYN_STREAM"))?;
                let headers = self.headers(block)?;
                if id == 0 {
                    return Err(SpdyError::Malformed("SYN_STREAM"));
                }
                Frame::SynStream {
                    id,
                    fin: flags & FLAG_FIN != 0,
                    headers,
                }
            }
            RST_STREAM => Frame::RstStream {
                id: word(0).ok_or(SpdyError::Malformed("RST_STREAM"))? & 0x7fff_ffff,
                status: word(4).ok_or(SpdyError::Malformed("RST_STREAM"))?,
            },
            PING => Frame::Ping {
                id: word(0).ok_or(SpdyError::Malformed("PING"))?,
            },
            GOAWAY => Frame::GoAway,
            SYN_REPLY | 8 => {
                // Header blocks share the zlib stream: inflate them to keep it in step.
                let block = payload.get(4..).ok_or(SpdyError::Malformed("HEADERS"))?;
                self.headers(block)?;
                Frame::Ignored
            }
            _ => Frame::Ignored,
        };
        Ok(Some(frame))
    }

    /// Inflates and parses one name/value header block.
    fn headers(&mut self, mut block: &[u8]) -> Result<Vec<(String, String)>, SpdyError> {
        let bad = |m: &str| SpdyError::Headers(m.to_string());
        let mut raw = Vec::with_capacity(512);
        loop {
            if raw.len() == raw.capacity() {
                raw.reserve(1024);
            }
            let (in_before, out_before) = (self.inflate.total_in(), raw.len());
            match self
                .inflate
                .decompress_vec(block, &mut raw, FlushDecompress::Sync)
            {
                Ok(Status::Ok | Status::BufError | Status::StreamEnd) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(&dictionary())
                        .map_err(|e| bad(&e.to_string()))?;
                }
                Err(e) => return Err(bad(&e.to_string())),
            }
            let used = (self.inflate.total_in() - in_before) as usize;
            block = &block[used..];
            if raw.len() > MAX_HEADER_BLOCK {
                return Err(bad("decompressed header block over 64 KiB"));
            }
            let progressed = used > 0 || raw.len() > out_before;
            if (block.is_empty() && raw.len() < raw.capacity()) || !progressed {
                break;
            }
        }
        parse_header_block(&raw).ok_or_else(|| bad("truncated name/value block"))
    }
}

/// The name/value pairs of an inflated block (a value with NULs is several values of one name).
fn parse_header_block(raw: &[u8]) -> Option<Vec<(String, String)>> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = raw.get(at..at.checked_add(n)?)?;
        at += n;
        Some(s)
    };
    let word = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let count = word(take(4)?);
    let mut out = Vec::new();
    for _ in 0..count {
        let name_len = word(take(4)?);
        let name = String::from_utf8_lossy(take(name_len)?).to_ascii_lowercase();
        let value_len = word(take(4)?);
        let value = String::from_utf8_lossy(take(value_len)?).into_owned();
        for v in value.split('\0') {
            out.push((name.clone(), v.to_string()));
        }
    }
    Some(out)
}

/// An uncompressed name/value block.
fn name_value_block(headers: &[(&str, &str)]) -> Vec<u8> {
    let mut raw = Vec::new();
    raw.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    for (n, v) in headers {
        for s in [n, v] {
            raw.extend_from_slice(&(s.len() as u32).to_be_bytes());
            raw.extend_from_slice(s.as_bytes());
        }
    }
    raw
}

/// Encodes frames for the peer, deflating header blocks with the connection's one zlib stream.
pub struct FrameWriter {
    deflate: Compress,
}

impl Default for FrameWriter {
    fn default() -> Self {
        Self {
            deflate: Compress::new(Compression::default(), true),
        }
    }
}

impl FrameWriter {
    fn control(kind: u16, flags: u8, payload: &[u8]) -> Bytes {
        let mut b = BytesMut::with_capacity(8 + payload.len());
        b.put_u16(0x8000 | VERSION);
        b.put_u16(kind);
        b.put_u32((u32::from(flags) << 24) | (payload.len() as u32 & 0x00ff_ffff));
        b.put_slice(payload);
        b.freeze()
    }

    /// SYN_REPLY with `headers` (the reply every accepted stream gets).
    pub fn syn_reply(&mut self, id: u32, headers: &[(&str, &str)]) -> Result<Bytes, SpdyError> {
        let raw = name_value_block(headers);
        let mut payload = Vec::with_capacity(raw.len() + 64);
        payload.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
        let mut input = &raw[..];
        loop {
            payload.reserve(256);
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(input, &mut payload, FlushCompress::Sync)
                .map_err(|e| SpdyError::Headers(e.to_string()))?;
            input = &input[(self.deflate.total_in() - before) as usize..];
            // Done once everything went in and the flush left room to spare.
            if input.is_empty() && payload.len() < payload.capacity() {
                break;
            }
        }
        Ok(Self::control(SYN_REPLY, 0, &payload))
    }

    pub fn rst_stream(id: u32, status: u32) -> Bytes {
        let mut p = [0u8; 8];
        p[..4].copy_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
        p[4..].copy_from_slice(&status.to_be_bytes());
        Self::control(RST_STREAM, 0, &p)
    }

    pub fn ping(id: u32) -> Bytes {
        Self::control(PING, 0, &id.to_be_bytes())
    }

    /// DATA frames carrying `data` (split at the frame limit); an empty `data` with `fin` is the
    /// bare FIN.
    pub fn data(id: u32, data: &[u8], fin: bool) -> Vec<Bytes> {
        let chunks: Vec<&[u8]> = if data.is_empty() {
            vec![data]
        } else {
            data.chunks(MAX_DATA).collect()
        };
        let last = chunks.len() - 1;
        chunks
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                let flags = if fin && i == last { FLAG_FIN } else { 0 };
                let mut b = BytesMut::with_capacity(8 + c.len());
                b.put_u32(id & 0x7fff_ffff);
                b.put_u32((u32::from(flags) << 24) | c.len() as u32);
                b.put_slice(c);
                b.freeze()
            })
            .collect()
    }
}

/// What goes out on a connection: the reply to an accepted stream, or a frame ready to go.
#[derive(Debug)]
pub enum Out {
    Reply(u32),
    Frame(Bytes),
}

/// Writes what the returned sender carries to `wr` (replies are header blocks of the
/// connection's one deflate stream, so one task writes them all, in order) until every sender
/// is gone or the peer stops reading, then shuts the write side down.
pub fn spawn_writer<W>(mut wr: W) -> (mpsc::Sender<Out>, JoinHandle<()>)
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Out>(64);
    let task = tokio::spawn(async move {
        let mut w = FrameWriter::default();
        while let Some(o) = rx.recv().await {
            let bytes = match o {
                Out::Reply(id) => match w.syn_reply(id, &[]) {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::debug!(error = %e, "SPDY reply");
                        break;
                    }
                },
                Out::Frame(b) => b,
            };
            if wr.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    (tx, task)
}

/// A SYN_STREAM as a Go client builds it (headers deflated with `deflate`, which has the
/// dictionary preset), for tests of what reads them.
#[cfg(test)]
pub(crate) fn syn_stream(deflate: &mut Compress, id: u32, fin: bool, headers: &[(&str, &str)]) -> Vec<u8> {
    let raw = name_value_block(headers);
    let mut block = Vec::with_capacity(raw.len() + 128);
    deflate
        .compress_vec(&raw, &mut block, FlushCompress::Sync)
        .expect("deflate");
    let mut payload = Vec::new();
    payload.extend_from_slice(&id.to_be_bytes());
    payload.extend_from_slice(&0u32.to_be_bytes());
    payload.extend_from_slice(&[0, 0]);
    payload.extend_from_slice(&block);
    FrameWriter::control(SYN_STREAM, if fin { FLAG_FIN } else { 0 }, &payload).to_vec()
}

/// A client's header compressor: the dictionary preset, as Go's spdystream sets it.
#[cfg(test)]
pub(crate) fn dict_deflate() -> Compress {
    let mut d = Compress::new(Compression::best(), true);
    d.set_dictionary(&dictionary()).expect("dictionary");
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dictionary_is_the_specs() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        // Adler-32 of the SPDY/3 dictionary, as every implementation's zlib header names it.
        let mut deflate = Compress::new(Compression::default(), true);
        let id = deflate.set_dictionary(&d).expect("dictionary");
        assert_eq!(id, 0xe3c6_a7c2, "dictionary id {id:#x}");
    }

    #[tokio::test]
    async fn header_blocks_share_one_zlib_stream_with_the_dictionary() {
        let mut deflate = dict_deflate();
        let mut wire = Vec::new();
        wire.extend(syn_stream(
            &mut deflate,
            1,
            true,
            &[("streamtype", "error"), ("port", "8080"), ("requestid", "0")],
        ));
        wire.extend(FrameWriter::data(3, b"", true).concat());
        wire.extend(syn_stream(
            &mut deflate,
            3,
            false,
            &[
                ("streamtype", "data"),
                ("port", "8080"),
                ("requestid", "0"),
                ("x", "a\0b"),
            ],
        ));
        wire.extend(FrameWriter::ping(1));
        wire.extend(FrameWriter::data(3, b"hello", false).concat());
        let mut r = FrameReader::new(&wire[..]);
        let first = r.next().await.expect("frame").expect("some");
        assert_eq!(
            first,
            Frame::SynStream {
                id: 1,
                fin: true,
                headers: vec![
                    ("streamtype".into(), "error".into()),
                    ("port".into(), "8080".into()),
                    ("requestid".into(), "0".into()),
                ],
            }
        );
        assert_eq!(
            r.next().await.expect("frame"),
            Some(Frame::Data {
                id: 3,
                fin: true,
                data: Bytes::new()
            })
        );
        let Some(Frame::SynStream { id: 3, headers, .. }) = r.next().await.expect("frame") else {
            panic!("second SYN_STREAM");
        };
        assert_eq!(headers.len(), 5, "{headers:?}");
        assert_eq!(headers[3], ("x".into(), "a".into()));
        assert_eq!(headers[4], ("x".into(), "b".into()));
        assert_eq!(r.next().await.expect("frame"), Some(Frame::Ping { id: 1 }));
        assert_eq!(
            r.next().await.expect("frame"),
            Some(Frame::Data {
                id: 3,
                fin: false,
                data: Bytes::from_static(b"hello")
            })
        );
        assert_eq!(r.next().await.expect("eof"), None);
    }

    #[tokio::test]
    async fn replies_inflate_on_the_peers_side() {
        let mut w = FrameWriter::default();
        let mut wire = Vec::new();
        wire.extend(w.syn_reply(1, &[]).expect("reply"));
        wire.extend(w.syn_reply(3, &[("a", "b")]).expect("reply"));
        // Read back as a SYN_REPLY carries: parsed and ignored, the zlib stream kept in step.
        let mut r = FrameReader::new(&wire[..]);
        assert_eq!(r.next().await.expect("frame"), Some(Frame::Ignored));
        assert_eq!(r.next().await.expect("frame"), Some(Frame::Ignored));
        let mut inflate = Decompress::new(true);
        let mut raw = Vec::with_capacity(256);
        let first_len = u32::from_be_bytes([0, wire[5], wire[6], wire[7]]) as usize;
        inflate
            .decompress_vec(&wire[12..8 + first_len], &mut raw, FlushDecompress::Sync)
            .expect("a plain zlib stream, no dictionary needed to read it");
        assert_eq!(raw, 0u32.to_be_bytes());
    }

    #[tokio::test]
    async fn hostile_frames_are_refused() {
        // Over the data limit.
        let mut big = Vec::new();
        big.extend_from_slice(&1u32.to_be_bytes());
        big.extend_from_slice(&0x00ff_ffffu32.to_be_bytes());
        assert!(matches!(
            FrameReader::new(&big[..]).next().await,
            Err(SpdyError::TooLarge { .. })
        ));
        // SPDY/2.
        let v2 = [0x80, 0x02, 0x00, 0x06, 0, 0, 0, 4, 0, 0, 0, 1];
        assert!(matches!(
            FrameReader::new(&v2[..]).next().await,
            Err(SpdyError::Version(2))
        ));
        // A header block that is not zlib.
        let mut junk = vec![0x80, 0x03, 0x00, 0x01, 0, 0, 0, 14];
        junk.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4]);
        assert!(matches!(
            FrameReader::new(&junk[..]).next().await,
            Err(SpdyError::Headers(_))
        ));
        // A deflate bomb: 1 MiB of one header value.
        let mut deflate = dict_deflate();
        let huge = "a".repeat(1 << 20);
        let bomb = syn_stream(&mut deflate, 1, false, &[("x", &huge)]);
        assert!(
            bomb.len() < MAX_CONTROL,
            "the bomb itself is small: {}",
            bomb.len()
        );
        assert!(matches!(
            FrameReader::new(&bomb[..]).next().await,
            Err(SpdyError::Headers(m)) if m.contains("64 KiB")
        ));
        // A frame cut short.
        let cut = [0x80, 0x03, 0x00, 0x06, 0, 0, 0, 4, 0, 0];
        assert!(FrameReader::new(&cut[..]).next().await.is_err());
    }
}
