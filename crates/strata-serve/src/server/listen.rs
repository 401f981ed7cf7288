//! The accept loop: HTTP/1.1 connections served by hyper, each with a header timeout
//! and an idle timeout, and at most `max_connections` of them open at once.
//!
//! A connection's timeouts come from [`ConnClock`], a plain state machine: reading a
//! request's head (from the accept, or from the first byte of a later request) is
//! bounded by the header timeout, waiting between requests on a kept-alive connection by
//! the idle timeout, and answering a request (however long its prompt takes to prefill
//! or its stream runs) by nothing. Over the cap, a new connection closes the one that has
//! waited longest without a request in progress, so that a flood of idle or slow clients
//! cannot keep `/health` or anyone else out; when every connection is answering a
//! request, the new one is closed.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, watch};

/// Open descriptors kept for everything but connections: model files, the store, logs,
/// the GPU driver.
const RESERVED_FILES: u64 = 256;

/// How connections are bounded (`--header-timeout`, `--idle-timeout`,
/// `--max-connections`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// Longest a request's head may take to arrive; `None`: no limit.
    pub header_timeout: Option<Duration>,
    /// Longest a kept-alive connection may wait for its next request; `None`: no limit.
    pub idle_timeout: Option<Duration>,
    /// Connections open at once.
    pub max_connections: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            header_timeout: Some(Duration::from_secs(60)),
            idle_timeout: Some(Duration::from_secs(75)),
            max_connections: 4096,
        }
    }
}

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Reading a request's head since `since`: the accept for the first request, the
    /// first byte for a later one.
    Head { since: Instant },
    /// Kept alive between requests since the last response ended.
    Idle { since: Instant },
    /// Answering a request: no timeout applies.
    Busy,
    /// Closed to make room for a new connection.
    Evicted,
}

/// Why a connection was closed by the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    Header,
    Idle,
}

impl Expiry {
    fn message(self) -> &'static str {
        match self {
            Expiry::Header => "the request's head did not arrive within --header-timeout",
            Expiry::Idle => "no request within --idle-timeout",
        }
    }
}

/// One connection's phase, moved by what its reads and its requests do.
#[derive(Clone, Debug)]
pub struct ConnClock {
    phase: Phase,
}

impl ConnClock {
    /// A connection accepted at `now`: its first request's head is due.
    pub fn new(now: Instant) -> Self {
        ConnClock { phase: Phase::Head { since: now } }
    }

    /// Bytes arrived at `now`: on an idle connection they start the next request's head.
    pub fn bytes_read(&mut self, now: Instant) {
        if let Phase::Idle { .. } = self.phase {
            self.phase = Phase::Head { since: now };
        }
    }

    /// A request's head has been read; its answer is under way.
    pub fn request_started(&mut self) {
        if self.phase != Phase::Evicted {
            self.phase = Phase::Busy;
        }
    }

    /// The answer has been sent (or abandoned) at `now`.
    pub fn response_ended(&mut self, now: Instant) {
        if self.phase == Phase::Busy {
            self.phase = Phase::Idle { since: now };
        }
    }

    /// When the connection is to be closed if nothing changes, and why; `None` while a
    /// request is being answered, or when that timeout is off.
    pub fn deadline(&self, limits: &ConnLimits) -> Option<(Instant, Expiry)> {
        match self.phase {
            // A timeout too long to add is none.
            Phase::Head { since } => {
                limits.header_timeout.and_then(|t| since.checked_add(t)).map(|at| (at, Expiry::Header))
            }
            Phase::Idle { since } => {
                limits.idle_timeout.and_then(|t| since.checked_add(t)).map(|at| (at, Expiry::Idle))
            }
            Phase::Busy | Phase::Evicted => None,
        }
    }

    /// Since when the connection has been without a request in progress, if it is.
    pub fn waiting_since(&self) -> Option<Instant> {
        match self.phase {
            Phase::Head { since } | Phase::Idle { since } => Some(since),
            Phase::Busy | Phase::Evicted => None,
        }
    }

    /// Whether the connection has been told to close for room.
    pub fn evicted(&self) -> bool {
        self.phase == Phase::Evicted
    }

    /// Marks the connection closed for room, unless it is answering a request.
    pub fn evict(&mut self) -> bool {
        let waiting = self.waiting_since().is_some();
        if waiting {
            self.phase = Phase::Evicted;
        }
        waiting
    }
}

/// Of `(id, waiting since)` pairs, the connection that has waited longest without a
/// request in progress: the one a new connection over the cap replaces.
pub fn pick_victim(conns: impl IntoIterator<Item = (u64, Option<Instant>)>) -> Option<u64> {
    conns.into_iter().filter_map(|(id, since)| since.map(|s| (s, id))).min().map(|(_, id)| id)
}

/// The connection cap in force: `wanted`, but never more than the open-file limit
/// leaves after [`RESERVED_FILES`] (and at least half the limit).
pub fn connection_cap(wanted: usize, open_files: Option<u64>) -> usize {
    let Some(limit) = open_files else { return wanted.max(1) };
    let room = limit.saturating_sub(RESERVED_FILES).max(limit / 2).max(1);
    wanted.min(usize::try_from(room).unwrap_or(usize::MAX)).max(1)
}

/// Raises the soft limit on open files to the hard one; returns the soft limit in force.
pub fn raise_open_files_limit() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit(2) writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: setrlimit(2) reads the struct; raising the soft limit up to the hard one
        // needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    (lim.rlim_cur != libc::RLIM_INFINITY).then_some(u64::from(lim.rlim_cur))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

type Clock = Arc<Mutex<ConnClock>>;

/// A live connection, as the accept loop sees it.
struct Entry {
    clock: Clock,
    evict: Arc<Notify>,
}

type Table = Arc<Mutex<HashMap<u64, Entry>>>;

/// Serves `router` on `listener` within `limits` until `shutdown` completes; then stops
/// accepting, lets each connection finish the request it is answering, and returns
/// once all are closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(());
    // Each connection's task holds a sender: `recv` ends when the last has gone.
    let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
    let table: Table = Arc::default();
    let mut next_id = 0u64;
    let mut last_refusal: Option<Instant> = None;
    let mut http = hyper::server::conn::http1::Builder::new();
    // The timeouts are ConnClock's; hyper's own header timer would run in idle time too.
    http.header_read_timeout(None);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        if !make_room(&table, limits.max_connections) {
            // Every connection is answering a request: this one is closed unanswered.
            if last_refusal.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    "connection refused: every connection is answering a request (--max-connections)"
                );
                last_refusal = Some(Instant::now());
            }
            continue;
        }
        next_id += 1;
        let clock: Clock = Arc::new(Mutex::new(ConnClock::new(Instant::now())));
        let evict = Arc::new(Notify::new());
        lock(&table).insert(next_id, Entry { clock: clock.clone(), evict: evict.clone() });
        let conn = Conn { id: next_id, clock, evict, table: table.clone() };
        let service = Tracked { inner: TowerToHyperService::new(router.clone()), clock: conn.clock.clone() };
        let io = TimedIo::new(stream, conn.clock.clone(), limits);
        let served = http.serve_connection(TokioIo::new(io), service);
        tokio::spawn(conn.run(served, stop_rx.clone(), alive_tx.clone()));
    }
    drop(listener);
    let _ = stop_tx.send(());
    drop(alive_tx);
    let _ = alive_rx.recv().await;
    Ok(())
}

/// Below the cap, or once the connection waiting longest has been told to close: true.
/// False when every connection is answering a request.
fn make_room(table: &Table, cap: usize) -> bool {
    let table = lock(table);
    if table.len() < cap {
        return true;
    }
    // Connections already told to close are on their way out.
    let clocks: Vec<(u64, ConnClock)> = table.iter().map(|(id, e)| (*id, lock(&e.clock).clone())).collect();
    if clocks.iter().filter(|(_, c)| !c.evicted()).count() < cap {
        return true;
    }
    let Some(victim) = pick_victim(clocks.iter().map(|(id, c)| (*id, c.waiting_since()))) else { return false };
    let Some(entry) = table.get(&victim) else { return false };
    if !lock(&entry.clock).evict() {
        return false;
    }
    entry.evict.notify_one();
    true
}

/// An accept that failed: out of descriptors or memory, wait a little before the next.
async fn accept_failed(e: std::io::Error) {
    match e.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
            tracing::warn!(error = %e, "accepting a connection failed; retrying in 100 ms");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The client went away before the accept (ECONNABORTED, ...).
        _ => tracing::debug!(error = %e, "accepting a connection failed"),
    }
}

/// One connection's task.
struct Conn {
    id: u64,
    clock: Clock,
    evict: Arc<Notify>,
    table: Table,
}

type Served = hyper::server::conn::http1::Connection<TokioIo<TimedIo>, Tracked>;

impl Conn {
    async fn run(self, served: Served, mut stop: watch::Receiver<()>, _alive: mpsc::Sender<()>) {
        tokio::pin!(served);
        let mut draining = false;
        loop {
            tokio::select! {
                done = served.as_mut() => {
                    if let Err(e) = done {
                        tracing::debug!(error = ?e, "connection closed");
                    }
                    break;
                }
                () = self.evict.notified() => {
                    tracing::debug!("connection closed to make room for a new one (--max-connections)");
                    break;
                }
                _ = stop.changed(), if !draining => {
                    draining = true;
                    served.as_mut().graceful_shutdown();
                }
            }
        }
        lock(&self.table).remove(&self.id);
    }
}

/// The router, telling the connection's clock when a request starts and its answer ends.
#[derive(Clone)]
struct Tracked {
    inner: TowerToHyperService<Router>,
    clock: Clock,
}

impl Service<Request<Incoming>> for Tracked {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        lock(&self.clock).request_started();
        // Dropped with the answer's body, or with this future if the client leaves first.
        let answering = Answering(self.clock.clone());
        let answer = self.inner.call(req);
        Box::pin(async move {
            let resp = answer.await?;
            Ok(resp.map(|body| TrackedBody { body, _answering: answering }))
        })
    }
}

/// Ends the connection's request when dropped.
struct Answering(Clock);

impl Drop for Answering {
    fn drop(&mut self) {
        lock(&self.0).response_ended(Instant::now());
    }
}

/// A response body that ends its connection's request when hyper has sent it.
struct TrackedBody {
    body: Body,
    _answering: Answering,
}

impl hyper::body::Body for TrackedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The socket, failing its reads with `TimedOut` once the clock's deadline passes.
struct TimedIo {
    io: TcpStream,
    clock: Clock,
    limits: ConnLimits,
    sleep: Pin<Box<tokio::time::Sleep>>,
    armed: Option<Instant>,
}

impl TimedIo {
    fn new(io: TcpStream, clock: Clock, limits: ConnLimits) -> Self {
        let sleep = Box::pin(tokio::time::sleep(Duration::ZERO));
        TimedIo { io, clock, limits, sleep, armed: None }
    }
}

impl AsyncRead for TimedIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let deadline = lock(&this.clock).deadline(&this.limits);
        if let Some((at, why)) = deadline {
            if this.armed != Some(at) {
                this.sleep.as_mut().reset(tokio::time::Instant::from_std(at));
                this.armed = Some(at);
            }
            if this.sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, why.message())));
            }
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            lock(&this.clock).bytes_read(Instant::now());
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TimedIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn limits() -> ConnLimits {
        ConnLimits { header_timeout: Some(10 * S), idle_timeout: Some(75 * S), max_connections: 4 }
    }

    #[test]
    fn a_head_is_due_from_the_accept_then_the_idle_wait_from_the_answer() {
        let t0 = Instant::now();
        let mut c = ConnClock::new(t0);
        assert_eq!(c.deadline(&limits()), Some((t0 + 10 * S, Expiry::Header)));
        // Bytes of the first head do not restart its clock (a slow client gains nothing).
        c.bytes_read(t0 + 5 * S);
        assert_eq!(c.deadline(&limits()), Some((t0 + 10 * S, Expiry::Header)));
        c.request_started();
        assert_eq!(c.deadline(&limits()), None, "answering a request has no timeout");
        assert_eq!(c.waiting_since(), None);
        c.bytes_read(t0 + 500 * S); // the request's body, however late
        assert_eq!(c.deadline(&limits()), None);
        c.response_ended(t0 + 600 * S);
        assert_eq!(c.deadline(&limits()), Some((t0 + 675 * S, Expiry::Idle)));
        // The next request's first byte starts its head's clock.
        c.bytes_read(t0 + 601 * S);
        assert_eq!(c.deadline(&limits()), Some((t0 + 611 * S, Expiry::Header)));
        c.bytes_read(t0 + 605 * S);
        assert_eq!(c.deadline(&limits()), Some((t0 + 611 * S, Expiry::Header)));
    }

    #[test]
    fn a_timeout_of_none_never_closes() {
        let t0 = Instant::now();
        let off = ConnLimits { header_timeout: None, idle_timeout: None, ..limits() };
        let mut c = ConnClock::new(t0);
        assert_eq!(c.deadline(&off), None);
        c.request_started();
        c.response_ended(t0);
        assert_eq!(c.deadline(&off), None);
        let endless = ConnLimits { idle_timeout: Some(Duration::MAX), ..limits() };
        assert_eq!(c.deadline(&endless), None, "a timeout past the end of time is none");
    }

    #[test]
    fn only_a_connection_without_a_request_in_progress_is_evicted_the_longest_waiting_first() {
        let t0 = Instant::now();
        assert_eq!(pick_victim([(1, Some(t0 + S)), (2, None), (3, Some(t0)), (4, Some(t0 + 2 * S))]), Some(3));
        assert_eq!(pick_victim([(1, None), (2, None)]), None);
        assert_eq!(pick_victim([]), None);
        let mut busy = ConnClock::new(t0);
        busy.request_started();
        assert!(!busy.evict());
        busy.response_ended(t0);
        assert!(busy.evict());
        // An evicted connection stays closed: a request racing the eviction does not revive it.
        busy.request_started();
        assert_eq!(busy.waiting_since(), None);
        assert_eq!(busy.deadline(&limits()), None);
        assert!(!busy.evict());
    }

    #[test]
    fn the_cap_leaves_descriptors_for_everything_else() {
        assert_eq!(connection_cap(4096, Some(1 << 20)), 4096);
        assert_eq!(connection_cap(4096, Some(1024)), 768);
        assert_eq!(connection_cap(4096, Some(300)), 150);
        assert_eq!(connection_cap(64, Some(20_000)), 64);
        assert_eq!(connection_cap(4096, None), 4096);
        assert_eq!(connection_cap(4096, Some(0)), 1);
    }
}
