//! The replication stream in CopyBoth mode, and the standby status updates
//! that keep the slot (and the connection) alive.
//!
//! One I/O task owns the socket. It reads XLogData and keepalives and hands
//! them to the consumer over a channel bounded both in batches and in
//! bytes, and it sends standby status updates on a timer, at once when a
//! keepalive asks for one, and on request. Because the timer lives in that
//! task and not in the consumer's `recv` calls, status updates keep flowing
//! while the consumer is slow (e.g. waiting for Kafka): otherwise
//! `wal_sender_timeout` would kill the connection exactly when the sink is
//! struggling.
//!
//! Messages cross the channel in batches: everything one socket read
//! brought in (up to [`MAX_BATCH_MESSAGES`] and an eighth of the byte
//! budget). The walsender sends one CopyData per change, three for a
//! one-event transaction (BEGIN, the event, COMMIT); handing them over one
//! by one cost two task wake-ups each, a large part of the relay's CPU.
//! A batch never waits for more data: a lone message goes at once.
//!
//! ```text
//!                    ┌──────────────── I/O task ─────────────────┐
//!  socket ─frames─▶  │ Reading ─batch─▶ Delivering ──channel──▶  │ ─▶ recv()
//!                    │    ▲  (keepalive reply? ─▶ status now)  │  │
//!                    │    └───────────── delivered ◀───────────┘  │
//!                    │ timer tick / SendNow / Stop ─▶ status update│ ◀─ confirm(lsn)
//!                    └───────────────────────────────────────────┘
//! ```
//!
//! The two boxes are the task's states (`IoState::Reading` and
//! `IoState::Delivering`).
//!
//! Backpressure: while a batch waits in `Delivering` (the channel or its
//! byte budget is full), the task does not read the socket; the kernel
//! buffers fill and TCP flow control stops the walsender. A batch keeps
//! its share of the budget until the consumer has taken its last message,
//! so memory stays bounded by the byte budget plus one message (a single
//! message larger than the budget passes alone).
//!
//! Positions: the stream never confirms anything by itself. It reports
//! `max(initial_flush, highest confirm())` as write, flush and apply. The
//! consumer calls [`StatusHandle::confirm`] only with positions whose
//! events are safely delivered (for walrelay: acknowledged by Kafka).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::BytesMut;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::mpsc::OwnedPermit;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tracing::{debug, info_span, trace, warn, Instrument};
use walrelay_pgoutput::Lsn;

use crate::backend::{self, BackendMessage};
use crate::error::Error;
use crate::framing::{FrameReader, RawFrame};
use crate::tls::Stream;
use crate::xlog::{self, ReplicationMessage, StandbyStatus};

mod options;
pub use options::{StreamOptions, StreamStats};

/// State shared by the I/O task and the handles.
#[derive(Debug)]
struct Shared {
    /// Highest position the consumer confirmed.
    confirmed: AtomicU64,
    /// Flush position in the last status update sent.
    reported: AtomicU64,
    status_updates: AtomicU64,
    keepalives: AtomicU64,
}

enum Control {
    /// Send a status update now; answer when it is written.
    SendNow(oneshot::Sender<Result<(), Error>>),
    /// Send a last status update, end CopyBoth and close the connection.
    Stop(oneshot::Sender<Result<(), Error>>),
}

/// Most messages handed over in one batch.
pub const MAX_BATCH_MESSAGES: usize = 512;

/// Messages handed to the consumer in one go, holding their share of the
/// byte budget until the consumer has taken the last of them.
type Handover = (
    Result<Vec<ReplicationMessage>, Error>,
    Option<OwnedSemaphorePermit>,
);

/// Messages read but not yet handed over.
#[derive(Default)]
struct Batch {
    messages: Vec<ReplicationMessage>,
    /// XLogData payload bytes: what the byte budget counts.
    bytes: usize,
}

impl Batch {
    fn push(&mut self, msg: ReplicationMessage) {
        if let ReplicationMessage::XLogData(x) = &msg {
            self.bytes += x.data.len();
        }
        self.messages.push(msg);
    }
}

/// Reports positions to the server. Cheap to clone; usable from any task.
#[derive(Debug, Clone)]
pub struct StatusHandle {
    shared: Arc<Shared>,
    control: mpsc::Sender<Control>,
}

impl StatusHandle {
    /// Mark everything before `lsn` as safely processed. Monotonic: a lower
    /// value than one confirmed before is ignored. Takes effect with the
    /// next status update (timer, keepalive reply, or [`Self::send_now`]).
    pub fn confirm(&self, lsn: Lsn) {
        self.shared.confirmed.fetch_max(lsn.0, Ordering::AcqRel);
    }

    /// Send a status update now and wait until it is written to the socket.
    pub async fn send_now(&self) -> Result<(), Error> {
        let (tx, rx) = oneshot::channel();
        self.control
            .send(Control::SendNow(tx))
            .await
            .map_err(|_| Error::StreamStopped)?;
        rx.await.map_err(|_| Error::StreamStopped)?
    }

    pub fn stats(&self) -> StreamStats {
        StreamStats {
            confirmed: Lsn(self.shared.confirmed.load(Ordering::Acquire)),
            reported: Lsn(self.shared.reported.load(Ordering::Acquire)),
            status_updates_sent: self.shared.status_updates.load(Ordering::Acquire),
            keepalives_received: self.shared.keepalives.load(Ordering::Acquire),
        }
    }
}

/// The consumer's end of a running replication stream.
#[derive(Debug)]
pub struct ReplicationStream {
    events: mpsc::Receiver<Handover>,
    /// The rest of the batch received last, and its share of the byte
    /// budget, released when the batch is used up.
    current: std::vec::IntoIter<ReplicationMessage>,
    current_budget: Option<OwnedSemaphorePermit>,
    handle: StatusHandle,
    task: Option<JoinHandle<()>>,
}

impl ReplicationStream {
    pub(crate) fn spawn(
        reader: FrameReader<ReadHalf<Stream>>,
        writer: WriteHalf<Stream>,
        peer: String,
        slot: String,
        options: StreamOptions,
    ) -> ReplicationStream {
        let shared = Arc::new(Shared {
            confirmed: AtomicU64::new(options.initial_flush.0),
            reported: AtomicU64::new(0),
            status_updates: AtomicU64::new(0),
            keepalives: AtomicU64::new(0),
        });
        let (events_tx, events) = mpsc::channel(options.channel_capacity.max(1));
        let (control_tx, control_rx) = mpsc::channel(8);
        let io = IoTask {
            reader,
            writer,
            out: BytesMut::with_capacity(64),
            shared: shared.clone(),
            events: events_tx,
            budget: Arc::new(Semaphore::new(options.channel_bytes.max(1))),
            channel_bytes: options.channel_bytes.max(1),
            control: control_rx,
            options,
        };
        let span = info_span!("replication", %peer, %slot);
        let task = tokio::spawn(io.run().instrument(span));
        ReplicationStream {
            events,
            current: Vec::new().into_iter(),
            current_budget: None,
            handle: StatusHandle {
                shared,
                control: control_tx,
            },
            task: Some(task),
        }
    }

    /// The next message. `None` once the stream has ended (after an error
    /// was returned, or after [`Self::stop`]). Cancel-safe.
    pub async fn recv(&mut self) -> Option<Result<ReplicationMessage, Error>> {
        loop {
            if let Some(msg) = self.current.next() {
                return Some(Ok(msg));
            }
            self.current_budget = None;
            // The only await: cancelling here loses nothing.
            let (batch, budget) = self.events.recv().await?;
            match batch {
                Ok(messages) => {
                    self.current = messages.into_iter();
                    self.current_budget = budget;
                }
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// A handle to confirm positions and request status updates.
    pub fn status_handle(&self) -> StatusHandle {
        self.handle.clone()
    }

    /// Shorthand for [`StatusHandle::confirm`].
    pub fn confirm(&self, lsn: Lsn) {
        self.handle.confirm(lsn)
    }

    pub fn stats(&self) -> StreamStats {
        self.handle.stats()
    }

    /// Stop streaming: send a last status update with the confirmed
    /// position, end CopyBoth, and close the connection. Messages not yet
    /// received are dropped; they were not confirmed, so the server sends
    /// them again next time. Afterwards [`Self::recv`] returns `None`;
    /// calling `stop` again does nothing.
    pub async fn stop(&mut self) -> Result<(), Error> {
        if self.task.is_none() {
            return Ok(());
        }
        let (tx, rx) = oneshot::channel();
        let sent = self.handle.control.send(Control::Stop(tx)).await;
        // Unblock the I/O task if it waits to deliver.
        self.events.close();
        while self.events.try_recv().is_ok() {}
        self.current = Vec::new().into_iter();
        self.current_budget = None;
        let result = match sent {
            Ok(()) => rx.await.unwrap_or(Err(Error::StreamStopped)),
            Err(_) => Err(Error::StreamStopped),
        };
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        result
    }
}

impl Drop for ReplicationStream {
    fn drop(&mut self) {
        // Dropping without stop(): abort at once; nothing unconfirmed is
        // reported, so nothing is lost.
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

struct IoTask {
    reader: FrameReader<ReadHalf<Stream>>,
    writer: WriteHalf<Stream>,
    out: BytesMut,
    shared: Arc<Shared>,
    events: mpsc::Sender<Handover>,
    budget: Arc<Semaphore>,
    channel_bytes: usize,
    control: mpsc::Receiver<Control>,
    options: StreamOptions,
}

/// Batches stop growing at this share of the byte budget, so that one
/// batch never holds the whole budget while the consumer works through it.
const BATCH_BUDGET_SHARE: usize = 8;

impl IoTask {
    async fn run(mut self) {
        if let Err(e) = self.run_inner().await {
            debug!(error = %e, "replication stream ended with an error");
            // The consumer may be gone already; nothing else to do.
            let _ = self.events.send((Err(e), None)).await;
        }
    }

    async fn run_inner(&mut self) -> Result<(), Error> {
        let mut ticker = tokio::time::interval(self.options.status_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut state = IoState::Reading;
        loop {
            // The select only decides what happened; the work is done
            // below, after every branch future (and its borrows) is gone.
            let action = tokio::select! {
                // Control first: a stop request must not starve behind a
                // busy stream.
                biased;
                ctrl = self.control.recv() => Action::Control(ctrl),
                _ = ticker.tick() => Action::Tick,
                r = room_for(&self.events, &self.budget, self.channel_bytes, state.batch()), if state.is_delivering() => {
                    Action::Room(r)
                }
                frame = self.reader.read_frame(), if !state.is_delivering() => Action::Frame(frame),
            };
            match action {
                Action::Control(Some(Control::SendNow(reply))) => {
                    let r = self.send_status().await;
                    let failed = r.as_ref().err().map(ToString::to_string);
                    let _ = reply.send(r);
                    if let Some(e) = failed {
                        return Err(Error::Protocol(format!(
                            "sending a status update failed: {e}"
                        )));
                    }
                }
                Action::Control(Some(Control::Stop(reply))) => {
                    let _ = reply.send(self.shutdown().await);
                    return Ok(());
                }
                // Every handle and the stream itself are gone.
                Action::Control(None) => return Ok(()),
                Action::Tick => self.send_status().await?,
                Action::Room(r) => {
                    let (slot, budget) = match r {
                        Ok(room) => room,
                        Err(e) => return self.serve_queued_stop(e).await,
                    };
                    let IoState::Delivering { batch, then } =
                        std::mem::replace(&mut state, IoState::Reading)
                    else {
                        unreachable!("room is only awaited while delivering a batch")
                    };
                    slot.send((Ok(batch.messages), budget));
                    if let Some(e) = then {
                        return Err(e);
                    }
                }
                Action::Frame(frame) => {
                    let frame = frame?.ok_or(Error::Closed(Some("streaming")))?;
                    let mut batch = Batch::default();
                    if let Some(msg) = self.on_frame(frame).await? {
                        batch.push(msg);
                    }
                    let then = self.fill(&mut batch).await.err();
                    if batch.messages.is_empty() {
                        if let Some(e) = then {
                            return Err(e);
                        }
                    } else {
                        state = IoState::Delivering { batch, then };
                    }
                }
            }
        }
    }

    /// The consumer closed the event channel while a batch waited for
    /// room. [`ReplicationStream::stop`] does that right after queueing
    /// its request, from another thread, so one select can poll the
    /// control channel just before the request arrives and the event
    /// channel just after it was closed (CI saw `stop` fail with
    /// `StreamStopped` that way, the last status update never sent). A
    /// request queued before the close is therefore served here (a stop
    /// ends the stream cleanly); without one, `closed` stands.
    async fn serve_queued_stop(&mut self, closed: Error) -> Result<(), Error> {
        while let Ok(ctrl) = self.control.try_recv() {
            match ctrl {
                Control::SendNow(reply) => {
                    let _ = reply.send(self.send_status().await);
                }
                Control::Stop(reply) => {
                    let _ = reply.send(self.shutdown().await);
                    return Ok(());
                }
            }
        }
        Err(closed)
    }

    /// Add the frames already buffered to `batch`, without reading the
    /// socket, up to the batch limits.
    async fn fill(&mut self, batch: &mut Batch) -> Result<(), Error> {
        let max_bytes = (self.channel_bytes / BATCH_BUDGET_SHARE).max(1);
        while batch.messages.len() < MAX_BATCH_MESSAGES && batch.bytes < max_bytes {
            let Some(frame) = self.reader.try_frame()? else {
                break;
            };
            if let Some(msg) = self.on_frame(frame).await? {
                batch.push(msg);
            }
        }
        Ok(())
    }

    /// Interpret one frame; answer a keepalive that asks for a reply.
    async fn on_frame(&mut self, frame: RawFrame) -> Result<Option<ReplicationMessage>, Error> {
        match backend::parse(frame)? {
            BackendMessage::CopyData(body) => {
                let msg = xlog::parse(body)?;
                if let ReplicationMessage::Keepalive(k) = &msg {
                    self.shared.keepalives.fetch_add(1, Ordering::Relaxed);
                    trace!(wal_end = %k.wal_end, reply = k.reply_requested, "keepalive");
                    if k.reply_requested {
                        self.send_status().await?;
                    }
                }
                Ok(Some(msg))
            }
            BackendMessage::ErrorResponse(e) => Err(Error::server("streaming from the slot", e)),
            BackendMessage::NoticeResponse(n) => {
                warn!(code = %n.code, "server notice: {}", n.message);
                Ok(None)
            }
            BackendMessage::ParameterStatus { .. } => Ok(None),
            // The server ends the copy when it shuts down cleanly: a
            // walsender told to stop sends CommandComplete "COPY 0" (without
            // a CopyDone first), and may send CopyDone. Either is the server
            // going away, not a broken protocol: a transient end.
            BackendMessage::CopyDone => Err(Error::StreamEndedByServer {
                by: "CopyDone".into(),
            }),
            BackendMessage::CommandComplete { tag } => Err(Error::StreamEndedByServer {
                by: format!("CommandComplete {tag:?}"),
            }),
            other => Err(other.unexpected("streaming")),
        }
    }

    /// Write a standby status update with the confirmed position.
    async fn send_status(&mut self) -> Result<(), Error> {
        let pos = Lsn(self.shared.confirmed.load(Ordering::Acquire));
        let status = StandbyStatus {
            write: pos,
            flush: pos,
            apply: pos,
        };
        self.out.clear();
        xlog::encode_status_update(status, SystemTime::now(), false, &mut self.out);
        self.writer
            .write_all(&self.out)
            .await
            .map_err(Error::io("sending a standby status update"))?;
        self.writer
            .flush()
            .await
            .map_err(Error::io("sending a standby status update"))?;
        self.shared.reported.store(pos.0, Ordering::Release);
        self.shared.status_updates.fetch_add(1, Ordering::Relaxed);
        trace!(flush = %pos, "status update sent");
        Ok(())
    }

    /// Last status update, CopyDone, then wait for the server to finish
    /// (its CopyDone, CommandComplete, ReadyForQuery) and terminate.
    async fn shutdown(&mut self) -> Result<(), Error> {
        self.send_status().await?;
        self.out.clear();
        frontend::copy_done(&mut self.out);
        self.writer
            .write_all(&self.out)
            .await
            .map_err(Error::io("ending replication"))?;
        self.writer
            .flush()
            .await
            .map_err(Error::io("ending replication"))?;
        let drain = async {
            loop {
                let Some(frame) = self.reader.read_frame().await? else {
                    return Ok::<_, Error>(());
                };
                match backend::parse(frame)? {
                    BackendMessage::ReadyForQuery { .. } => return Ok(()),
                    BackendMessage::ErrorResponse(e) => {
                        return Err(Error::server("ending replication", e))
                    }
                    // In-flight WAL data and the server's CopyDone and
                    // CommandComplete: nothing to keep.
                    _ => {}
                }
            }
        };
        // A server that never answers must not hang the shutdown forever.
        match tokio::time::timeout(Duration::from_secs(10), drain).await {
            Ok(r) => r?,
            Err(_) => warn!(
                "the server did not finish the replication stream within 10 s; closing anyway"
            ),
        }
        self.out.clear();
        frontend::terminate(&mut self.out);
        let _ = self.writer.write_all(&self.out).await;
        let _ = self.writer.shutdown().await;
        Ok(())
    }
}

/// What the I/O task does with the socket between wake-ups: the two boxes
/// of the module diagram. Control requests and the status timer are served
/// in both.
enum IoState {
    /// Reading the socket for the next batch.
    Reading,
    /// Handing `batch` to the consumer. The socket is not read meanwhile:
    /// that is the backpressure. `then` is an error met while filling the
    /// batch, reported once the messages before it were handed over.
    Delivering { batch: Batch, then: Option<Error> },
}

impl IoState {
    fn is_delivering(&self) -> bool {
        matches!(self, IoState::Delivering { .. })
    }

    /// The batch waiting for room in the channel, if any.
    fn batch(&self) -> Option<&Batch> {
        match self {
            IoState::Delivering { batch, .. } => Some(batch),
            IoState::Reading => None,
        }
    }
}

/// What woke the I/O task.
enum Action {
    Control(Option<Control>),
    Tick,
    Room(Result<(OwnedPermit<Handover>, Option<OwnedSemaphorePermit>), Error>),
    Frame(Result<Option<RawFrame>, Error>),
}

/// Wait for room in the channel and in the byte budget for `batch`.
/// Cancel-safe: if dropped before it is ready, nothing was sent and any
/// budget acquired is released. The batch itself is sent by the caller,
/// so it is never copied.
async fn room_for(
    events: &mpsc::Sender<Handover>,
    budget: &Arc<Semaphore>,
    channel_bytes: usize,
    batch: Option<&Batch>,
) -> Result<(OwnedPermit<Handover>, Option<OwnedSemaphorePermit>), Error> {
    let size = batch.map_or(0, |b| b.bytes);
    let permit = if size == 0 {
        None
    } else {
        // A batch larger than the whole budget (one large message) waits
        // for all of it.
        let n = u32::try_from(size.min(channel_bytes)).unwrap_or(u32::MAX);
        Some(
            budget
                .clone()
                .acquire_many_owned(n)
                .await
                .map_err(|_| Error::StreamStopped)?,
        )
    };
    let slot = events
        .clone()
        .reserve_owned()
        .await
        .map_err(|_| Error::StreamStopped)?;
    Ok((slot, permit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{split, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// A CopyData frame holding an XLogData message with `data`.
    fn xlog_frame(lsn: u64, data: &[u8]) -> Vec<u8> {
        let mut body = vec![b'w'];
        body.extend(lsn.to_be_bytes());
        body.extend(lsn.to_be_bytes());
        body.extend(0i64.to_be_bytes());
        body.extend(data);
        let mut f = vec![b'd'];
        f.extend(((body.len() + 4) as i32).to_be_bytes());
        f.extend(body);
        f
    }

    /// A stream over loopback TCP, and the "server" end of it.
    async fn stream_pair(options: StreamOptions) -> (ReplicationStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, server) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (read, write) = split(Stream::Tcp(client.unwrap()));
        let stream = ReplicationStream::spawn(
            FrameReader::new(read, 1024 * 1024),
            write,
            addr.to_string(),
            "test".into(),
            options,
        );
        (stream, server.unwrap().0)
    }

    fn lsn_of(m: ReplicationMessage) -> u64 {
        match m {
            ReplicationMessage::XLogData(x) => x.wal_start.0,
            ReplicationMessage::Keepalive(k) => panic!("unexpected keepalive {k:?}"),
        }
    }

    #[tokio::test]
    async fn messages_of_one_read_arrive_in_order_then_the_error_after_them() {
        let (mut stream, mut server) = stream_pair(StreamOptions::default()).await;
        // 1,000 messages and then a frame that is not allowed while
        // streaming, all in one write: they arrive in several batches.
        let mut bytes = Vec::new();
        for i in 1..=1000u64 {
            bytes.extend(xlog_frame(i, b"payload"));
        }
        bytes.extend([b'Z', 0, 0, 0, 5, b'I']);
        server.write_all(&bytes).await.unwrap();
        for i in 1..=1000u64 {
            let m = stream.recv().await.expect("stream open").expect("message");
            assert_eq!(lsn_of(m), i);
        }
        let end = stream.recv().await.expect("the error is delivered");
        assert!(end.is_err(), "expected an error, got {end:?}");
    }

    /// What a walsender sends when PostgreSQL shuts down cleanly
    /// (`pg_ctl stop -m fast`): CommandComplete "COPY 0", no CopyDone.
    #[tokio::test]
    async fn the_server_ending_the_copy_is_a_transient_end_after_the_data_before_it() {
        for (tag, body) in [(b'C', &b"COPY 0\0"[..]), (b'c', &b""[..])] {
            let (mut stream, mut server) = stream_pair(StreamOptions::default()).await;
            let mut bytes = xlog_frame(7, b"payload");
            bytes.push(tag);
            bytes.extend(((body.len() + 4) as i32).to_be_bytes());
            bytes.extend(body);
            server.write_all(&bytes).await.unwrap();
            let m = stream.recv().await.expect("stream open").expect("message");
            assert_eq!(lsn_of(m), 7);
            let end = stream.recv().await.expect("the end is delivered");
            match end {
                Err(e @ Error::StreamEndedByServer { .. }) => assert!(e.is_transient()),
                other => panic!("expected StreamEndedByServer, got {other:?}"),
            }
        }
    }

    /// `stop` queues its request and closes the event channel; when the
    /// I/O task sees the closed channel first, the queued stop is still
    /// served: the last status update and CopyDone reach the server and
    /// `stop` gets `Ok`.
    #[tokio::test]
    async fn a_stop_queued_before_the_channel_closed_is_served() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, server) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let mut server = server.unwrap().0;
        let (read, write) = split(Stream::Tcp(client.unwrap()));
        let (events_tx, events_rx) = mpsc::channel(1);
        let (control_tx, control_rx) = mpsc::channel(8);
        let mut io = IoTask {
            reader: FrameReader::new(read, 1024 * 1024),
            writer: write,
            out: BytesMut::new(),
            shared: Arc::new(Shared {
                confirmed: AtomicU64::new(42),
                reported: AtomicU64::new(0),
                status_updates: AtomicU64::new(0),
                keepalives: AtomicU64::new(0),
            }),
            events: events_tx,
            budget: Arc::new(Semaphore::new(1024)),
            channel_bytes: 1024,
            control: control_rx,
            options: StreamOptions::default(),
        };
        // Nothing queued: the closed channel is the stream's end.
        drop(events_rx);
        assert!(io.serve_queued_stop(Error::StreamStopped).await.is_err());

        let (reply, answer) = oneshot::channel();
        control_tx.send(Control::Stop(reply)).await.unwrap();
        // The server answers the CopyDone with ReadyForQuery.
        server.write_all(&[b'Z', 0, 0, 0, 5, b'I']).await.unwrap();
        io.serve_queued_stop(Error::StreamStopped).await.unwrap();
        answer.await.unwrap().unwrap();
        assert_eq!(io.shared.reported.load(Ordering::Acquire), 42);
        let mut sent = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut server, &mut sent)
            .await
            .unwrap();
        // A status update (CopyData 'r'), then CopyDone, then Terminate.
        assert_eq!((sent[0], sent[5]), (b'd', b'r'), "{sent:?}");
        assert!(
            sent.ends_with(&[b'c', 0, 0, 0, 4, b'X', 0, 0, 0, 4]),
            "{sent:?}"
        );
    }
}
