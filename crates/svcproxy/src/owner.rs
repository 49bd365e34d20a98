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
//! answers `synced`. A process that holds the name but is not svcproxy (another user,
//! or no greeting) cannot keep svcproxy from running: it is logged, and this process
//! programs the node without the lock.

use std::io;
use std::os::linux::net::SocketAddrExt;
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
        let (tx, out) = watch::channel(role.borrow().clone().expect("role set"));
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
        }
    }

    /// The current role, and its changes.
    pub fn role(&self) -> watch::Receiver<Role> {
        self.role.clone()
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

fn lock_address(name: &str) -> io::Result<std::os::unix::net::SocketAddr> {
    std::os::unix::net::SocketAddr::from_abstract_name(name)
}

fn bind(name: &str) -> io::Result<UnixListener> {
    let l = std::os::unix::net::UnixListener::bind_addr(&lock_address(name)?)?;
    l.set_nonblocking(true)?;
    UnixListener::from_std(l)
}

fn connect(name: &str) -> io::Result<UnixStream> {
    let s = std::os::unix::net::UnixStream::connect_addr(&lock_address(name)?)?;
    s.set_nonblocking(true)?;
    UnixStream::from_std(s)
}

/// This process's effective user, as the kernel reports it for a socket's peer.
fn own_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the process's effective user.
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
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
    /// The name is held by something that is not svcproxy.
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
    let mut predecessor = None;
    // A bound name nobody answers on (being set up or torn down): retried briefly.
    let mut unanswered = 0u32;
    loop {
        match bind(name) {
            Ok(listener) => {
                tracing::info!(lock = %format!("@{name}"), "owner lock taken: this svcproxy programs the node");
                let _ = role.send(Some(Role::Owner { locked: true }));
                own(mode, listener, predecessor, commands).await;
                return;
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {}
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
        match stand_by(stream, &role, &mut commands).await {
            Waited::HandedOver(s) => {
                tracing::info!("the owner handed over: taking the lock");
                predecessor = Some(s);
            }
            Waited::OwnerGone => {
                tracing::warn!("the owner is gone without a hand-over: taking the lock");
            }
            Waited::NotSvcproxy(why) => {
                tracing::error!(lock = %format!("@{name}"), "the owner lock is held by {why}, not by svcproxy: programming the node without it");
                break;
            }
            Waited::Stopping => return,
        }
    }
    let _ = role.send(Some(Role::Owner { locked: false }));
    // Without the lock there is nobody to hand over to.
    while let Some(c) = commands.recv().await {
        if let Command::HandOver { reply, .. } = c {
            let _ = reply.send(HandOver::NoSuccessor);
            return;
        }
    }
}

/// Waits on the owner's connection until it hands over or goes away.
async fn stand_by(
    stream: UnixStream,
    role: &watch::Sender<Option<Role>>,
    commands: &mut mpsc::Receiver<Command>,
) -> Waited {
    let peer = stream.peer_cred().ok();
    if let (Some(peer), Some(own)) = (&peer, own_uid()) {
        if peer.uid() != own {
            return Waited::NotSvcproxy(format!(
                "PID {} of user {}",
                peer.pid().unwrap_or_default(),
                peer.uid()
            ));
        }
    }
    let mut reader = BufReader::new(stream);
    let greeting = tokio::time::timeout(GREETING_WAIT, read_line(&mut reader)).await;
    let (owner_pid, owner_mode) = match greeting {
        Ok(Some(line)) => match parse_greeting(&line) {
            Some(g) => g,
            None => {
                return Waited::NotSvcproxy(format!(
                    "PID {} (it greets with {line:?})",
                    peer.and_then(|p| p.pid()).unwrap_or_default()
                ))
            }
        },
        // Closed before greeting: an owner on its way out.
        Ok(None) => return Waited::OwnerGone,
        Err(_) => {
            return Waited::NotSvcproxy(format!(
                "PID {} (no greeting within {GREETING_WAIT:?})",
                peer.and_then(|p| p.pid()).unwrap_or_default()
            ))
        }
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
    listener: UnixListener,
    mut predecessor: Option<UnixStream>,
    mut commands: mpsc::Receiver<Command>,
) {
    let greeting = format!("svcproxy-owner 1 pid={} mode={mode}\n", std::process::id());
    let mut standbys: Vec<UnixStream> = Vec::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((mut s, _)) = accepted else { continue };
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
        // One answer per standby told; the losers of the race close without one.
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
        assert_eq!(*first.role().borrow(), Role::Owner { locked: true });
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
        assert_eq!(becomes_owner(&second).await, Role::Owner { locked: true });
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
        assert_eq!(becomes_owner(&second).await, Role::Owner { locked: true });
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert_eq!(
            second.hand_over(Duration::from_secs(1)).await,
            HandOver::NoSuccessor
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_holder_that_is_not_svcproxy_cannot_keep_svcproxy_from_running() {
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
            let t = std::time::Instant::now();
            let o = Ownership::claim_named(name, "nftables").await;
            assert_eq!(*o.role().borrow(), Role::Owner { locked: false });
            assert!(t.elapsed() < GREETING_WAIT + Duration::from_secs(1));
            assert_eq!(
                o.hand_over(Duration::from_secs(1)).await,
                HandOver::NoSuccessor
            );
            greeter.abort();
        }
    }
}
