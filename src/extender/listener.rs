//! Accepting connections and serving HTTP/1.1 on them under limits a hostile client cannot
//! exhaust: a cap on open connections, a deadline for the TLS handshake and for every request
//! head, an idle keep-alive timeout, a maximum connection age, and a cap on the bytes a request
//! head may take. Every listener (verbs over plain HTTP or TLS, probes) is served by [`serve`].
//!
//! This module owns connections, not requests: it never looks at a request's content (bodies
//! are admitted by [`super::admission`], routes by the routers), and it never lets one
//! connection hold up the accept loop (handshakes run in each connection's own task).
//!
//! Why an accept loop of our own rather than `axum::serve` or `axum-server`: neither can cap
//! open connections, tell an idle keep-alive connection from one trickling its request head,
//! or close a connection at a maximum age; `axum::serve` sets no timer (so hyper's header
//! timeout never applies) and `axum-server` turns it off under TLS. hyper's own header timeout
//! also restarts when a connection goes idle, which would make the idle timeout and the header
//! timeout one number; kube-scheduler's keep-alive connections want a long idle timeout (longer
//! than Go's 90 s, so the client always closes first) and a slowloris wants a short head
//! deadline. So each connection tracks its phase ([`Phase`]) and enforces both itself.
//!
//! At the cap a new connection evicts the connection that has waited longest without a request
//! in progress (idle, or still sending its head or its body) rather than being refused: kube-scheduler's
//! connections make progress every scheduling cycle, an attacker's do not, so the scheduler
//! always gets in. Only when every open connection is serving a request is a new one refused.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;

/// The limits of one listener. Every one is a `serve` flag (see `--help`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections at most; at the cap the longest-waiting connection without a request
    /// in progress is closed to make room, and a new one is refused only when none is.
    pub max_connections: usize,
    /// A TLS handshake and each request head must complete within this long of the
    /// connection opening or of its first byte after the previous response.
    pub header_read_timeout: Duration,
    /// A keep-alive connection with no request in progress is closed after this long.
    pub idle_timeout: Duration,
    /// A connection is closed (after its request in progress, if any) at this age, so no
    /// connection outlives a client-CA rotation for longer.
    pub max_connection_age: Duration,
    /// The largest request head (request line and headers) accepted; larger ones get 431.
    pub max_header_bytes: usize,
    /// How long a request in progress may still run once its connection is asked to close
    /// (age, eviction, shutdown) before the connection is cut.
    pub drain_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 512,
            header_read_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(120),
            max_connection_age: Duration::from_secs(600),
            max_header_bytes: 16 * 1024,
            drain_timeout: Duration::from_secs(15),
        }
    }
}

/// hyper's smallest allowed read buffer.
const MIN_BUFFER: usize = 8 * 1024;

impl ConnectionLimits {
    /// Checks the flags' values; the error names the flag (`max_connections_flag` is the
    /// listener's own cap, the rest are shared by every listener).
    pub fn validate(&self, max_connections_flag: &str) -> Result<(), String> {
        let positive = [
            ("--header-read-timeout", self.header_read_timeout),
            ("--idle-timeout", self.idle_timeout),
            ("--max-connection-age", self.max_connection_age),
        ];
        for (flag, value) in positive {
            if value.is_zero() {
                return Err(format!("{flag} must be positive"));
            }
        }
        if self.max_connections == 0 {
            return Err(format!("{max_connections_flag} must be at least 1"));
        }
        if self.max_header_bytes < 1024 {
            return Err(format!(
                "--max-header-bytes must be at least 1024 (got {})",
                self.max_header_bytes
            ));
        }
        Ok(())
    }

    /// The most a connection buffers while reading: the head cap, at least hyper's minimum.
    pub fn read_buffer_bytes(&self) -> usize {
        self.max_header_bytes.max(MIN_BUFFER)
    }
}

/// Where a connection is between requests. Stored in [`Activity::phase`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    /// Waiting for a request head to complete: from the connection's start (and its TLS
    /// handshake), or from the first byte after the previous response. Deadline: the header
    /// read timeout.
    Head = 0,
    /// A request is being served (body read, handler): bounded by the request timeout and the
    /// body admission, not here.
    Busy = 1,
    /// Nothing in progress, no byte of the next request yet. Deadline: the idle timeout.
    Idle = 2,
    /// A request's head is in, its body is still arriving and no handler has it yet (set by
    /// the body admission through [`BodyPhase`]). Deadline: the body read timeout, enforced by
    /// the admission. Evictable like `Head`: nothing was decided for it, and a client that
    /// trickles its body must not hold a place a complete request needs.
    Body = 3,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Head,
            1 => Phase::Busy,
            3 => Phase::Body,
            _ => Phase::Idle,
        }
    }
}

/// A connection's phase, shared by its reader (first byte of a head), its service (request
/// start and end) and its task (deadlines). `since` is when the phase began, in microseconds
/// from the listener's start, so the registry can pick who has waited longest.
struct Activity {
    phase: AtomicU8,
    since_us: AtomicU64,
    changed: Notify,
    epoch: Instant,
}

impl Activity {
    fn new(epoch: Instant) -> Arc<Activity> {
        let a = Arc::new(Activity {
            phase: AtomicU8::new(Phase::Head as u8),
            since_us: AtomicU64::new(0),
            changed: Notify::new(),
            epoch,
        });
        a.since_us.store(a.now_us(), Ordering::Relaxed);
        a
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Acquire))
    }

    fn since(&self) -> Instant {
        self.epoch + Duration::from_micros(self.since_us.load(Ordering::Relaxed))
    }

    /// Restarts the clock of `phase` if the connection is still in it.
    fn restart(&self, phase: Phase) {
        if self.phase() == phase {
            self.since_us.store(self.now_us(), Ordering::Relaxed);
        }
    }

    /// Moves to `to` (from `from` only, when given) and wakes the connection's task.
    fn enter(&self, from: Option<Phase>, to: Phase) {
        let moved = match from {
            Some(from) => self
                .phase
                .compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
                .is_ok(),
            None => self.phase.swap(to as u8, Ordering::AcqRel) != to as u8,
        };
        if moved {
            self.since_us.store(self.now_us(), Ordering::Relaxed);
            self.changed.notify_one();
        }
    }
}

/// Handed to each request (an extension): the body admission marks the time its body is being
/// read ([`Phase::Body`]) so that, at the cap, a connection trickling a body is evicted like one
/// trickling a head, never one whose request a handler is serving.
#[derive(Clone)]
pub(crate) struct BodyPhase(Arc<Activity>);

impl BodyPhase {
    /// The body starts arriving; until [`BodyReading`] is dropped the connection is evictable.
    pub(crate) fn reading(&self) -> BodyReading {
        self.0.enter(Some(Phase::Busy), Phase::Body);
        BodyReading(self.0.clone())
    }
}

/// The body is being read; dropped when it is in (or refused): the request is busy again.
pub(crate) struct BodyReading(Arc<Activity>);

impl Drop for BodyReading {
    fn drop(&mut self) {
        self.0.enter(Some(Phase::Body), Phase::Busy);
    }
}

/// The transport, watched for the first byte of a request head after an idle period.
struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.enter(Some(Phase::Idle), Phase::Head);
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A registered connection, as the eviction choice sees it.
struct Entry {
    activity: Arc<Activity>,
    evict: CancellationToken,
}

/// The open connections of one listener.
#[derive(Default)]
struct Registry {
    next_id: u64,
    open: HashMap<u64, Entry>,
}

impl Registry {
    /// Admits a connection, evicting the longest-waiting one without a request in progress
    /// when at the cap. `None`: at the cap and every connection is serving a request.
    fn admit(&mut self, cap: usize, activity: Arc<Activity>) -> Option<(u64, CancellationToken)> {
        // Connections already told to go are on their way out and no longer count, unless
        // a request started on one after it was chosen (its head completed in the same
        // instant): it finishes that request first, so it still holds a place.
        let live = self
            .open
            .values()
            .filter(|e| !e.evict.is_cancelled() || e.activity.phase() == Phase::Busy)
            .count();
        if live >= cap {
            // Two phases can begin in the same microsecond (a keep-alive connection going idle
            // as a new one's head arrives, on a fast loopback): the older connection goes
            // first, so the choice never depends on the map's order.
            let (_, victim) = self
                .open
                .iter()
                .filter(|(_, e)| !e.evict.is_cancelled() && e.activity.phase() != Phase::Busy)
                .min_by_key(|(id, e)| (e.activity.since_us.load(Ordering::Relaxed), **id))?;
            victim.evict.cancel();
        }
        let id = self.next_id;
        self.next_id += 1;
        let evict = CancellationToken::new();
        self.open.insert(
            id,
            Entry {
                activity,
                evict: evict.clone(),
            },
        );
        Some((id, evict))
    }
}

/// What a listener serves with: the router, its name in metrics, and TLS when configured.
pub struct Listener {
    /// `verbs` or `probes`: the `listener` label of the connection metrics.
    pub name: &'static str,
    pub router: Router,
    pub limits: ConnectionLimits,
    /// The live TLS configuration (swapped on certificate rotation), or plain HTTP.
    pub tls: Option<super::tls::LiveConfig>,
}

/// Accepts and serves connections until `shutdown`; then stops accepting, asks every
/// connection to close after its request in progress, and returns when all are closed (or
/// cut after the drain timeout).
pub async fn serve(
    tcp: TcpListener,
    listener: Listener,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let listener = Arc::new(listener);
    let registry = Arc::new(Mutex::new(Registry::default()));
    let tasks = TaskTracker::new();
    let epoch = Instant::now();
    let name = listener.name;
    let open = metrics.connections_open.with_label_values(&[name]);
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = tcp.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: not fatal; back off briefly so a
                    // storm of failures does not spin.
                    tracing::warn!(listener = name, error = %e, "accept failed");
                    metrics.connections_rejected.with_label_values(&[name, "accept_error"]).inc();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let activity = Activity::new(epoch);
        let admitted = registry
            .lock()
            .admit(listener.limits.max_connections, activity.clone());
        let Some((id, evict)) = admitted else {
            metrics
                .connections_rejected
                .with_label_values(&[name, "max_connections"])
                .inc();
            tracing::debug!(listener = name, %peer, "refused a connection: every open connection is serving a request");
            drop(stream);
            continue;
        };
        metrics
            .connections_accepted
            .with_label_values(&[name])
            .inc();
        open.inc();
        let conn = Connection {
            listener: listener.clone(),
            metrics: metrics.clone(),
            activity,
            evict,
            shutdown: shutdown.clone(),
            peer,
        };
        let (registry, open) = (registry.clone(), open.clone());
        tasks.spawn(async move {
            conn.run(stream).await;
            registry.lock().open.remove(&id);
            open.dec();
        });
    }
    drop(tcp);
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// One accepted connection and what ends it.
struct Connection {
    listener: Arc<Listener>,
    metrics: Metrics,
    activity: Arc<Activity>,
    evict: CancellationToken,
    shutdown: CancellationToken,
    peer: SocketAddr,
}

impl Connection {
    fn rejected(&self, reason: &str) {
        self.metrics
            .connections_rejected
            .with_label_values(&[self.listener.name, reason])
            .inc();
    }

    fn closed(&self, reason: &str) {
        self.metrics
            .connections_closed
            .with_label_values(&[self.listener.name, reason])
            .inc();
    }

    async fn run(self, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let limits = &self.listener.limits;
        let opened = Instant::now();
        // The head's deadline runs from now, when this task first runs, not from the accept:
        // a server starved between the two (a CPU-throttled pod, a bootstrap hogging the
        // runtime) must not blame the client for its own delay.
        self.activity.restart(Phase::Head);
        match self.listener.tls.as_ref() {
            None => self.http(stream, opened).await,
            Some(tls) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
                // The handshake shares the head's deadline, and yields to eviction and shutdown.
                let handshake =
                    tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream));
                let outcome = tokio::select! {
                    r = handshake => r,
                    _ = self.evict.cancelled() => { self.rejected("evicted"); return; }
                    _ = self.shutdown.cancelled() => { self.closed("shutdown"); return; }
                };
                match outcome {
                    Ok(Ok(stream)) => self.http(stream, opened).await,
                    Ok(Err(e)) => {
                        self.rejected("tls_handshake");
                        super::tls::record_handshake_failure(&self.metrics, Some(&self.peer), &e);
                    }
                    Err(_) => {
                        self.rejected("tls_handshake");
                        let e = io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out");
                        super::tls::record_handshake_failure(&self.metrics, Some(&self.peer), &e);
                    }
                }
            }
        }
    }

    async fn http<S>(&self, stream: S, opened: Instant)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let limits = &self.listener.limits;
        let io = TokioIo::new(Watched {
            inner: stream,
            activity: self.activity.clone(),
        });
        let service = {
            let router = self.listener.router.clone();
            let activity = self.activity.clone();
            hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
                activity.enter(None, Phase::Busy);
                request.extensions_mut().insert(BodyPhase(activity.clone()));
                let router = router.clone();
                let activity = activity.clone();
                async move {
                    let response =
                        tower::ServiceExt::oneshot(router, request.map(axum::body::Body::new))
                            .await;
                    // The response is handed to hyper to write; a slow reader is bounded by
                    // the idle timeout and the drain that follows it.
                    activity.enter(Some(Phase::Busy), Phase::Idle);
                    response
                }
            })
        };
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .keep_alive(true)
            // Deadlines are enforced below, per phase (see the module docs).
            .header_read_timeout(None)
            .max_header_size(limits.max_header_bytes)
            .max_buf_size(limits.read_buffer_bytes());
        let conn = builder.serve_connection(io, service);
        tokio::pin!(conn);

        let age_limit = opened + limits.max_connection_age;
        // Set once the connection was asked to close: when it is cut regardless.
        let mut cut_at: Option<Instant> = None;
        loop {
            let phase = self.activity.phase();
            let deadline = match phase {
                Phase::Head => Some(self.activity.since() + limits.header_read_timeout),
                Phase::Idle => Some(self.activity.since() + limits.idle_timeout),
                Phase::Busy | Phase::Body => None,
            };
            let closing = cut_at.is_some();
            tokio::select! {
                // The connection first: after a stall, a request that arrived meanwhile is
                // read (and its phase moves on) before an expired deadline is looked at.
                biased;
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        if e.is_parse_too_large() {
                            self.rejected("header_too_large");
                        } else {
                            tracing::debug!(listener = self.listener.name, peer = %self.peer, error = %e, "connection ended with an error");
                        }
                    }
                    return;
                }
                _ = self.activity.changed.notified() => {}
                _ = tokio::time::sleep_until(deadline.unwrap_or(age_limit)), if deadline.is_some() && !closing => {
                    // Only if the phase is still the one the deadline was for.
                    if self.activity.phase() != phase {
                        continue;
                    }
                    if phase == Phase::Head {
                        self.rejected("header_timeout");
                        return;
                    }
                    self.closed("idle_timeout");
                    conn.as_mut().graceful_shutdown();
                    cut_at = Some(Instant::now() + limits.drain_timeout);
                }
                _ = tokio::time::sleep_until(age_limit), if !closing => {
                    self.closed("max_age");
                    if self.cut_now() { return; }
                    conn.as_mut().graceful_shutdown();
                    cut_at = Some(Instant::now() + limits.drain_timeout);
                }
                _ = self.evict.cancelled(), if !closing => {
                    self.rejected("evicted");
                    if self.cut_now() { return; }
                    conn.as_mut().graceful_shutdown();
                    cut_at = Some(Instant::now() + limits.drain_timeout);
                }
                _ = self.shutdown.cancelled(), if !closing => {
                    self.closed("shutdown");
                    if self.cut_now() { return; }
                    conn.as_mut().graceful_shutdown();
                    cut_at = Some(Instant::now() + limits.drain_timeout);
                }
                _ = tokio::time::sleep_until(cut_at.unwrap_or(age_limit)), if closing => {
                    tracing::debug!(listener = self.listener.name, peer = %self.peer, "cut a connection that did not close within the drain timeout");
                    return;
                }
            }
        }
    }

    /// Whether a connection asked to close (age, eviction, shutdown) is cut at once: one still
    /// sending a head or a body has no response in flight. Otherwise hyper closes it after the
    /// response in progress, or at once when idle.
    fn cut_now(&self) -> bool {
        matches!(self.activity.phase(), Phase::Head | Phase::Body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(epoch: Instant, phase: Phase, since_us: u64) -> Arc<Activity> {
        let a = Activity::new(epoch);
        a.phase.store(phase as u8, Ordering::Relaxed);
        a.since_us.store(since_us, Ordering::Relaxed);
        a
    }

    #[test]
    fn at_the_cap_the_longest_waiting_connection_without_a_request_is_evicted() {
        let epoch = Instant::now();
        let mut r = Registry::default();
        let (_, scheduler) = r.admit(3, entry(epoch, Phase::Idle, 500)).unwrap();
        let (_, slow_head) = r.admit(3, entry(epoch, Phase::Head, 100)).unwrap();
        let (_, busy) = r.admit(3, entry(epoch, Phase::Busy, 0)).unwrap();
        assert!(!scheduler.is_cancelled() && !slow_head.is_cancelled());

        // The fourth evicts the head that has waited longest; a busy one never goes.
        let (_, fourth) = r.admit(3, entry(epoch, Phase::Head, 900)).unwrap();
        assert!(slow_head.is_cancelled());
        assert!(!scheduler.is_cancelled() && !busy.is_cancelled() && !fourth.is_cancelled());

        // An evicted connection no longer counts while it closes: the next evicts the idle one.
        r.admit(3, entry(epoch, Phase::Busy, 1000)).unwrap();
        assert!(scheduler.is_cancelled());
    }

    /// Phases that began in the same microsecond: the connection admitted first goes, whatever
    /// the map's order (the integration test `at_the_cap_connections_trickling_a_body_…` once
    /// lost a trickling body instead of the harness's idle keep-alive connection this way).
    #[test]
    fn a_tie_on_when_the_phase_began_evicts_the_older_connection() {
        let epoch = Instant::now();
        for _ in 0..64 {
            let mut r = Registry::default();
            let (_, idle) = r.admit(3, entry(epoch, Phase::Idle, 7)).unwrap();
            let later: Vec<_> = (0..2)
                .map(|_| r.admit(3, entry(epoch, Phase::Body, 7)).unwrap().1)
                .collect();
            r.admit(3, entry(epoch, Phase::Body, 7)).unwrap();
            assert!(idle.is_cancelled());
            assert!(later.iter().all(|t| !t.is_cancelled()));
        }
    }

    /// Issue 36 §2: a connection still sending its body is evictable like one sending its head
    /// (by when its body began), a busy one never.
    #[test]
    fn a_connection_trickling_its_body_is_evicted_before_a_busy_one() {
        let epoch = Instant::now();
        let mut r = Registry::default();
        let (_, busy) = r.admit(2, entry(epoch, Phase::Busy, 0)).unwrap();
        let (_, body) = r.admit(2, entry(epoch, Phase::Body, 100)).unwrap();
        let (_, third) = r.admit(2, entry(epoch, Phase::Head, 900)).unwrap();
        assert!(body.is_cancelled() && !busy.is_cancelled() && !third.is_cancelled());
        // Every live connection busy: refused.
        let mut full = Registry::default();
        full.admit(1, entry(epoch, Phase::Busy, 0)).unwrap();
        assert!(full.admit(1, entry(epoch, Phase::Head, 5)).is_none());
    }

    /// A connection chosen for eviction while its head was still arriving, whose request then
    /// started, serves that request before it closes: it keeps its place until then, so the
    /// cap holds (a test under load once saw a fifth connection served at a cap of four).
    #[test]
    fn an_evicted_connection_serving_a_request_still_counts() {
        let epoch = Instant::now();
        let mut r = Registry::default();
        let head = entry(epoch, Phase::Head, 0);
        let (_, evicted) = r.admit(3, head.clone()).unwrap();
        let (idle, _) = r.admit(3, entry(epoch, Phase::Idle, 5)).unwrap();
        r.admit(3, entry(epoch, Phase::Busy, 10)).unwrap();
        r.admit(3, entry(epoch, Phase::Busy, 20)).unwrap();
        assert!(evicted.is_cancelled(), "the head that waited longest goes");
        // The idle one's client leaves; the evicted one's request started after the choice.
        r.open.remove(&idle);
        head.phase.store(Phase::Busy as u8, Ordering::Relaxed);
        assert!(
            r.admit(3, entry(epoch, Phase::Idle, 30)).is_none(),
            "three requests in progress at a cap of three"
        );
        // Its request done (idle, on its way out), it no longer counts.
        head.phase.store(Phase::Idle as u8, Ordering::Relaxed);
        assert!(r.admit(3, entry(epoch, Phase::Idle, 40)).is_some());
    }

    #[test]
    fn when_every_connection_is_serving_a_request_a_new_one_is_refused() {
        let epoch = Instant::now();
        let mut r = Registry::default();
        for _ in 0..2 {
            r.admit(2, entry(epoch, Phase::Busy, 0)).unwrap();
        }
        assert!(r.admit(2, entry(epoch, Phase::Idle, 0)).is_none());
        assert_eq!(r.open.len(), 2, "a refused connection is not registered");
    }

    #[test]
    fn limits_name_the_flag_they_reject() {
        let bad = ConnectionLimits {
            idle_timeout: Duration::ZERO,
            ..Default::default()
        };
        assert_eq!(
            bad.validate("--max-connections").unwrap_err(),
            "--idle-timeout must be positive"
        );
        let bad = ConnectionLimits {
            max_header_bytes: 10,
            ..Default::default()
        };
        assert!(
            bad.validate("--max-connections")
                .unwrap_err()
                .contains("--max-header-bytes")
        );
        let bad = ConnectionLimits {
            max_connections: 0,
            ..Default::default()
        };
        assert_eq!(
            bad.validate("--probe-max-connections").unwrap_err(),
            "--probe-max-connections must be at least 1"
        );
        assert!(
            ConnectionLimits::default()
                .validate("--max-connections")
                .is_ok()
        );
        assert_eq!(ConnectionLimits::default().read_buffer_bytes(), 16 * 1024);
    }
}
