//! TCP load for the proxy benchmarks (`scripts/bench-userspace.sh`): a server to put
//! behind a proxy and the clients that measure through it.
//!
//! - `serve --listen ADDR[,ADDR...]`: per connection, the first byte says what to do:
//!   `G` sends 64 KiB chunks until the client goes; `E` echoes until the end of file.
//! - `bulk --target ADDR --streams N --seconds S`: N connections in `G` mode, each
//!   reading as fast as it can; prints the bytes per second received in all.
//! - `connect --target ADDR --concurrency C --seconds S`: C threads each making new
//!   connections in turn (connect, one 32-byte request echoed, close); prints
//!   connections per second and the p50/p99 of one whole connection.
//! - `rr --target ADDR --concurrency C --seconds S [--interval-ms M]`: C
//!   connections in `E` mode, each sending a 64-byte request and waiting for its
//!   echo (2 s at most) in turn, pausing M ms after each; prints requests per
//!   second and the p50/p99 request latency, or fails at the first echo missing
//!   (the fault tests' connections that must live through a restart).
//! - `hold --target ADDR --connections N --pause-secs P`: opens N `E`
//!   connections, each answering one echo, and prints `open`; after P seconds
//!   (idle) sends one request on each and waits up to 3 s in all for the echoes.
//!   Prints how many opened, and how many answered after the pause (the
//!   map-pressure tests' idle connections).
//! - `transfer --target ADDR --bytes N`: one `E` connection; sends N bytes of a
//!   checkable pattern while reading the echo, then shuts down its writing (a
//!   half-close) and reads the echo to its end; every byte is checked. Prints the
//!   bytes each way and exits 1 when anything differs (for the real-packet tests).
//!
//! Every client prints one JSON line. Threads and blocking sockets: the client's
//! cost is the same whatever is measured behind the address.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use svcproxy_testkit::pattern::Pattern;

#[derive(Parser)]
#[command(about = "TCP load for svcproxy's proxy benchmarks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve G (generate) and E (echo) connections on every address listed.
    Serve {
        #[arg(long, value_delimiter = ',')]
        listen: Vec<SocketAddr>,
    },
    /// Bulk download throughput over N streams.
    Bulk {
        #[arg(long)]
        target: SocketAddr,
        #[arg(long, default_value_t = 1)]
        streams: usize,
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
    },
    /// New connections per second (each one small request).
    Connect {
        #[arg(long)]
        target: SocketAddr,
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
    },
    /// N bytes to an echoing server and back, every byte checked.
    Transfer {
        #[arg(long)]
        target: SocketAddr,
        #[arg(long)]
        bytes: u64,
    },
    /// N connections opened, left idle, then each asked once more.
    Hold {
        #[arg(long)]
        target: SocketAddr,
        #[arg(long)]
        connections: usize,
        #[arg(long, default_value_t = 5.0)]
        pause_secs: f64,
    },
    /// Small requests on open connections: rate and latency.
    Rr {
        #[arg(long)]
        target: SocketAddr,
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// A pause after each echo (0: none, as fast as they come).
        #[arg(long, default_value_t = 0)]
        interval_ms: u64,
    },
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Serve { listen } => serve(&listen),
        Cmd::Bulk {
            target,
            streams,
            seconds,
        } => bulk(target, streams, Duration::from_secs_f64(seconds)),
        Cmd::Connect {
            target,
            concurrency,
            seconds,
        } => connect(target, concurrency, Duration::from_secs_f64(seconds)),
        Cmd::Rr {
            target,
            concurrency,
            seconds,
            interval_ms,
        } => rr(
            target,
            concurrency,
            Duration::from_secs_f64(seconds),
            Duration::from_millis(interval_ms),
        ),
        Cmd::Transfer { target, bytes } => transfer(target, bytes),
        Cmd::Hold {
            target,
            connections,
            pause_secs,
        } => hold(target, connections, Duration::from_secs_f64(pause_secs)),
    }
}

fn serve(listen: &[SocketAddr]) -> Result<()> {
    if listen.is_empty() {
        bail!("--listen: at least one address");
    }
    let mut handles = Vec::new();
    for addr in listen {
        let l = TcpListener::bind(addr).with_context(|| format!("listening on {addr}"))?;
        handles.push(thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(conn) = conn else { continue };
                thread::spawn(move || {
                    let _ = handle(conn);
                });
            }
        }));
    }
    println!("ready");
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

fn handle(mut s: TcpStream) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let mut cmd = [0u8; 1];
    s.read_exact(&mut cmd)?;
    match cmd[0] {
        b'G' => {
            let chunk = vec![0x5au8; 64 * 1024];
            loop {
                s.write_all(&chunk)?;
            }
        }
        b'E' => {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = s.read(&mut buf)?;
                if n == 0 {
                    return s.shutdown(Shutdown::Write);
                }
                s.write_all(&buf[..n])?;
            }
        }
        _ => Ok(()),
    }
}

/// Runs `work` on `n` threads until `time` passes; each returns its own result.
fn on_threads<T: Send + 'static>(
    n: usize,
    time: Duration,
    work: impl Fn(Instant, &AtomicBool) -> Result<T> + Send + Sync + 'static,
) -> Result<Vec<T>> {
    let work = Arc::new(work);
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + time;
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (work, stop) = (work.clone(), stop.clone());
            thread::spawn(move || work(deadline, &stop))
        })
        .collect();
    // Until the time is up, or every thread has ended (an error ends one early:
    // the process then says so at once).
    while Instant::now() < deadline && !handles.iter().all(|h| h.is_finished()) {
        thread::sleep(
            Duration::from_millis(10).min(deadline.saturating_duration_since(Instant::now())),
        );
    }
    stop.store(true, Ordering::Relaxed);
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))?
        })
        .collect()
}

fn bulk(target: SocketAddr, streams: usize, time: Duration) -> Result<()> {
    let start = Instant::now();
    let totals = on_threads(streams, time, move |deadline, stop| {
        let mut s = TcpStream::connect(target).context("connecting")?;
        s.write_all(b"G")?;
        s.set_read_timeout(Some(Duration::from_millis(200)))?;
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            match s.read(&mut buf) {
                Ok(0) => bail!("the server closed the stream"),
                Ok(n) => total += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(total)
    })?;
    let secs = start.elapsed().as_secs_f64().max(time.as_secs_f64());
    let bytes: u64 = totals.iter().sum();
    println!(
        "{}",
        serde_json::json!({
            "test": "bulk",
            "streams": streams,
            "seconds": secs,
            "bytes": bytes,
            "gbit_per_s": bytes as f64 * 8.0 / secs / 1e9,
        })
    );
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1e6
}

fn report(test: &str, concurrency: usize, secs: f64, mut lat: Vec<Duration>, errors: u64) {
    lat.sort();
    println!(
        "{}",
        serde_json::json!({
            "test": test,
            "concurrency": concurrency,
            "seconds": secs,
            "count": lat.len(),
            "errors": errors,
            "per_s": lat.len() as f64 / secs,
            "p50_us": percentile(&lat, 0.50),
            "p99_us": percentile(&lat, 0.99),
        })
    );
}

fn connect(target: SocketAddr, concurrency: usize, time: Duration) -> Result<()> {
    let start = Instant::now();
    let results = on_threads(concurrency, time, move |deadline, stop| {
        let mut lat = Vec::new();
        let mut errors = 0u64;
        let req = [b'E'; 33];
        let mut buf = [0u8; 32];
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            let t = Instant::now();
            let ok = (|| -> std::io::Result<()> {
                let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(2))?;
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(Duration::from_secs(2)))?;
                s.write_all(&req)?;
                s.read_exact(&mut buf)?;
                // Lingering off: the client closes first, and its ephemeral ports
                // would otherwise run out in TIME_WAIT within a run.
                socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO))?;
                Ok(())
            })();
            match ok {
                Ok(()) => lat.push(t.elapsed()),
                Err(_) => errors += 1,
            }
        }
        Ok((lat, errors))
    })?;
    let secs = start.elapsed().as_secs_f64();
    let errors = results.iter().map(|(_, e)| e).sum();
    let lat = results.into_iter().flat_map(|(l, _)| l).collect();
    report("connect", concurrency, secs, lat, errors);
    Ok(())
}

fn rr(target: SocketAddr, concurrency: usize, time: Duration, interval: Duration) -> Result<()> {
    let start = Instant::now();
    let results = on_threads(concurrency, time, move |deadline, stop| {
        let mut s = TcpStream::connect(target).context("connecting")?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"E")?;
        let req = [0x42u8; 64];
        let mut buf = [0u8; 64];
        let mut lat = Vec::new();
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            let t = Instant::now();
            s.write_all(&req)?;
            s.read_exact(&mut buf)
                .with_context(|| format!("request {}: no echo", lat.len() + 1))?;
            lat.push(t.elapsed());
            if !interval.is_zero() {
                thread::sleep(interval);
            }
        }
        Ok(lat)
    })?;
    let secs = start.elapsed().as_secs_f64();
    let lat = results.into_iter().flatten().collect();
    report("rr", concurrency, secs, lat, 0);
    Ok(())
}

fn hold(target: SocketAddr, n: usize, pause: Duration) -> Result<()> {
    let req = [0x42u8; 16];
    let mut buf = [0u8; 16];
    let mut open = Vec::new();
    for _ in 0..n {
        let ok = (|| -> std::io::Result<TcpStream> {
            let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(2))?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(b"E")?;
            s.write_all(&req)?;
            s.read_exact(&mut buf)?;
            Ok(s)
        })();
        if let Ok(s) = ok {
            open.push(s);
        }
    }
    println!("open {}", open.len());
    std::io::stdout().flush()?;
    thread::sleep(pause);
    // Every connection asked at once; the echoes awaited together.
    let mut asked: Vec<Option<TcpStream>> = open
        .into_iter()
        .map(|mut s| s.write_all(&req).ok().map(|_| s))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut answered = 0usize;
    for s in asked.iter_mut().flatten() {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(10));
        s.set_read_timeout(Some(left))?;
        if s.read_exact(&mut buf).is_ok() && buf == req {
            answered += 1;
        }
    }
    println!(
        "{}",
        serde_json::json!({
            "test": "hold",
            "asked": n,
            "opened": asked.len(),
            "answered": answered,
        })
    );
    Ok(())
}

fn transfer(target: SocketAddr, bytes: u64) -> Result<()> {
    let start = Instant::now();
    let pattern = Arc::new(Pattern::new());
    let mut s = TcpStream::connect(target).context("connecting")?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(b"E")?;
    let mut w = s.try_clone()?;
    let p = pattern.clone();
    let sender = thread::spawn(move || -> std::io::Result<()> {
        let mut sent = 0u64;
        while sent < bytes {
            let chunk = p.at(sent, (bytes - sent).min(256 * 1024) as usize);
            w.write_all(chunk)?;
            sent += chunk.len() as u64;
        }
        // The half-close: the echo must still come back in full.
        w.shutdown(Shutdown::Write)
    });
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    let mut intact = true;
    loop {
        let n = s.read(&mut buf).context("reading the echo")?;
        if n == 0 {
            break;
        }
        if intact && !pattern.matches(got, &buf[..n]) {
            intact = false;
            eprintln!("bytes {got}..{} differ from what was sent", got + n as u64);
        }
        got += n as u64;
    }
    sender
        .join()
        .map_err(|_| anyhow::anyhow!("the sender panicked"))?
        .context("sending")?;
    let ok = intact && got == bytes;
    println!(
        "{}",
        serde_json::json!({
            "test": "transfer",
            "sent": bytes,
            "echoed": got,
            "intact": intact,
            "seconds": start.elapsed().as_secs_f64(),
        })
    );
    if !ok {
        bail!("{got} of {bytes} bytes came back, intact: {intact}");
    }
    Ok(())
}
