//! What a connection may hold of a port once it is accepted (and past its TLS handshake): a
//! read that stalls between frames ends the connection after the port's idle timeout, a frame
//! must arrive whole within the port's frame read timeout (a peer that trickles one byte a
//! second cannot keep a frame open for ever), and the frames being received on a port share one
//! byte budget, so that many connections each announcing a frame at the size limit cannot make
//! the replica allocate connections × limit.
//!
//! The guard sits between the byte stream (TCP or TLS) and the port's framing, and follows
//! that framing as the bytes pass ([`Framing`]): for tarpc a frame is a 4-byte big-endian
//! length and that many bytes; for HTTP/2 (the gRPC port), the client's 24-byte preface, then
//! frames of a 9-byte header whose first 3 bytes are the payload's length. It reserves a frame's bytes from the budget when it reads the frame's length,
//! before the framing allocates a buffer for it, and releases them once the frame's last byte
//! is read. Frames of at most [`UNBUDGETED_FRAME_BYTES`] (every vote, heartbeat, status and
//! most appends) are bounded by the connection count instead and never touch the budget.
//!
//! A connection that breaks a rule gets a read error, which ends its channel: only that
//! connection is closed, and the reason is logged by the port.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::wire::tls::Io;

/// Frames up to this size are received without reserving from the port's byte budget.
pub const UNBUDGETED_FRAME_BYTES: usize = 64 << 10;

/// The largest frame a connection may send before it authenticated (`hello` and
/// `authenticate` are a few hundred bytes): a larger one closes it. Connections that never
/// authenticate once announced 2 MiB frames by the hundred and took the port's whole receive
/// budget, and operators' appends failed for want of it. They now take none of it.
pub const UNAUTHENTICATED_FRAME_BYTES_MAX: usize = UNBUDGETED_FRAME_BYTES;

/// The longest frame header of any framing (HTTP/2's).
const HEADER_BYTES_MAX: usize = 9;

/// The HTTP/2 client connection preface (RFC 9113, section 3.4), which precedes its frames.
const HTTP2_PREFACE_BYTES: usize = 24;

/// How a port's connections frame what they send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// tarpc's: a 4-byte big-endian length (tokio-util's `LengthDelimitedCodec` default),
    /// then that many bytes.
    LengthPrefixed,
    /// HTTP/2's: the preface, then a 9-byte header (a 3-byte big-endian payload length, the
    /// type, flags and stream) and the payload.
    Http2,
}

impl Framing {
    fn header_bytes(self) -> usize {
        match self {
            Framing::LengthPrefixed => 4,
            Framing::Http2 => HEADER_BYTES_MAX,
        }
    }

    /// The bytes that follow a header.
    fn body_bytes(self, header: &[u8; HEADER_BYTES_MAX]) -> usize {
        match self {
            Framing::LengthPrefixed => {
                u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize
            }
            Framing::Http2 => u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize,
        }
    }
}

/// What every connection of one port may hold.
#[derive(Clone, Debug)]
pub struct PortLimits {
    /// Connections open at once; one more is closed as soon as it is accepted.
    pub connections_max: usize,
    /// Bytes of frames larger than [`UNBUDGETED_FRAME_BYTES`] being received at once, over all
    /// the port's connections. A frame that does not fit closes its connection.
    pub receiving_bytes_max: usize,
    /// How long a connection may send nothing between frames.
    pub idle_timeout: Duration,
    /// How long one frame may take to arrive, from its first byte to its last.
    pub frame_read_timeout: Duration,
    /// Connections not yet authenticated (handshaking, or not yet shown a credential) held at
    /// once; when full, the oldest of them is closed to make room for a new one, so that
    /// nobody can hold the port by opening connections and never authenticating.
    pub unauthenticated_max: usize,
    /// Of those, how many one source address may hold; one more is closed as it is accepted.
    pub unauthenticated_per_source_max: usize,
}

/// The port-wide state the guards of one port's connections share.
pub struct PortGuard {
    limits: PortLimits,
    framing: Framing,
    receiving: Arc<Semaphore>,
}

impl PortGuard {
    pub fn new(limits: PortLimits, framing: Framing) -> Arc<PortGuard> {
        Arc::new(PortGuard {
            receiving: Arc::new(Semaphore::new(limits.receiving_bytes_max)),
            limits,
            framing,
        })
    }

    /// Wraps an accepted connection's stream in this port's rules; `authenticated` is set
    /// once it has.
    pub fn guard(
        self: &Arc<Self>,
        stream: Box<dyn Io>,
        authenticated: Arc<AtomicBool>,
    ) -> GuardedStream {
        GuardedStream {
            inner: stream,
            port: self.clone(),
            authenticated,
            frame: match self.framing {
                Framing::LengthPrefixed => Frame::header(),
                Framing::Http2 => Frame::Body {
                    remaining: HTTP2_PREFACE_BYTES,
                    _reserved: None,
                },
            },
            frame_started: None,
            deadline: Instant::now() + self.limits.idle_timeout,
            timer: Box::pin(tokio::time::sleep(self.limits.idle_timeout)),
        }
    }
}

/// Where the bytes read so far leave the current frame.
enum Frame {
    /// Reading the frame's header (`read` of its bytes so far).
    Header {
        header: [u8; HEADER_BYTES_MAX],
        read: usize,
    },
    /// Reading the frame's bytes; a large frame holds its reservation from the budget.
    Body {
        remaining: usize,
        _reserved: Option<OwnedSemaphorePermit>,
    },
}

impl Frame {
    fn header() -> Frame {
        Frame::Header {
            header: [0; HEADER_BYTES_MAX],
            read: 0,
        }
    }
}

/// A connection's stream under its port's [`PortLimits`]. Writes pass straight through.
pub struct GuardedStream {
    inner: Box<dyn Io>,
    port: Arc<PortGuard>,
    /// Whether the connection authenticated (frames past
    /// [`UNAUTHENTICATED_FRAME_BYTES_MAX`] are refused until it has).
    authenticated: Arc<AtomicBool>,
    frame: Frame,
    /// When the first byte of the frame being read arrived; `None` between frames.
    frame_started: Option<Instant>,
    /// When the connection is closed unless more arrives: the idle timeout after the last byte
    /// between frames, the frame read timeout after a frame's first byte within one.
    deadline: Instant,
    /// Armed at or before `deadline`: re-armed lazily when it fires early, so that a read
    /// costs a clock read rather than a timer update, and at once when the deadline moves
    /// earlier (a frame starts).
    timer: Pin<Box<Sleep>>,
}

/// Why the guard ended a connection.
fn refusal(kind: io::ErrorKind, message: String) -> io::Error {
    io::Error::new(kind, message)
}

impl GuardedStream {
    /// Follows the framing through `bytes`, just read: reserves each large frame's bytes as
    /// its length arrives, and notes where frames start and end.
    fn follow(&mut self, mut bytes: &[u8], now: Instant) -> io::Result<()> {
        while !bytes.is_empty() {
            match &mut self.frame {
                Frame::Header { header, read } => {
                    self.frame_started.get_or_insert(now);
                    let framing = self.port.framing;
                    let taken = (framing.header_bytes() - *read).min(bytes.len());
                    header[*read..*read + taken].copy_from_slice(&bytes[..taken]);
                    *read += taken;
                    bytes = &bytes[taken..];
                    if *read == framing.header_bytes() {
                        let length = framing.body_bytes(header);
                        self.start_body(length)?;
                    }
                }
                Frame::Body { remaining, .. } => {
                    let taken = (*remaining).min(bytes.len());
                    *remaining -= taken;
                    bytes = &bytes[taken..];
                    if *remaining == 0 {
                        self.end_frame();
                    }
                }
            }
        }
        Ok(())
    }

    fn start_body(&mut self, length: usize) -> io::Result<()> {
        if length == 0 {
            self.end_frame();
            return Ok(());
        }
        if length > UNAUTHENTICATED_FRAME_BYTES_MAX && !self.authenticated.load(Ordering::Acquire) {
            return Err(refusal(
                io::ErrorKind::PermissionDenied,
                format!(
                    "a frame of {length} bytes before the connection authenticated (at most \
                     {UNAUTHENTICATED_FRAME_BYTES_MAX} until it has)"
                ),
            ));
        }
        let reserved = if length > UNBUDGETED_FRAME_BYTES {
            let permits = u32::try_from(length).unwrap_or(u32::MAX);
            let permit = self
                .port
                .receiving
                .clone()
                .try_acquire_many_owned(permits)
                .map_err(|_| {
                    refusal(
                        io::ErrorKind::OutOfMemory,
                        format!(
                            "a frame of {length} bytes does not fit the port's receive budget \
                             ({} bytes over all connections)",
                            self.port.limits.receiving_bytes_max
                        ),
                    )
                })?;
            Some(permit)
        } else {
            None
        };
        self.frame = Frame::Body {
            remaining: length,
            _reserved: reserved,
        };
        Ok(())
    }

    fn end_frame(&mut self) {
        self.frame = Frame::header();
        self.frame_started = None;
    }

    fn next_deadline(&self, now: Instant) -> Instant {
        match self.frame_started {
            Some(started) => started + self.port.limits.frame_read_timeout,
            None => now + self.port.limits.idle_timeout,
        }
    }

    fn timed_out(&self) -> io::Error {
        let limits = &self.port.limits;
        let message = match self.frame_started {
            Some(_) => format!(
                "a frame took longer than the frame read timeout ({:?})",
                limits.frame_read_timeout
            ),
            None => format!(
                "the connection sent nothing for the idle timeout ({:?})",
                limits.idle_timeout
            ),
        };
        refusal(io::ErrorKind::TimedOut, message)
    }

    /// Whether the deadline has passed; re-arms the timer if it fired before the deadline.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> bool {
        while self.timer.as_mut().poll(cx).is_ready() {
            if Instant::now() >= self.deadline {
                return true;
            }
            let deadline = self.deadline;
            self.timer.as_mut().reset(deadline);
        }
        false
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let now = Instant::now();
                let read = &buf.filled()[before..];
                if !read.is_empty() {
                    if this.frame_started.is_some() && now >= this.deadline {
                        return Poll::Ready(Err(this.timed_out()));
                    }
                    this.follow(read, now)?;
                    this.deadline = this.next_deadline(now);
                    if this.deadline < this.timer.deadline() {
                        let deadline = this.deadline;
                        this.timer.as_mut().reset(deadline);
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                if this.poll_expired(cx) {
                    return Poll::Ready(Err(this.timed_out()));
                }
                Poll::Pending
            }
            failed => failed,
        }
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;

    const IDLE: Duration = Duration::from_secs(10);
    const FRAME: Duration = Duration::from_secs(2);

    fn port(receiving_bytes_max: usize) -> Arc<PortGuard> {
        PortGuard::new(
            PortLimits {
                connections_max: 8,
                unauthenticated_max: 8,
                unauthenticated_per_source_max: 8,
                receiving_bytes_max,
                idle_timeout: IDLE,
                frame_read_timeout: FRAME,
            },
            Framing::LengthPrefixed,
        )
    }

    /// An authenticated connection under `port`'s guard, and the other side's end to write to.
    fn connect(port: &Arc<PortGuard>) -> (GuardedStream, DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let authenticated = Arc::new(AtomicBool::new(true));
        (port.guard(Box::new(ours), authenticated), theirs)
    }

    /// Goal: before it authenticated, a connection may send frames up to
    /// `UNAUTHENTICATED_FRAME_BYTES_MAX` and no larger (it is closed, reserving nothing);
    /// once authenticated, a larger frame passes.
    #[tokio::test(start_paused = true)]
    async fn only_small_frames_before_authenticating() {
        let port = port(1 << 20);
        let authenticated = Arc::new(AtomicBool::new(false));
        let (ours, mut theirs) = tokio::io::duplex(1 << 20);
        let mut guarded = port.guard(Box::new(ours), authenticated.clone());
        let small = frame(UNAUTHENTICATED_FRAME_BYTES_MAX);
        theirs.write_all(&small).await.unwrap();
        let mut read = vec![0; small.len()];
        guarded.read_exact(&mut read).await.unwrap();
        theirs
            .write_all(&frame(UNAUTHENTICATED_FRAME_BYTES_MAX + 1))
            .await
            .unwrap();
        let refused = guarded.read(&mut [0; 16]).await.unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::PermissionDenied, "{refused}");
        assert_eq!(
            port.receiving.available_permits(),
            1 << 20,
            "nothing reserved"
        );

        let (ours, mut theirs) = tokio::io::duplex(1 << 20);
        let mut guarded = port.guard(Box::new(ours), authenticated.clone());
        authenticated.store(true, Ordering::Release);
        let large = frame(UNAUTHENTICATED_FRAME_BYTES_MAX + 1);
        theirs.write_all(&large).await.unwrap();
        let mut read = vec![0; large.len()];
        guarded.read_exact(&mut read).await.unwrap();
    }

    fn frame(length: usize) -> Vec<u8> {
        let mut bytes = (length as u32).to_be_bytes().to_vec();
        bytes.resize(Framing::LengthPrefixed.header_bytes() + length, 7);
        bytes
    }

    /// An HTTP/2 frame of `length` payload bytes (a DATA frame on stream 1).
    fn http2_frame(length: usize) -> Vec<u8> {
        let mut bytes = (length as u32).to_be_bytes()[1..].to_vec();
        bytes.extend([0, 0, 0, 0, 0, 1]);
        bytes.resize(HEADER_BYTES_MAX + length, 7);
        bytes
    }

    /// Goal: on an HTTP/2 port the guard passes the preface and follows frames by their
    /// 3-byte length: a frame above `UNAUTHENTICATED_FRAME_BYTES_MAX` before the connection
    /// authenticated closes it (were the preface or the headers misread as tarpc's lengths,
    /// the first read would already fail).
    #[tokio::test(start_paused = true)]
    async fn http2_frames_are_followed_from_after_the_preface() {
        let port = PortGuard::new(port(1 << 20).limits.clone(), Framing::Http2);
        let authenticated = Arc::new(AtomicBool::new(false));
        let (ours, mut theirs) = tokio::io::duplex(1 << 20);
        let mut guarded = port.guard(Box::new(ours), authenticated);
        let mut sent = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        sent.extend(http2_frame(0));
        sent.extend(http2_frame(16 << 10));
        theirs.write_all(&sent).await.unwrap();
        let mut read = vec![0; sent.len()];
        guarded.read_exact(&mut read).await.unwrap();
        theirs
            .write_all(&http2_frame(UNAUTHENTICATED_FRAME_BYTES_MAX + 1))
            .await
            .unwrap();
        let refused = guarded.read(&mut [0; 16]).await.unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::PermissionDenied, "{refused}");
    }

    /// Goal: the guard follows the framing wherever reads split it: frames of every size
    /// (empty, small, above the unbudgeted size) pass in 7-byte pieces, and every reservation
    /// is returned once its frame is read.
    #[tokio::test(start_paused = true)]
    async fn frames_split_anywhere_pass_and_return_their_reservations() {
        let port = port(1 << 20);
        let (mut guarded, mut other) = connect(&port);
        let sizes = [10, 100 << 10, 0, UNBUDGETED_FRAME_BYTES + 1, 3];
        let bytes: Vec<u8> = sizes.iter().flat_map(|&n| frame(n)).collect();
        let total = bytes.len();
        let writer = tokio::spawn(async move {
            for piece in bytes.chunks(7) {
                other.write_all(piece).await.unwrap();
            }
            other
        });
        let mut read = vec![0; total];
        guarded.read_exact(&mut read).await.unwrap();
        let _other = writer.await.unwrap();
        assert!(guarded.frame_started.is_none(), "between frames");
        assert_eq!(port.receiving.available_permits(), 1 << 20);
    }

    /// Goal: a connection that sends nothing is closed after the idle timeout, with an error
    /// that says so.
    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_times_out() {
        let port = port(1 << 20);
        let (mut guarded, mut other) = connect(&port);
        other.write_all(&frame(5)).await.unwrap();
        let mut buf = [0; 64];
        assert_eq!(guarded.read(&mut buf).await.unwrap(), 9);
        let quiet_from = Instant::now();
        let error = guarded.read(&mut buf).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(error.to_string().contains("idle"), "{error}");
        assert_eq!(quiet_from.elapsed(), IDLE);
    }

    /// Goal: a frame must arrive whole within the frame read timeout, however steadily its
    /// bytes trickle in. Steps: a frame of 1,000 bytes announced, then one byte every 500 ms;
    /// the read fails at the frame timeout, long before the last byte.
    #[tokio::test(start_paused = true)]
    async fn a_trickled_frame_times_out_though_bytes_keep_coming() {
        let port = port(1 << 20);
        let (mut guarded, mut other) = connect(&port);
        let started = Instant::now();
        tokio::spawn(async move {
            other.write_all(&1000u32.to_be_bytes()).await?;
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                other.write_all(&[1]).await?;
            }
            #[allow(unreachable_code)]
            io::Result::Ok(())
        });
        let mut buf = [0; 64];
        let error = loop {
            match guarded.read(&mut buf).await {
                Ok(n) => assert!(n > 0, "the writer never stops"),
                Err(error) => break error,
            }
        };
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(error.to_string().contains("frame read timeout"), "{error}");
        assert!(started.elapsed() >= FRAME && started.elapsed() < FRAME + IDLE / 10);
    }

    /// Goal: large frames being received share the port's budget: a frame that does not fit
    /// beside another in progress is refused (its connection's read fails), and fits once
    /// the other has arrived.
    #[tokio::test(start_paused = true)]
    async fn large_frames_share_the_ports_budget() {
        let port = port(200 << 10);
        let mut buf = vec![0; 300 << 10];
        let (mut first, mut first_sender) = connect(&port);
        let large = frame(150 << 10);
        first_sender.write_all(&large[..1000]).await.unwrap();
        assert_eq!(first.read(&mut buf).await.unwrap(), 1000);

        let (mut second, mut second_sender) = connect(&port);
        second_sender
            .write_all(&frame(100 << 10)[..8])
            .await
            .unwrap();
        let error = second.read(&mut buf).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::OutOfMemory);

        first_sender.write_all(&large[1000..]).await.unwrap();
        first
            .read_exact(&mut buf[..large.len() - 1000])
            .await
            .unwrap();
        let (mut third, mut third_sender) = connect(&port);
        third_sender.write_all(&frame(100 << 10)).await.unwrap();
        third.read_exact(&mut buf[..(100 << 10) + 4]).await.unwrap();
        assert_eq!(port.receiving.available_permits(), 200 << 10);
    }
}
