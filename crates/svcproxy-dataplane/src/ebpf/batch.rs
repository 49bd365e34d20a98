//! Map writes in batches (`BPF_MAP_UPDATE_BATCH`, kernel 5.6+): one system call
//! for many keys, where aya 0.14 offers one per key. A full sync at 10k
//! services × 10 endpoints writes 110k keys.

use std::os::fd::{AsFd, AsRawFd};

use aya::maps::MapData;

/// `BPF_MAP_UPDATE_BATCH` in `enum bpf_cmd`.
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
        match call(&mut attr) {
            Ok(()) => done += n,
            Err(e) => return Err((done + attr.count as usize, e)),
        }
    }
    Ok(())
}

#[allow(unsafe_code)]
fn call(attr: &mut BatchAttr) -> std::io::Result<()> {
    // SAFETY: `attr` is a valid `bpf_attr` batch member whose `keys` and `values`
    // point at `count` keys and values of the map's sizes (the caller's slices,
    // alive for the call); the kernel reads them and writes back only `count`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_BATCH,
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
