//! What the loader reads of the target from `/proc`: its threads, their
//! names and its command line. Memory maps are in [`super::maps`].

/// Reads `/proc/PID/NAME`. When the main thread has exited (pthread_exit)
/// while others run, that file is empty, so the first live thread's
/// `/proc/PID/task/TID/NAME` is read instead.
pub fn read_proc(pid: u32, name: &str) -> std::io::Result<Vec<u8>> {
    let main = std::fs::read(format!("/proc/{pid}/{name}"))?;
    if !main.is_empty() {
        return Ok(main);
    }
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))?;
    for task in tasks.filter_map(|t| t.ok()) {
        if let Ok(text) = std::fs::read(task.path().join(name)) {
            if !text.is_empty() {
                return Ok(text);
            }
        }
    }
    Ok(main)
}

/// The fields of `/proc/PID/stat` after the command name: index 0 is
/// field 3 of proc(5), the state; 1 the parent's pid. None when the
/// process is gone.
pub fn stat_fields(pid: u32) -> Option<Vec<String>> {
    stat_fields_of(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Indices into [`stat_fields`]: proc(5) numbers the fields from 1, the
/// pid and the command name first, so its field N is index N - 3.
pub mod stat {
    /// User CPU time, in clock ticks (field 14).
    pub const UTIME: usize = 11;
    /// System CPU time, in clock ticks (field 15).
    pub const STIME: usize = 12;
    /// Threads in the process (field 20).
    pub const NUM_THREADS: usize = 17;
    /// The CPU the thread last ran on (field 39).
    pub const PROCESSOR: usize = 36;
}

/// Field `index` of [`stat_fields`] as a number.
pub fn stat_number<T: std::str::FromStr>(fields: &[String], index: usize) -> Option<T> {
    fields.get(index)?.parse().ok()
}

/// [`stat_fields`] of one thread of process `pid`.
pub fn thread_stat_fields(pid: u32, tid: u32) -> Option<Vec<String>> {
    stat_fields_of(&std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?)
}

/// [`stat_fields`] of a stat line. The command name may hold spaces and
/// parentheses, so the fields start after the last `)`.
fn stat_fields_of(stat: &str) -> Option<Vec<String>> {
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Thread ids of a process, from `/proc/PID/task`.
pub fn list_threads(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut tids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    tids
}

/// The live processes whose parent is `pid` now, with their names
/// (`comm`), by pid: `/proc/PID/stat` of every process (a thread's
/// `children` file lists only the children that thread forked). Zombies
/// (nothing to trace) and this process and its ancestors (`sudo
/// memprof-ebpf -p $$` from a shell) are left out.
pub fn child_processes(pid: u32) -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let ours = ancestors(std::process::id());
    let mut children: Vec<(u32, String)> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| !ours.contains(p))
        .filter(|&p| {
            stat_fields(p).is_some_and(|f| {
                f.first().is_some_and(|state| state != "Z")
                    && stat_number::<u32>(&f, 1) == Some(pid)
            })
        })
        .map(|p| (p, thread_name(p, p).unwrap_or_default()))
        .collect();
    children.sort_unstable();
    children
}

/// `pid` and the processes above it, up to the first without a parent.
fn ancestors(pid: u32) -> Vec<u32> {
    let mut line = vec![pid];
    while let Some(parent) = stat_fields(line[line.len() - 1])
        .and_then(|f| stat_number::<u32>(&f, 1))
        .filter(|&p| p != 0 && !line.contains(&p))
    {
        line.push(parent);
    }
    line
}

/// A thread's name (`comm`), or None when the thread is gone.
pub fn thread_name(pid: u32, tid: u32) -> Option<String> {
    let name = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
    Some(name.trim_end().to_string())
}

/// A thread's id in the innermost pid namespace it is in, when that is
/// not ours (a container's process): the last `NSpid` of its status.
pub fn namespace_tid(pid: u32, tid: u32) -> Option<u32> {
    innermost_ns_id(&thread_status(pid, tid)?)
}

/// The effective user and group of process `pid`; None when it is gone.
pub fn effective_owner(pid: u32) -> Option<(u32, u32)> {
    owner_in(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// The effective ids of a `status` file's `Uid:` and `Gid:` lines.
fn owner_in(status: &str) -> Option<(u32, u32)> {
    let effective = |key: &str| -> Option<u32> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(2)?.parse().ok()
    };
    Some((effective("Uid:")?, effective("Gid:")?))
}

/// A thread's `status` file, or None when the thread is gone.
fn thread_status(pid: u32, tid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()
}

/// The context switches, voluntary or not, of every thread of process
/// `pid` so far (threads gone since are not counted).
pub fn context_switches(pid: u32) -> u64 {
    list_threads(pid)
        .into_iter()
        .filter_map(|tid| thread_status(pid, tid))
        .map(|status| switches_in_status(&status))
        .sum()
}

/// The sum of a task `status` file's two `ctxt_switches` lines.
fn switches_in_status(status: &str) -> u64 {
    status
        .lines()
        .filter(|l| l.contains("ctxt_switches:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// The last id of the `NSpid:` line of a status file, if it has more than
/// one (the thread is in a pid namespace below ours).
fn innermost_ns_id(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let ids: Vec<&str> = line.split_whitespace().collect();
    if ids.len() < 2 {
        return None;
    }
    ids.last()?.parse().ok()
}

/// The command line of a process, space-separated.
pub fn command_line(pid: u32) -> Option<String> {
    let raw = read_proc(pid, "cmdline").ok()?;
    let parts: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    (!parts.is_empty()).then(|| parts.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_process_is_listed_under_its_parent() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep runs");
        let children = child_processes(std::process::id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            children
                .iter()
                .any(|(p, name)| *p == child.id() && name == "sleep"),
            "{children:?}"
        );
        assert_eq!(child_processes(u32::MAX - 1), []);
        // This process is its parent's child, but never a child to name.
        let me = std::process::id();
        let parent = stat_fields(me)
            .and_then(|f| stat_number::<u32>(&f, 1))
            .expect("a parent");
        assert!(child_processes(parent).iter().all(|(p, _)| *p != me));
    }

    #[test]
    fn the_effective_owner_is_read_from_the_status() {
        let status = "Name:\tx\nUid:\t1000\t1001\t1001\t1001\nGid:\t100\t102\t102\t102\n";
        assert_eq!(owner_in(status), Some((1001, 102)));
        assert_eq!(owner_in("Name:\tx\n"), None);
        // SAFETY: geteuid and getegid have no preconditions.
        let me = unsafe { (libc::geteuid(), libc::getegid()) };
        assert_eq!(effective_owner(std::process::id()), Some(me));
    }

    #[test]
    fn a_status_file_gives_both_switch_counts() {
        let status = "Name:\tsysbench\nThreads:\t5\n\
                      voluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t7\n";
        assert_eq!(switches_in_status(status), 127);
        assert_eq!(switches_in_status("Name:\tx\n"), 0);
        // This test's own threads have switched, and are counted.
        assert!(context_switches(std::process::id()) > 0);
    }

    #[test]
    fn stat_fields_start_after_the_last_parenthesis() {
        let stat = "42 (a) (b c) S 7 42 42 0 -1\n";
        let fields = stat_fields_of(stat).unwrap();
        assert_eq!(fields[..3], ["S", "7", "42"]);
        assert!(stat_fields_of("42 no name").is_none());
        let me = stat_fields(std::process::id()).expect("this process");
        assert!(["R", "S"].contains(&me[0].as_str()), "a live state: {me:?}");
        let parent: u32 = me[1].parse().expect("the parent's pid");
        assert_eq!(parent, std::os::unix::process::parent_id());
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(list_threads(me).contains(&me));
        assert!(thread_name(me, me).is_some());
        assert!(command_line(me).is_some());
    }

    #[test]
    fn a_gone_process_reads_as_nothing() {
        assert!(list_threads(u32::MAX - 1).is_empty());
        assert_eq!(command_line(u32::MAX - 1), None);
        assert_eq!(namespace_tid(u32::MAX - 1, u32::MAX - 1), None);
    }

    /// A container's thread has its own id in its pid namespace, the last
    /// of `NSpid`; ours are the same in our namespace (none reported).
    #[test]
    fn namespace_ids() {
        let me = std::process::id();
        assert_eq!(namespace_tid(me, me), None);
        assert_eq!(
            innermost_ns_id("Tgid:\t4711\nNSpid:\t4711\t12\nNSpgid: 1\n"),
            Some(12)
        );
        assert_eq!(innermost_ns_id("NSpid:\t4711\n"), None, "our namespace");
        assert_eq!(innermost_ns_id("NSpid:\t4711\t4711\n"), Some(4711));
        assert_eq!(innermost_ns_id("Pid: 1\n"), None);
    }
}
