//! Map writes in batches (`BPF_MAP_UPDATE_BATCH`, kernel 5.6+): one system call
//! for many keys, where aya 0.14 offers one per key. A full sync at 10k
//! services × 10 endpoints writes 110k keys. And a map's entries counted the
//! same way ([`count`], `BPF_MAP_LOOKUP_BATCH`): the LRU maps' fill, which the
//! programs change without svcproxy.

use std::os::fd::{AsFd, AsRawFd};

use aya::maps::MapData;

/// `BPF_MAP_LOOKUP_BATCH` and `BPF_MAP_UPDATE_BATCH` in `enum bpf_cmd`.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// Keys per system call: bounds the kernel's time in one call.
const CHUNK: usize = 8192;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Writes `keys[i]` → `values[i]` into `map`. `Err` names how many were written
/// before the failure; the kernel's error is the `io::Error`.
pub fn update<K: aya::Pod, V: aya::Pod>(
    map: &MapData,
    keys: &[K],
    values: &[V],
) -> Result<(), (usize, std::io::Error)> {
    assert_eq!(keys.len(), values.len(), "a value per key");
    let fd = map.fd().as_fd().as_raw_fd();
    let mut done = 0usize;
    while done < keys.len() {
        let n = (keys.len() - done).min(CHUNK);
        let mut attr = BatchAttr {
            keys: keys[done..].as_ptr() as u64,
            values: values[done..].as_ptr() as u64,
            count: n as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        match call(BPF_MAP_UPDATE_BATCH, &mut attr) {
            Ok(()) => done += n,
            Err(e) => return Err((done + attr.count as usize, e)),
        }
    }
    Ok(())
}

/// The entries of `map` (a hash map, LRU or not, of keys `key_size` and values
/// `value_size` bytes), read a chunk at a time and counted. Entries the programs
/// add or remove meanwhile may be counted or not.
pub fn count(map: &MapData, key_size: usize, value_size: usize) -> std::io::Result<usize> {
    let fd = map.fd().as_fd().as_raw_fd();
    let mut chunk = 4096usize;
    let mut keys = vec![0u8; chunk * key_size];
    let mut values = vec![0u8; chunk * value_size];
    // The hash maps' position: a bucket number.
    let (mut token, mut next) = (0u64, 0u64);
    let mut total = 0usize;
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &token as *const u64 as u64
            },
            out_batch: &mut next as *mut u64 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        match call(BPF_MAP_LOOKUP_BATCH, &mut attr) {
            Ok(()) => {
                total += attr.count as usize;
                token = next;
                first = false;
            }
            // The end: the last entries came with it.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Ok(total + attr.count as usize);
            }
            // One bucket holds more than a chunk: a larger chunk.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && chunk < 1 << 20 => {
                chunk *= 4;
                keys.resize(chunk * key_size, 0);
                values.resize(chunk * value_size, 0);
            }
            Err(e) => return Err(e),
        }
    }
}

#[allow(unsafe_code)]
fn call(cmd: libc::c_long, attr: &mut BatchAttr) -> std::io::Result<()> {
    // SAFETY: `attr` is a valid `bpf_attr` batch member whose `keys` and `values`
    // point at `count` keys and values of the map's sizes (the caller's buffers,
    // alive for the call), and whose batch positions, when set, at a u64 each;
    // the kernel reads or fills at most `count` of them and writes back `count`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut BatchAttr,
            std::mem::size_of::<BatchAttr>(),
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}
