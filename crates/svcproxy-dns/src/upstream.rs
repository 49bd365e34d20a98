//! Names the catalog is not the authority for go to upstream resolvers: those of
//! `--dns-upstream`, else the `nameserver`s of `/etc/resolv.conf`. The client's
//! query is relayed as it came (same id, same EDNS), over the transport it came on,
//! to each upstream in turn until one answers.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long one upstream may take to answer before the next is asked.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);

/// The `nameserver` addresses of a resolv.conf text (port 53), in order; others
/// lines and malformed ones are skipped.
pub fn from_resolv_conf(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next()? == "nameserver").then_some(())?;
            // `fe80::1%eth0`: the zone is dropped (no scoped addresses here).
            let ip = words.next()?.split('%').next()?;
            ip.parse::<IpAddr>().ok()
        })
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// `IP` or `IP:PORT` (`[IPv6]:PORT`), port 53 when not given.
pub fn parse_upstream(s: &str) -> Option<SocketAddr> {
    let s = s.trim();
    s.parse::<SocketAddr>()
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53)))
}

/// The upstreams to use when serving on `bound`: `configured` if any, else
/// resolv.conf's, without `bound` itself (a server forwarding to itself would loop).
pub fn choose(configured: &[SocketAddr], resolv_conf: &str, bound: SocketAddr) -> Vec<SocketAddr> {
    let list = if configured.is_empty() {
        from_resolv_conf(resolv_conf)
    } else {
        configured.to_vec()
    };
    list.into_iter()
        .filter(|u| {
            !(u.port() == bound.port()
                && (u.ip() == bound.ip() || (bound.ip().is_unspecified() && u.ip().is_loopback())))
        })
        .collect()
}

/// Relays the raw query `q` (id `id`) to each of `upstreams` in turn, over TCP when
/// `tcp`, else UDP; the first answer carrying that id.
pub async fn forward(upstreams: &[SocketAddr], q: &[u8], id: u16, tcp: bool) -> Option<Message> {
    for up in upstreams {
        let asked = if tcp {
            ask_tcp(*up, q).await
        } else {
            ask_udp(*up, q).await
        };
        match asked {
            Ok(m) if m.metadata.id == id => return Some(m),
            Ok(_) => tracing::debug!(upstream = %up, "upstream answered another id"),
            Err(e) => tracing::debug!(upstream = %up, error = %e, "upstream did not answer"),
        }
    }
    None
}

async fn ask_udp(up: SocketAddr, q: &[u8]) -> std::io::Result<Message> {
    let local: SocketAddr = if up.is_ipv4() {
        (IpAddr::from([0u8; 4]), 0).into()
    } else {
        (IpAddr::from([0u16; 8]), 0).into()
    };
    let s = tokio::net::UdpSocket::bind(local).await?;
    s.connect(up).await?;
    s.send(q).await?;
    let mut buf = vec![0u8; 65535];
    let n = tokio::time::timeout(UPSTREAM_TIMEOUT, s.recv(&mut buf))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    decode(&buf[..n])
}

async fn ask_tcp(up: SocketAddr, q: &[u8]) -> std::io::Result<Message> {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(up).await?;
        let len = u16::try_from(q.len()).map_err(std::io::Error::other)?;
        s.write_all(&len.to_be_bytes()).await?;
        s.write_all(q).await?;
        let mut len = [0u8; 2];
        s.read_exact(&mut len).await?;
        let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
        s.read_exact(&mut buf).await?;
        decode(&buf)
    };
    tokio::time::timeout(UPSTREAM_TIMEOUT, exchange)
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
}

fn decode(bytes: &[u8]) -> std::io::Result<Message> {
    Message::from_vec(bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_nameservers_in_order_and_never_ourselves() {
        let conf = "# comment\nsearch svc.cluster.local\nnameserver 10.0.0.2\nnameserver fe80::1%eth0\noptions ndots:5\nnameserver bogus\nnameserver 127.0.0.1\n";
        assert_eq!(
            from_resolv_conf(conf),
            [
                "10.0.0.2:53".parse().unwrap(),
                "[fe80::1]:53".parse().unwrap(),
                "127.0.0.1:53".parse::<SocketAddr>().unwrap()
            ]
        );
        let bound: SocketAddr = "0.0.0.0:53".parse().unwrap();
        assert_eq!(
            choose(&[], conf, bound),
            [
                "10.0.0.2:53".parse::<SocketAddr>().unwrap(),
                "[fe80::1]:53".parse().unwrap()
            ],
            "a wildcard bind on 53 would answer 127.0.0.1:53 itself"
        );
        let configured = [
            parse_upstream("192.0.2.1").unwrap(),
            parse_upstream("[2001:db8::1]:5353").unwrap(),
        ];
        assert_eq!(
            choose(&configured, conf, bound),
            configured,
            "the flag wins"
        );
        assert_eq!(parse_upstream("not an address"), None);
    }
}
