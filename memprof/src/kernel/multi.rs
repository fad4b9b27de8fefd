//! `uprobe_multi` links: one link for all of a program's probe points in a
//! file (kernel ≥ 6.6), so that detaching a window costs the kernel one
//! grace period per program instead of one per probed function.
//!
//! aya 0.14 neither loads a program for this attach type nor creates the
//! link, so the hot programs are loaded a second time here, from the same
//! object, with `expected_attach_type = BPF_TRACE_UPROBE_MULTI`, sharing
//! the maps aya created (their file descriptors fill the object's map
//! relocations), and linked with `BPF_LINK_CREATE`.

use std::{
    collections::{HashMap, HashSet},
    ffi::{CStr, CString},
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
};

use aya::{maps::Map, Ebpf};
use aya_obj::generated::{bpf_attach_type, bpf_cmd, bpf_insn, bpf_prog_type};

use crate::error::Result;

/// `BPF_F_UPROBE_MULTI_RETURN`: the link's probes are return probes.
const RETURN_PROBES: u32 = aya_obj::generated::BPF_F_UPROBE_MULTI_RETURN;
/// Bytes of verifier log kept when a program is refused.
const LOG_BYTES: usize = 64 * 1024;

/// The hot programs, loaded for `uprobe_multi` links, by name.
pub struct MultiPrograms {
    /// Each program's descriptor, and whether it is a return probe.
    fds: HashMap<&'static str, (OwnedFd, bool)>,
}

impl MultiPrograms {
    /// Loads `names` from `object` for `uprobe_multi` links, with the maps
    /// `ebpf` (loaded from the same object) created. Call before any map
    /// is taken out of `ebpf`.
    pub fn load(object: &[u8], ebpf: &Ebpf, names: &[&'static str]) -> Result<Self> {
        let mut obj = aya_obj::Object::parse(object)
            .map_err(|e| anyhow::anyhow!("parsing the eBPF object: {e}"))?;
        let fds: HashMap<&str, RawFd> = ebpf
            .maps()
            .map(|(name, map)| (name, map_fd(map).as_raw_fd()))
            .collect();
        let text_sections: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
        let maps: Vec<(String, RawFd, aya_obj::Map)> = obj
            .maps
            .iter()
            .filter_map(|(name, m)| {
                fds.get(name.as_str())
                    .map(|fd| (name.clone(), *fd, m.clone()))
            })
            .collect();
        obj.relocate_maps(
            maps.iter().map(|(n, fd, m)| (n.as_str(), *fd, m)),
            &text_sections,
        )
        .map_err(|e| anyhow::anyhow!("relocating the maps: {e}"))?;
        obj.relocate_calls(&text_sections)
            .map_err(|e| anyhow::anyhow!("relocating calls: {e}"))?;
        let mut loaded = HashMap::new();
        for &name in names {
            let prog = obj
                .programs
                .get(name)
                .ok_or_else(|| anyhow::anyhow!("program {name} missing from the eBPF object"))?;
            let function = obj
                .functions
                .get(&prog.function_key())
                .ok_or_else(|| anyhow::anyhow!("program {name} has no code"))?;
            let fd = load_program(name, &function.instructions, &prog.license)
                .map_err(|e| anyhow::anyhow!("loading {name} for uprobe_multi: {e}"))?;
            let ret = matches!(prog.section, aya_obj::ProgramSection::URetProbe { .. });
            loaded.insert(name, (fd, ret));
        }
        Ok(Self { fds: loaded })
    }

    /// Attaches program `name` at `offsets` of `path` (each with its
    /// cookie), for process `pid` only, as entry or return probes as its
    /// section says. Closing the returned link detaches all of them at
    /// once.
    pub fn attach(
        &self,
        name: &str,
        path: &str,
        offsets: &[u64],
        cookies: &[u64],
        pid: u32,
    ) -> io::Result<OwnedFd> {
        let (prog, ret) = self
            .fds
            .get(name)
            .ok_or_else(|| io::Error::other(format!("{name} was not loaded for uprobe_multi")))?;
        // The file the target maps, which our namespace may name otherwise.
        let path = crate::process::objects::open_path(path);
        let path =
            CString::new(path.into_os_string().into_encoded_bytes()).map_err(io::Error::other)?;
        link_create(prog.as_fd(), &path, offsets, cookies, pid, *ret)
    }
}

impl MultiPrograms {
    /// The kernel's ids of the programs.
    pub fn ids(&self) -> Vec<u32> {
        self.fds
            .values()
            .filter_map(|(fd, _)| prog_info(fd.as_fd()).ok().map(|i| i.id))
            .collect()
    }

    /// Each program's run count and run time in ns so far, by name (zero
    /// while the kernel keeps no statistics).
    pub fn runs(&self) -> Vec<(&'static str, u64, u64)> {
        self.fds
            .iter()
            .filter_map(|(name, (fd, _))| {
                let info = prog_info(fd.as_fd()).ok()?;
                Some((*name, info.run_cnt, info.run_time_ns))
            })
            .collect()
    }
}

/// `BPF_OBJ_GET_INFO_BY_FD` for a program.
fn prog_info(fd: BorrowedFd<'_>) -> io::Result<aya_obj::generated::bpf_prog_info> {
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    // SAFETY: bpf_prog_info is plain integers (and pointers the kernel
    // only follows when their lengths are non-zero): all-zero is valid.
    let mut info: aya_obj::generated::bpf_prog_info = unsafe { std::mem::zeroed() };
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of_val(&info) as u32,
        info: &mut info as *mut _ as u64,
    };
    // SAFETY: `info` is writable for `info_len` bytes during the call. The
    // call returns 0, not a descriptor: nothing to close.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_long,
            &mut attr as *mut InfoAttr,
            std::mem::size_of::<InfoAttr>() as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info)
}

/// The file descriptor of one of aya's maps.
fn map_fd(map: &Map) -> BorrowedFd<'_> {
    let data = match map {
        Map::Array(d)
        | Map::ArrayOfMaps(d)
        | Map::BloomFilter(d)
        | Map::CgroupArray(d)
        | Map::CgroupStorage(d)
        | Map::CgrpStorage(d)
        | Map::CpuMap(d)
        | Map::DevMap(d)
        | Map::DevMapHash(d)
        | Map::HashMap(d)
        | Map::HashOfMaps(d)
        | Map::InodeStorage(d)
        | Map::LpmTrie(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuCgroupStorage(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::PerfEventArray(d)
        | Map::ProgramArray(d)
        | Map::Queue(d)
        | Map::ReusePortSockArray(d)
        | Map::RingBuf(d)
        | Map::SockHash(d)
        | Map::SockMap(d)
        | Map::SkStorage(d)
        | Map::Stack(d)
        | Map::StackTraceMap(d)
        | Map::Unsupported(d)
        | Map::XskMap(d) => d,
    };
    data.fd().as_fd()
}

/// `union bpf_attr` for `BPF_PROG_LOAD`, up to `expected_attach_type`
/// (the kernel zero-fills what a shorter attribute leaves out).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `union bpf_attr` for `BPF_LINK_CREATE` with its `uprobe_multi` part.
#[repr(C)]
#[derive(Default)]
struct UprobeMultiLinkAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    _pad: u32,
}

/// The `bpf(2)` system call; returns the new descriptor.
///
/// # Safety
/// `attr` must be the attribute `cmd` expects, and every pointer in it
/// valid for the kernel to read (or write, for a log buffer) meanwhile.
unsafe fn bpf<T>(cmd: bpf_cmd, attr: &mut T) -> io::Result<OwnedFd> {
    // SAFETY: the caller vouches for `attr`; its size is passed along.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *mut T,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the call succeeded and returned a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Loads one kprobe-type program for `uprobe_multi` links; on refusal the
/// error carries the end of the verifier's log.
fn load_program(name: &str, insns: &[bpf_insn], license: &CStr) -> io::Result<OwnedFd> {
    let mut attr = ProgLoadAttr {
        prog_type: bpf_prog_type::BPF_PROG_TYPE_KPROBE as u32,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        expected_attach_type: bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32,
        ..Default::default()
    };
    for (dst, src) in attr.prog_name[..15].iter_mut().zip(name.bytes()) {
        *dst = src;
    }
    // SAFETY: `insns` and `license` outlive the call.
    match unsafe { bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr) } {
        Ok(fd) => Ok(fd),
        Err(first) => {
            let mut log = vec![0u8; LOG_BYTES];
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
            // SAFETY: as above, and `log` is writable for `log_size` bytes.
            let _ = unsafe { bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr) };
            let text = String::from_utf8_lossy(&log);
            let text = text.trim_end_matches('\0').trim();
            let tail: String = text.lines().rev().take(3).collect::<Vec<_>>().join(" / ");
            Err(io::Error::new(first.kind(), format!("{first} ({tail})")))
        }
    }
}

/// Creates a `uprobe_multi` link.
fn link_create(
    prog: BorrowedFd<'_>,
    path: &CStr,
    offsets: &[u64],
    cookies: &[u64],
    pid: u32,
    ret: bool,
) -> io::Result<OwnedFd> {
    if offsets.is_empty() || offsets.len() != cookies.len() {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let mut attr = UprobeMultiLinkAttr {
        prog_fd: prog.as_raw_fd() as u32,
        attach_type: bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32,
        path: path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        cookies: cookies.as_ptr() as u64,
        cnt: offsets.len() as u32,
        multi_flags: if ret { RETURN_PROBES } else { 0 },
        pid,
        ..Default::default()
    };
    // SAFETY: `path`, `offsets` and `cookies` outlive the call and hold
    // `cnt` entries each.
    unsafe { bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_have_the_kernels_layout() {
        assert_eq!(std::mem::offset_of!(ProgLoadAttr, prog_name), 48);
        assert_eq!(std::mem::offset_of!(ProgLoadAttr, expected_attach_type), 68);
        assert_eq!(std::mem::offset_of!(UprobeMultiLinkAttr, path), 16);
        assert_eq!(std::mem::offset_of!(UprobeMultiLinkAttr, cnt), 48);
        assert_eq!(std::mem::offset_of!(UprobeMultiLinkAttr, pid), 56);
    }
}
