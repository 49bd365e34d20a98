//! Bytes between a client's connection and its endpoint's, both ways, until both
//! directions have ended.
//!
//! Entry point: [`relay`]. With `zero_copy` (the default, `--userspace-zero-copy`)
//! each direction moves its bytes with `splice(2)` through a pipe of its own: the
//! kernel hands socket buffers' pages from one socket to the other, and the proxy
//! never reads them into its memory. Pipes left empty by a connection are kept
//! for the next ones. Without it, or when a pipe cannot be had (out of file
//! descriptors), tokio's buffered `copy_bidirectional` does the same job.
//!
//! Either way a direction that reaches its end of file shuts down the writing side
//! of the other socket (a half-close is passed on) while the other direction goes
//! on; an error in either direction ends both.

use std::io;
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::sync::Mutex;

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
        if let (Ok(up), Ok(down)) = (Pipe::take(), Pipe::take()) {
            let (c, u) = (&*client, &*upstream);
            let moved = tokio::try_join!(one_way(c, u, &up), one_way(u, c, &down));
            // After an end of file both pipes are empty; after a reset one may not
            // be (it is then closed, and what it held goes with the connection).
            up.give_back();
            down.give_back();
            return moved;
        }
    }
    tokio::io::copy_bidirectional(client, upstream).await
}

/// A pipe: its read end and its write end.
struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
}

/// Empty pipes kept for the next connections: two new ones per connection cost six
/// system calls (two `pipe2`, four `close`), a tenth of what a short connection
/// costs the proxy.
static SPARE: Mutex<Vec<Pipe>> = Mutex::new(Vec::new());

/// Spare pipes kept at most (each holds two descriptors and no memory while empty).
const MAX_SPARE: usize = 256;

impl Pipe {
    /// A spare pipe, else a new one.
    fn take() -> io::Result<Pipe> {
        if let Some(p) = SPARE.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(p);
        }
        let (r, w) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        Ok(Pipe { r, w })
    }

    /// Keeps the pipe for another connection if it is empty.
    fn give_back(self) {
        if !matches!(rustix::io::ioctl_fionread(&self.r), Ok(0)) {
            return;
        }
        let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
        if spare.len() < MAX_SPARE {
            spare.push(self);
        }
    }
}

/// One direction: from `src` into the pipe, from the pipe to `dst`, until `src`'s
/// end of file, which becomes a shutdown of `dst`'s writing.
///
/// The pipe is emptied into `dst` before `src` is read again, so a `splice` from
/// `src` that cannot proceed is always `src` having nothing to read (never a full
/// pipe), and clearing `src`'s readiness then is right.
async fn one_way(src: &TcpStream, dst: &TcpStream, pipe: &Pipe) -> io::Result<u64> {
    let (r, w) = (&pipe.r, &pipe.w);
    let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
    let mut total = 0u64;
    loop {
        let n = loop {
            src.readable().await?;
            match src.try_io(Interest::READABLE, || {
                Ok(rustix::pipe::splice(src, None, w, None, CHUNK, flags)?)
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
                Ok(rustix::pipe::splice(r, None, dst, None, left, flags)?)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spare() -> usize {
        SPARE.lock().unwrap().len()
    }

    #[test]
    fn only_empty_pipes_are_kept_for_the_next_connection() {
        let before = spare();
        let full = Pipe::take().unwrap();
        rustix::io::write(&full.w, b"left over").unwrap();
        full.give_back();
        assert_eq!(spare(), before, "a pipe holding data was kept");
        let empty = Pipe::take().unwrap();
        let fd = {
            use std::os::fd::AsRawFd;
            empty.r.as_raw_fd()
        };
        empty.give_back();
        assert_eq!(spare(), before + 1);
        let again = Pipe::take().unwrap();
        assert_eq!(
            std::os::fd::AsRawFd::as_raw_fd(&again.r),
            fd,
            "the spare pipe is reused"
        );
    }
}
