//! Bytes between a client's connection and its endpoint's, both ways, until both
//! directions have ended.
//!
//! Entry point: [`relay`]. With `zero_copy` (the default, `--userspace-zero-copy`)
//! each direction moves its bytes with `splice(2)` through a pipe of its own: the
//! kernel hands socket buffers' pages from one socket to the other, and the proxy
//! never reads them into its memory. Without it, or when a pipe cannot be had (out
//! of file descriptors), tokio's buffered `copy_bidirectional` does the same job.
//!
//! Either way a direction that reaches its end of file shuts down the writing side
//! of the other socket (a half-close is passed on) while the other direction goes
//! on; an error in either direction ends both.

use std::io;
use std::net::Shutdown;
use std::os::fd::OwnedFd;

use rustix::pipe::{PipeFlags, SpliceFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Bytes moved per `splice` call at most: a pipe's default capacity (16 pages).
const CHUNK: usize = 64 * 1024;

/// Relays `client` and `upstream` until both directions end. Returns the bytes
/// sent to the upstream and to the client.
pub async fn relay(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    zero_copy: bool,
) -> io::Result<(u64, u64)> {
    if zero_copy {
        if let (Ok(up), Ok(down)) = (pipe(), pipe()) {
            let (client, upstream) = (&*client, &*upstream);
            return tokio::try_join!(
                one_way(client, upstream, up),
                one_way(upstream, client, down)
            );
        }
    }
    tokio::io::copy_bidirectional(client, upstream).await
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(
        PipeFlags::CLOEXEC | PipeFlags::NONBLOCK,
    )?)
}

/// One direction: from `src` into the pipe, from the pipe to `dst`, until `src`'s
/// end of file, which becomes a shutdown of `dst`'s writing.
///
/// The pipe is emptied into `dst` before `src` is read again, so a `splice` from
/// `src` that cannot proceed is always `src` having nothing to read (never a full
/// pipe), and clearing `src`'s readiness then is right.
async fn one_way(src: &TcpStream, dst: &TcpStream, (r, w): (OwnedFd, OwnedFd)) -> io::Result<u64> {
    let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
    let mut total = 0u64;
    loop {
        let n = loop {
            src.readable().await?;
            match src.try_io(Interest::READABLE, || {
                Ok(rustix::pipe::splice(src, None, &w, None, CHUNK, flags)?)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            match socket2::SockRef::from(dst).shutdown(Shutdown::Write) {
                // The peer has gone already: nothing left to tell it.
                Err(e) if e.kind() != io::ErrorKind::NotConnected => return Err(e),
                _ => return Ok(total),
            }
        }
        let mut left = n;
        while left > 0 {
            dst.writable().await?;
            match dst.try_io(Interest::WRITABLE, || {
                Ok(rustix::pipe::splice(&r, None, dst, None, left, flags)?)
            }) {
                Ok(0) => {
                    return Err(io::Error::other(
                        "splice from a pipe holding data moved nothing",
                    ))
                }
                Ok(m) => {
                    left -= m;
                    total += m as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }
}
