//! The XDP benchmark's and tests' own programs (`bpf/bench.c` of
//! svcproxy-dataplane, built beside svcproxy's): attached to an interface of a
//! test's namespace ([`TestXdp`]), and a frame generator run by `BPF_PROG_RUN`
//! in live-frames mode ([`Generator`]): frames the kernel sends out of a veth of
//! the generator's namespace, so the interface under test receives them in its
//! driver as it would from a wire, with no socket or skb of the sender's.
//!
//! Safety: every program attaches to an interface inside a namespace the test
//! created; its link is held by the returned value and goes with it (and with
//! the namespace).

use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use aya::maps::{Array, MapData, PerCpuArray};
use aya::programs::{Xdp, XdpMode};
use aya::{Ebpf, EbpfLoader};
use svcproxy_testkit::netns::in_netns;

/// `bench_cfg` of bench.c.
#[repr(C)]
#[derive(Clone, Copy)]
struct BenchCfg {
    template: [u8; TEMPLATE_LEN],
    pad: [u8; 2],
    out: u32,
    flows: u32,
    daddr: u32,
    dport: u16,
    dmac: [u8; 6],
    smac: [u8; 6],
    pad2: [u8; 6],
}

#[allow(unsafe_code)]
// SAFETY: plain old data, every bit pattern valid, no padding the compiler adds
// (the layout is bench.c's, padding spelled out).
unsafe impl aya::Pod for BenchCfg {}

const TEMPLATE_LEN: usize = 14 + 20 + 8;

impl Default for BenchCfg {
    fn default() -> Self {
        BenchCfg {
            template: [0; TEMPLATE_LEN],
            pad: [0; 2],
            out: 0,
            flows: 0,
            daddr: 0,
            dport: 0,
            dmac: [0; 6],
            smac: [0; 6],
            pad2: [0; 6],
        }
    }
}

/// One of bench.c's programs, loaded and attached in a test namespace's driver.
pub struct TestXdp {
    ebpf: Ebpf,
}

fn load(program: &str) -> Result<Ebpf> {
    let mut ebpf = EbpfLoader::new()
        .load_file(svcproxy_dataplane::ebpf::BENCH_OBJECT)
        .with_context(|| format!("loading {}", svcproxy_dataplane::ebpf::BENCH_OBJECT))?;
    let prog: &mut Xdp = ebpf
        .program_mut(program)
        .ok_or_else(|| anyhow!("no program {program}"))?
        .try_into()?;
    prog.load().with_context(|| format!("loading {program}"))?;
    Ok(ebpf)
}

fn write_cfg(ebpf: &mut Ebpf, cfg: BenchCfg) -> Result<()> {
    let mut map: Array<&mut MapData, BenchCfg> = Array::try_from(
        ebpf.map_mut("bench_cfg")
            .ok_or_else(|| anyhow!("no bench_cfg"))?,
    )?;
    map.set(0, cfg, 0)?;
    Ok(())
}

/// `/sys/class/net/IFACE/FILE` as `ns` sees it (`ip netns exec` mounts the
/// namespace's own /sys; a thread that only entered the namespace would read
/// the host's).
fn sys_net(ns: &str, iface: &str, file: &str) -> Result<String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "cat"])
        .arg(format!("/sys/class/net/{iface}/{file}"))
        .output()
        .context("running ip netns exec")?;
    if !out.status.success() {
        bail!(
            "{iface} in {ns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn ifindex(ns: &str, iface: &str) -> Result<u32> {
    Ok(sys_net(ns, iface, "ifindex")?.parse()?)
}

/// The MAC address of `iface` in `ns`.
pub fn mac(ns: &str, iface: &str) -> Result<[u8; 6]> {
    let text = sys_net(ns, iface, "address")?;
    let bytes: Vec<u8> = text
        .split(':')
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<_, _>>()?;
    bytes
        .try_into()
        .map_err(|_| anyhow!("{iface}: address {text:?}"))
}

impl TestXdp {
    /// `program` (bench_pass, bench_sink) on `iface` of `ns`.
    pub fn attach(ns: &str, iface: &str, program: &str) -> Result<TestXdp> {
        Self::attach_with(ns, iface, program, BenchCfg::default())
    }

    /// bench_floor on `iface` of `ns`: every IPv4 UDP packet rewritten to
    /// `to` and sent out of `out` (of `ns`), to the MAC `dmac`.
    pub fn floor(
        ns: &str,
        iface: &str,
        out: &str,
        to: (Ipv4Addr, u16),
        dmac: [u8; 6],
    ) -> Result<TestXdp> {
        let cfg = BenchCfg {
            out: ifindex(ns, out)?,
            daddr: u32::from_ne_bytes(to.0.octets()),
            dport: to.1.to_be(),
            dmac,
            smac: mac(ns, out)?,
            ..BenchCfg::default()
        };
        Self::attach_with(ns, iface, "bench_floor", cfg)
    }

    fn attach_with(ns: &str, iface: &str, program: &str, cfg: BenchCfg) -> Result<TestXdp> {
        let index = ifindex(ns, iface)?;
        let ns_name = ns.to_string();
        in_netns(ns, move || -> Result<TestXdp> {
            let mut ebpf = load(program)?;
            write_cfg(&mut ebpf, cfg)?;
            let prog: &mut Xdp = ebpf
                .program_mut(program)
                .ok_or_else(|| anyhow!("no program {program}"))?
                .try_into()?;
            prog.attach_to_if_index(index, XdpMode::Driver)
                .with_context(|| format!("attaching {program} to {iface} in {ns_name}"))?;
            Ok(TestXdp { ebpf })
        })?
    }

    /// Packets bench_sink counted (and bench_gen sent), over every CPU.
    pub fn count(&self) -> Result<u64> {
        let map: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(
            self.ebpf
                .map("bench_count")
                .ok_or_else(|| anyhow!("no bench_count"))?,
        )?;
        Ok(map.get(&0, 0)?.iter().sum())
    }
}

/// bench_gen, loaded in a namespace: IPv4 UDP frames out of one of its veths.
pub struct Generator {
    ns: String,
    ingress: u32,
    ebpf: Ebpf,
}

/// A UDP datagram from `from` to `to`, 64 bytes on the wire: its header (the
/// template) and the payload.
pub fn udp_frame(
    dmac: [u8; 6],
    smac: [u8; 6],
    from: (Ipv4Addr, u16),
    to: (Ipv4Addr, u16),
) -> [u8; 64] {
    let mut f = [0u8; 64];
    f[0..6].copy_from_slice(&dmac);
    f[6..12].copy_from_slice(&smac);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&50u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&from.0.octets());
    ip[16..20].copy_from_slice(&to.0.octets());
    let mut sum: u32 = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    let udp = &mut f[34..42];
    udp[0..2].copy_from_slice(&from.1.to_be_bytes());
    udp[2..4].copy_from_slice(&to.1.to_be_bytes());
    udp[4..6].copy_from_slice(&30u16.to_be_bytes());
    // Checksum 0: none (IPv4).
    f
}

/// `BPF_F_TEST_XDP_LIVE_FRAMES`.
const LIVE_FRAMES: u32 = 1 << 1;
/// `BPF_PROG_TEST_RUN`.
const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// `bpf_attr`'s `test` member.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    pad: u32,
}

/// `struct xdp_md`.
#[repr(C)]
#[derive(Default)]
struct XdpMd {
    data: u32,
    data_end: u32,
    data_meta: u32,
    ingress_ifindex: u32,
    rx_queue_index: u32,
    egress_ifindex: u32,
}

impl Generator {
    /// bench_gen in `ns`, sending `frame` out of `out` with `flows` source
    /// ports in turn (the frame's, and those after it).
    pub fn new(ns: &str, out: &str, frame: [u8; 64], flows: u32) -> Result<Generator> {
        let mut template = [0u8; TEMPLATE_LEN];
        template.copy_from_slice(&frame[..TEMPLATE_LEN]);
        let cfg = BenchCfg {
            template,
            out: ifindex(ns, out)?,
            flows,
            ..BenchCfg::default()
        };
        let ingress = cfg.out;
        let mut ebpf = in_netns(ns, || load("bench_gen"))??;
        write_cfg(&mut ebpf, cfg)?;
        Ok(Generator {
            ns: ns.to_string(),
            ingress,
            ebpf,
        })
    }

    /// Sends `frames` frames (`BPF_PROG_RUN`, live frames, from the
    /// generator's namespace); returns how long the kernel took.
    pub fn run(&mut self, frames: u32, payload: &[u8; 64]) -> Result<Duration> {
        let prog: &mut Xdp = self
            .ebpf
            .program_mut("bench_gen")
            .ok_or_else(|| anyhow!("no bench_gen"))?
            .try_into()?;
        let fd = prog.fd()?.as_fd().as_raw_fd();
        let ingress = self.ingress;
        let data = *payload;
        in_netns(&self.ns, move || -> Result<Duration> {
            let ctx = XdpMd {
                data_end: data.len() as u32,
                ingress_ifindex: ingress,
                ..XdpMd::default()
            };
            let attr = TestRunAttr {
                prog_fd: fd as u32,
                data_size_in: data.len() as u32,
                data_in: data.as_ptr() as u64,
                repeat: frames,
                ctx_size_in: std::mem::size_of::<XdpMd>() as u32,
                ctx_in: &ctx as *const XdpMd as u64,
                flags: LIVE_FRAMES,
                ..TestRunAttr::default()
            };
            let start = Instant::now();
            // SAFETY: attr and the buffers it points to outlive the call; the
            // kernel reads them and writes only attr's own fields.
            #[allow(unsafe_code)]
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_bpf,
                    BPF_PROG_TEST_RUN,
                    &attr as *const TestRunAttr,
                    std::mem::size_of::<TestRunAttr>(),
                )
            };
            if rc != 0 {
                bail!("BPF_PROG_RUN: {}", std::io::Error::last_os_error());
            }
            Ok(start.elapsed())
        })?
    }
}
