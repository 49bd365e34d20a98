//! One svcproxy programs a node at a time: the owner lock, the warm standby and the
//! hand-over between them.
//!
//! Entry point: [`Ownership::claim`]. The lock is the abstract Unix socket
//! `@svcproxy/owner`. The kernel holds it for the process that bound it, whatever way
//! that process ends (a SIGKILL included), and scopes it to the network namespace:
//! exactly the scope of the rules svcproxy writes (a DaemonSet's `hostNetwork` pods
//! share the node's). No file, no host path, nothing to clean up.
//!
//! A second instance (a DaemonSet rolling update with `maxSurge`, or a mistake) finds
//! the name bound, connects to it and waits there as a warm standby: it keeps its own
//! state from its sources but writes nothing. When the owner stops (SIGTERM) it closes
//! the lock and tells its standbys `handover`; one of them takes the lock, syncs, and
//! answers `synced`, and only then does the old owner stop forwarding (what the
//! userspace mode needs: its listeners must answer until the successor's rules point
//! elsewhere). When the owner dies, its standbys read end-of-file at once and take
//! over the same way.
//!
//! The exchange is one line each way: the owner greets a standby with
//! `svcproxy-owner 1 pid=P mode=M`, and later may send `handover`; a successor
//! answers `synced`. Only processes of svcproxy's own user take part (the kernel
//! tells each side the other's user): a process of another user holding the name
//! cannot keep svcproxy from running (it is logged, and this process programs the
//! node without the lock), nor wait on the owner. A process of svcproxy's user that
//! holds the name without greeting (a stopped owner) is waited for, never fought.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, watch};

/// The abstract socket's name (shown by `ss -xlp` as `@svcproxy/owner`).
pub const LOCK_NAME: &str = "svcproxy/owner";

/// How long a standby waits for the owner's greeting.
const GREETING_WAIT: Duration = Duration::from_secs(2);
/// The most standbys an owner keeps connected; more are turned away.
const MAX_STANDBYS: usize = 16;
/// A line of the exchange is never longer.
const MAX_LINE: usize = 256;

/// What this process is, as far as programming the node goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// This process programs the node.
    Owner {
        /// False when the lock is held by something that is not svcproxy, or cannot
        /// be taken: the node is programmed without it.
        locked: bool,
        /// The predecessor handed over just now (it sealed its rules first: see
        /// `svcproxy_sync::Driver::seal`); false for the first owner and after
        /// an owner died.
        handed_over: bool,
    },
    /// Another svcproxy programs the node; this one waits to take over.
    Standby { owner_pid: u32, owner_mode: String },
}

impl Role {
    pub fn is_owner(&self) -> bool {
        matches!(self, Role::Owner { .. })
    }
}

/// How a hand-over went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandOver {
    /// No standby was waiting (or this process was not the owner).
    NoSuccessor,
    /// A successor took the lock and its first sync succeeded.
    Synced,
    /// Standbys were told, and none reported a sync within the wait.
    TimedOut,
}

enum Command {
    /// This owner's first sync succeeded: tell the predecessor that handed over.
    Synced,
    /// Stop: close the lock, tell the standbys, wait up to `wait` for one to sync.
    HandOver {
        wait: Duration,
        reply: oneshot::Sender<HandOver>,
    },
}

/// This process's claim on the node.
pub struct Ownership {
    role: watch::Receiver<Role>,
    commands: mpsc::Sender<Command>,
    /// When the claim found another owner (this process a standby from then on,
    /// until it owns the node).
    standby_since: Option<std::time::Instant>,
}

impl Ownership {
    /// Takes the lock, or waits as a standby of the svcproxy holding it. Returns once
    /// the role is known; a standby becomes the owner later on its own ([`Self::role`]
    /// says when). Must run inside a tokio runtime.
    pub async fn claim(mode: &'static str) -> Ownership {
        Self::claim_named(LOCK_NAME, mode).await
    }

    /// [`Self::claim`] of the lock `name` (tests use names of their own).
    async fn claim_named(name: &'static str, mode: &'static str) -> Ownership {
        let (role_tx, mut role) = watch::channel(None::<Role>);
        let (commands, rx) = mpsc::channel(4);
        tokio::spawn(run(name, mode, role_tx, rx));
        let _ = role.wait_for(Option::is_some).await;
        // Re-publish without the Option: the task only ever sets Some.
        let first = role.borrow().clone().expect("role set");
        let standby_since = (!first.is_owner()).then(std::time::Instant::now);
        let (tx, out) = watch::channel(first);
        tokio::spawn(async move {
            while role.changed().await.is_ok() {
                let now = role.borrow().clone();
                if let Some(now) = now {
                    if tx.send(now).is_err() {
                        return;
                    }
                }
            }
        });
        Ownership {
            role: out,
            commands,
            standby_since,
        }
    }

    /// When the claim found another owner, if it did: this process waited as a
    /// standby from then (whatever its role is now).
    pub fn standby_since(&self) -> Option<std::time::Instant> {
        self.standby_since
    }

    /// The current role, and its changes.
    pub fn role(&self) -> watch::Receiver<Role> {
        self.role.clone()
    }

    /// The current role.
    pub fn current(&self) -> Role {
        self.role.borrow().clone()
    }

    /// The first sync as owner succeeded: the predecessor that handed over (if any)
    /// may stop.
    pub fn synced(&self) {
        let _ = self.commands.try_send(Command::Synced);
    }

    /// This process is stopping: the lock goes to a standby, which is given up to
    /// `wait` to sync.
    pub async fn hand_over(&self, wait: Duration) -> HandOver {
        let (reply, answer) = oneshot::channel();
        if self
            .commands
            .send(Command::HandOver { wait, reply })
            .await
            .is_err()
        {
            return HandOver::NoSuccessor;
        }
        answer.await.unwrap_or(HandOver::NoSuccessor)
    }
}

/// The lock's address: `name` in the abstract namespace (a leading NUL byte).
fn lock_address(name: &str) -> io::Result<socket2::SockAddr> {
    use std::os::unix::ffi::OsStrExt;
    let mut abstract_name = vec![0u8];
    abstract_name.extend_from_slice(name.as_bytes());
    socket2::SockAddr::unix(std::ffi::OsStr::from_bytes(&abstract_name))
}

fn unix_socket() -> io::Result<socket2::Socket> {
    let socket = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

fn bind(name: &str) -> io::Result<UnixListener> {
    let socket = unix_socket()?;
    socket.bind(&lock_address(name)?)?;
    socket.listen(128)?;
    UnixListener::from_std(std::os::unix::net::UnixListener::from(
        std::os::fd::OwnedFd::from(socket),
    ))
}

/// Connects without blocking: a holder whose backlog is full (one that never
/// accepts) gives `WouldBlock` at once rather than a connect that never returns.
fn connect(name: &str) -> io::Result<UnixStream> {
    let socket = unix_socket()?;
    socket.connect(&lock_address(name)?)?;
    UnixStream::from_std(std::os::unix::net::UnixStream::from(
        std::os::fd::OwnedFd::from(socket),
    ))
}

/// This process's effective user, as the kernel reports it for a socket's peer (of
/// a pair of its own). Needs the runtime.
fn own_uid() -> io::Result<u32> {
    let (a, _b) = UnixStream::pair()?;
    Ok(a.peer_cred()?.uid())
}

/// Reads one line (without its end), at most [`MAX_LINE`] bytes; `None` at
/// end-of-file, on an error, or for a longer line.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> Option<String> {
    let mut buf = Vec::new();
    let mut limited = r.take(MAX_LINE as u64 + 1);
    match limited.read_until(b'\n', &mut buf).await {
        Ok(0) | Err(_) => None,
        Ok(_) if buf.len() > MAX_LINE => None,
        Ok(_) => {
            let line = String::from_utf8_lossy(&buf);
            Some(line.trim_end_matches(['\n', '\r']).to_string())
        }
    }
}

/// The owner's greeting: its PID and mode.
fn parse_greeting(line: &str) -> Option<(u32, String)> {
    let mut words = line.split(' ');
    if words.next()? != "svcproxy-owner" || words.next()? != "1" {
        return None;
    }
    let pid = words.next()?.strip_prefix("pid=")?.parse().ok()?;
    let mode = words.next()?.strip_prefix("mode=")?;
    if mode.is_empty() || !mode.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return None;
    }
    Some((pid, mode.to_string()))
}

/// What ended a wait as standby.
enum Waited {
    /// The owner handed over: the connection stays open until our first sync.
    HandedOver(UnixStream),
    /// The owner is gone (its connection closed).
    OwnerGone,
    /// The connection closed before any greeting (an owner on its way out, or one
    /// turning standbys away).
    Closed,
    /// A process of this user holds the name and does not greet (stopped, or
    /// overloaded): waited for, never fought.
    Silent(u32),
    /// The name is held by another user's process: not svcproxy.
    NotSvcproxy(String),
    /// This process is stopping.
    Stopping,
}

async fn run(
    name: &'static str,
    mode: &'static str,
    role: watch::Sender<Option<Role>>,
    mut commands: mpsc::Receiver<Command>,
) {
    // Asked once: whose connections to trust.
    let uid = own_uid().ok();
    let mut predecessor: Option<UnixStream> = None;
    // A bound name nobody answers on (being set up or torn down): retried briefly.
    let mut unanswered = 0u32;
    let mut waiting = Waiting::default();
    loop {
        match bind(name) {
            Ok(listener) => {
                tracing::info!(lock = %format!("@{name}"), "owner lock taken: this svcproxy programs the node");
                let handed_over = predecessor.is_some();
                let _ = role.send(Some(Role::Owner {
                    locked: true,
                    handed_over,
                }));
                own(mode, uid, listener, predecessor, commands).await;
                return;
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                // Another standby won the race: the predecessor owes us nothing, and
                // our closed connection tells it so.
                predecessor = None;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot take the owner lock; programming the node without it (another svcproxy here would fight this one)");
                break;
            }
        }
        let stream = match connect(name) {
            Ok(s) => s,
            Err(e) => {
                unanswered += 1;
                if unanswered > 100 {
                    tracing::error!(error = %e, "the owner lock is held but never answers; programming the node without it");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        unanswered = 0;
        let waited = stand_by(stream, uid, &role, &mut commands).await;
        match waiting.after(waited, name, &role).await {
            After::Retry => {}
            After::Take(from) => predecessor = from,
            After::Unlocked => break,
            After::Stop => return,
        }
    }
    run_unlocked(&role, commands, predecessor).await;
}

/// What a standby does once the owner's connection ends.
enum After {
    /// Try the lock again (no predecessor to tell).
    Retry,
    /// Take the lock, telling the predecessor (when it handed over) once synced.
    Take(Option<UnixStream>),
    /// Program the node without the lock.
    Unlocked,
    Stop,
}

/// A standby's memory across the owner's connections: how often it was turned
/// away, whether a silent owner was said.
#[derive(Default)]
struct Waiting {
    closed: u32,
    silent_logged: bool,
}

impl Waiting {
    async fn after(
        &mut self,
        waited: Waited,
        name: &str,
        role: &watch::Sender<Option<Role>>,
    ) -> After {
        match waited {
            Waited::HandedOver(s) => {
                tracing::info!("the owner handed over: taking the lock");
                After::Take(Some(s))
            }
            Waited::OwnerGone => {
                tracing::warn!("the owner is gone without a hand-over: taking the lock");
                After::Take(None)
            }
            Waited::Closed => {
                // An owner that keeps turning this one away (full of standbys): wait
                // as a standby all the same, so that start-up goes on.
                self.closed += 1;
                if self.closed >= 20 && role.borrow().is_none() {
                    let _ = role.send(Some(Role::Standby {
                        owner_pid: 0,
                        owner_mode: "unknown".into(),
                    }));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                After::Retry
            }
            Waited::Silent(pid) => {
                if !std::mem::replace(&mut self.silent_logged, true) {
                    tracing::warn!(pid, lock = %format!("@{name}"), "the owner lock is held by a process of this user that does not answer (stopped, or overloaded): waiting for it");
                }
                if role.borrow().is_none() {
                    let _ = role.send(Some(Role::Standby {
                        owner_pid: pid,
                        owner_mode: "unknown".into(),
                    }));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                After::Retry
            }
            Waited::NotSvcproxy(why) => {
                tracing::error!(lock = %format!("@{name}"), "the owner lock is held by {why}, not by svcproxy: programming the node without it");
                After::Unlocked
            }
            Waited::Stopping => After::Stop,
        }
    }
}

/// Programs the node without the lock: there is nobody to hand over to.
async fn run_unlocked(
    role: &watch::Sender<Option<Role>>,
    mut commands: mpsc::Receiver<Command>,
    mut predecessor: Option<UnixStream>,
) {
    let _ = role.send(Some(Role::Owner {
        locked: false,
        handed_over: false,
    }));
    while let Some(c) = commands.recv().await {
        match c {
            Command::HandOver { reply, .. } => {
                let _ = reply.send(HandOver::NoSuccessor);
                return;
            }
            Command::Synced => {
                if let Some(mut p) = predecessor.take() {
                    let _ = p.write_all(b"synced\n").await;
                }
            }
        }
    }
}

/// Waits on the owner's connection until it hands over or goes away.
async fn stand_by(
    stream: UnixStream,
    uid: Option<u32>,
    role: &watch::Sender<Option<Role>>,
    commands: &mut mpsc::Receiver<Command>,
) -> Waited {
    let peer = stream.peer_cred().ok();
    let peer_pid = peer
        .as_ref()
        .and_then(|p| p.pid())
        .and_then(|p| u32::try_from(p).ok())
        .unwrap_or_default();
    if let (Some(peer), Some(own)) = (&peer, uid) {
        if peer.uid() != own {
            return Waited::NotSvcproxy(format!("PID {peer_pid} of user {}", peer.uid()));
        }
    }
    let mut reader = BufReader::new(stream);
    let greeting = tokio::time::timeout(GREETING_WAIT, read_line(&mut reader)).await;
    let (owner_pid, owner_mode) = match greeting {
        Ok(Some(line)) => match parse_greeting(&line) {
            Some(g) => g,
            None => return Waited::Silent(peer_pid),
        },
        Ok(None) => return Waited::Closed,
        Err(_) => return Waited::Silent(peer_pid),
    };
    tracing::info!(
        owner_pid,
        owner_mode,
        "another svcproxy programs this node: waiting as a warm standby (state kept, nothing written)"
    );
    let _ = role.send(Some(Role::Standby {
        owner_pid,
        owner_mode,
    }));
    loop {
        tokio::select! {
            line = read_line(&mut reader) => match line.as_deref() {
                Some("handover") => return Waited::HandedOver(reader.into_inner()),
                Some(_) => {}
                None => return Waited::OwnerGone,
            },
            c = commands.recv() => match c {
                Some(Command::HandOver { reply, .. }) => {
                    let _ = reply.send(HandOver::NoSuccessor);
                    return Waited::Stopping;
                }
                Some(Command::Synced) => {}
                None => return Waited::Stopping,
            },
        }
    }
}

/// Holds the lock: greets standbys, tells the predecessor of the first sync, and
/// hands over when told to.
async fn own(
    mode: &'static str,
    uid: Option<u32>,
    listener: UnixListener,
    mut predecessor: Option<UnixStream>,
    mut commands: mpsc::Receiver<Command>,
) {
    let greeting = format!("svcproxy-owner 1 pid={} mode={mode}\n", std::process::id());
    let mut standbys: Vec<UnixStream> = Vec::new();
    let mut refused_logged = false;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((mut s, _)) = accepted else { continue };
                // Only svcproxy's user may wait here (and later answer `synced`).
                let peer = s.peer_cred().ok().map(|c| c.uid());
                if peer.is_none() || peer != uid {
                    if !std::mem::replace(&mut refused_logged, true) {
                        tracing::warn!(user = ?peer, "a process of another user connected to the owner lock: turned away");
                    }
                    continue;
                }
                // Those that went away since.
                standbys.retain(still_open);
                if standbys.len() >= MAX_STANDBYS {
                    continue;
                }
                if s.write_all(greeting.as_bytes()).await.is_ok() {
                    let pid = s.peer_cred().ok().and_then(|c| c.pid());
                    tracing::info!(standby_pid = ?pid, "a standby svcproxy is waiting to take over");
                    standbys.push(s);
                }
            }
            c = commands.recv() => match c {
                Some(Command::Synced) => {
                    if let Some(mut p) = predecessor.take() {
                        let _ = p.write_all(b"synced\n").await;
                    }
                }
                Some(Command::HandOver { wait, reply }) => {
                    // The name is free from here: a standby can take it.
                    drop(listener);
                    let _ = reply.send(hand_over(standbys, wait).await);
                    return;
                }
                None => return,
            },
        }
    }
}

/// Whether a standby's connection is still open (nothing is ever sent by a waiting
/// standby, so readable means closed).
fn still_open(s: &UnixStream) -> bool {
    let mut buf = [0u8; 1];
    matches!(s.try_read(&mut buf), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

async fn hand_over(standbys: Vec<UnixStream>, wait: Duration) -> HandOver {
    let (tx, mut rx) = mpsc::channel(standbys.len().max(1));
    let mut told = 0;
    for mut s in standbys {
        if s.write_all(b"handover\n").await.is_err() {
            continue;
        }
        told += 1;
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(s);
            let synced = loop {
                match read_line(&mut reader).await.as_deref() {
                    Some("synced") => break true,
                    Some(_) => {}
                    None => break false,
                }
            };
            let _ = tx.send(synced).await;
        });
    }
    drop(tx);
    if told == 0 {
        return HandOver::NoSuccessor;
    }
    tracing::info!(
        standbys = told,
        ?wait,
        "handing over to the standby; waiting for its first sync"
    );
    let outcome = tokio::time::timeout(wait, async {
        // One answer per standby told; the losers of the race close without one
        // (they drop this connection when the lock turns out taken).
        while let Some(synced) = rx.recv().await {
            if synced {
                return HandOver::Synced;
            }
        }
        HandOver::TimedOut
    })
    .await;
    outcome.unwrap_or(HandOver::TimedOut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greetings_are_parsed_strictly() {
        assert_eq!(
            parse_greeting("svcproxy-owner 1 pid=42 mode=nftables"),
            Some((42, "nftables".into()))
        );
        for bad in [
            "",
            "svcproxy-owner 2 pid=42 mode=nftables",
            "svcproxy-owner 1 pid=x mode=nftables",
            "svcproxy-owner 1 pid=42 mode=",
            "svcproxy-owner 1 pid=42 mode=a\u{1b}[2J",
            "hello",
        ] {
            assert_eq!(parse_greeting(bad), None, "{bad:?}");
        }
    }

    /// A lock name no other test (or svcproxy) uses.
    fn fresh_name() -> &'static str {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        Box::leak(format!("svcproxy-test/{}/{n}", std::process::id()).into_boxed_str())
    }

    async fn becomes_owner(o: &Ownership) -> Role {
        let mut role = o.role();
        let r = tokio::time::timeout(Duration::from_secs(5), role.wait_for(Role::is_owner))
            .await
            .expect("took over within 5 s")
            .expect("role published");
        r.clone()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_claim_waits_and_takes_over_at_the_hand_over() {
        let name = fresh_name();
        let first = Ownership::claim_named(name, "nftables").await;
        assert_eq!(
            *first.role().borrow(),
            Role::Owner {
                locked: true,
                handed_over: false
            }
        );
        let second = Ownership::claim_named(name, "iptables").await;
        assert_eq!(
            *second.role().borrow(),
            Role::Standby {
                owner_pid: std::process::id(),
                owner_mode: "nftables".into()
            }
        );
        // The hand-over waits for the successor's first sync.
        let handing = tokio::spawn(async move { first.hand_over(Duration::from_secs(10)).await });
        assert_eq!(
            becomes_owner(&second).await,
            Role::Owner {
                locked: true,
                handed_over: true
            }
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!handing.is_finished(), "the old owner waits for the sync");
        second.synced();
        assert_eq!(handing.await.unwrap(), HandOver::Synced);
        // The new owner holds the lock: a third claim stands by.
        let third = Ownership::claim_named(name, "nftables").await;
        assert!(matches!(*third.role().borrow(), Role::Standby { .. }));
        assert_eq!(
            second.hand_over(Duration::from_millis(200)).await,
            HandOver::TimedOut,
            "the third never syncs"
        );
        assert!(becomes_owner(&third).await.is_owner());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_standby_takes_over_at_once_when_the_owner_dies() {
        let name = fresh_name();
        let first = Ownership::claim_named(name, "nftables").await;
        let second = Ownership::claim_named(name, "nftables").await;
        assert!(!second.role().borrow().is_owner());
        // Dropped without a hand-over: as a killed process, the lock and the
        // standbys' connections close.
        let t = std::time::Instant::now();
        drop(first);
        assert_eq!(
            becomes_owner(&second).await,
            Role::Owner {
                locked: true,
                handed_over: false
            }
        );
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert_eq!(
            second.hand_over(Duration::from_secs(1)).await,
            HandOver::NoSuccessor
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_holder_of_this_user_is_waited_for_not_fought() {
        for squatter_says in [None, Some("hello\n")] {
            let name = fresh_name();
            let squatter = bind(name).unwrap();
            let greeter = tokio::spawn(async move {
                let mut held = Vec::new();
                loop {
                    let (mut s, _) = squatter.accept().await.unwrap();
                    if let Some(text) = squatter_says {
                        s.write_all(text.as_bytes()).await.unwrap();
                    }
                    held.push(s);
                }
            });
            let o = Ownership::claim_named(name, "nftables").await;
            assert!(
                matches!(&*o.role().borrow(), Role::Standby { owner_mode, .. } if owner_mode == "unknown"),
                "{:?}",
                o.role().borrow()
            );
            // Gone (the listener and every connection closed): taken over.
            greeter.abort();
            let _ = greeter.await;
            assert_eq!(
                becomes_owner(&o).await,
                Role::Owner {
                    locked: true,
                    handed_over: false
                }
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_holder_that_turns_every_standby_away_cannot_hang_the_claim() {
        let name = fresh_name();
        let squatter = bind(name).unwrap();
        // Accepts and closes at once, never greeting (an owner full of standbys).
        let closer = tokio::spawn(async move {
            loop {
                let _ = squatter.accept().await;
            }
        });
        let o = tokio::time::timeout(
            Duration::from_secs(10),
            Ownership::claim_named(name, "nftables"),
        )
        .await
        .expect("the claim returned");
        assert!(
            matches!(&*o.role().borrow(), Role::Standby { owner_mode, .. } if owner_mode == "unknown"),
            "{:?}",
            o.role().borrow()
        );
        closer.abort();
        let _ = closer.await;
        assert!(becomes_owner(&o).await.is_owner());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_holder_that_never_accepts_cannot_hang_the_claim() {
        let name = fresh_name();
        let socket = unix_socket().unwrap();
        socket.bind(&lock_address(name).unwrap()).unwrap();
        socket.listen(0).unwrap();
        // Its backlog full with one connection of its own, never accepted.
        let _queued = connect(name).unwrap();
        let t = std::time::Instant::now();
        let o = tokio::time::timeout(
            Duration::from_secs(20),
            Ownership::claim_named(name, "nftables"),
        )
        .await
        .expect("the claim returned");
        assert_eq!(
            *o.role().borrow(),
            Role::Owner {
                locked: false,
                handed_over: false
            }
        );
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        drop(socket);
    }

    /// Run as another user by the next test: holds the lock `SVCPROXY_TEST_SQUAT`
    /// names for a while. Nothing without it.
    #[tokio::test]
    #[ignore]
    async fn squat_helper() {
        let Ok(name) = std::env::var("SVCPROXY_TEST_SQUAT") else {
            return;
        };
        let listener = bind(Box::leak(name.into_boxed_str())).expect("bind");
        println!("bound");
        let mut held = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                if let Ok((s, _)) = listener.accept().await {
                    held.push(s);
                }
            }
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_holder_of_another_user_cannot_keep_svcproxy_from_running() {
        if own_uid().unwrap() != 0 || !std::path::Path::new("/usr/bin/setpriv").exists() {
            svcproxy_testkit::netns::skip(
                "a_holder_of_another_user_cannot_keep_svcproxy_from_running",
                "needs root and setpriv (util-linux)",
            );
            return;
        }
        // This test binary, copied where user nobody may run it, as nobody.
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("svcproxy-owner-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let exe = dir.join("owner-test");
        std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let name = fresh_name();
        let mut child = tokio::process::Command::new("/usr/bin/setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&exe)
            .args([
                "--exact",
                "owner::tests::squat_helper",
                "--ignored",
                "--nocapture",
            ])
            .env("SVCPROXY_TEST_SQUAT", name)
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // Bound once a connection goes through.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while connect(name).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the helper never bound"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let t = std::time::Instant::now();
        let o = Ownership::claim_named(name, "nftables").await;
        assert_eq!(
            *o.role().borrow(),
            Role::Owner {
                locked: false,
                handed_over: false
            }
        );
        assert!(
            t.elapsed() < GREETING_WAIT,
            "told by the user at once: {:?}",
            t.elapsed()
        );
        let _ = child.kill().await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}
