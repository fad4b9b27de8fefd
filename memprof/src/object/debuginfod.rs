//! Debug files from debuginfod servers, as gdb, perf, bpftrace and
//! systemd-coredump fetch them: when `DEBUGINFOD_URLS` names servers
//! (space-separated), a code file of the target that lacks its symbol
//! table or DWARF, and whose debug file is not installed, is asked for by
//! build id (`GET URL/buildid/HEX/debuginfo`, each server in turn).
//!
//! Files land in the debuginfod client cache every other tool shares
//! (`$DEBUGINFOD_CACHE_PATH`, else `$XDG_CACHE_HOME/debuginfod_client`,
//! else `~/.cache/debuginfod_client`, as `HEX/debuginfo`), so what gdb
//! fetched is used at once and what we fetch serves gdb.
//!
//! Fetching never blocks tracing or the dashboard: files are asked for by
//! one background thread as the target's files are first seen
//! ([`prefetch`]), and names improve when a file lands ([`generation`]
//! tells the symbolizer to look again). At the end of a one-shot trace the
//! report waits for the files still coming, at most `DEBUGINFOD_TIMEOUT`
//! seconds (30 by default), and says what it waited for.

use std::{
    collections::{HashSet, VecDeque},
    io::Read,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Condvar, Mutex, OnceLock,
    },
    time::{Duration, Instant},
};

use super::debugfile;

/// Seconds a request (and the report's wait) may take by default.
const DEFAULT_TIMEOUT_S: u64 = 30;
/// The largest debug file taken.
const MAX_BYTES: u64 = 4 << 30;

/// Where to ask and where to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub urls: Vec<String>,
    pub cache: PathBuf,
    pub timeout: Duration,
}

impl Config {
    /// The configuration the environment gives (`get` reads a variable);
    /// None when no server is named.
    pub fn from(get: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let urls: Vec<String> = get("DEBUGINFOD_URLS")?
            .split_whitespace()
            .map(|u| u.trim_end_matches('/').to_string())
            .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
            .collect();
        if urls.is_empty() {
            return None;
        }
        let non_empty = |k: &str| get(k).filter(|v| !v.is_empty());
        let cache = non_empty("DEBUGINFOD_CACHE_PATH")
            .map(PathBuf::from)
            .or_else(|| {
                non_empty("XDG_CACHE_HOME").map(|x| Path::new(&x).join("debuginfod_client"))
            })
            .or_else(|| {
                non_empty("HOME").map(|h| Path::new(&h).join(".cache/debuginfod_client"))
            })?;
        let timeout = get("DEBUGINFOD_TIMEOUT")
            .and_then(|t| t.trim().parse::<u64>().ok())
            .filter(|&t| t > 0)
            .unwrap_or(DEFAULT_TIMEOUT_S);
        Some(Self {
            urls,
            cache,
            timeout: Duration::from_secs(timeout),
        })
    }

    /// Where the debug file of build id `hex` is kept.
    pub fn cached_path(&self, hex: &str) -> PathBuf {
        self.cache.join(hex).join("debuginfo")
    }
}

/// The hex spelling of a build id.
pub fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the fetching thread has to do and has done.
#[derive(Default)]
struct State {
    queue: VecDeque<PathBuf>,
    /// Build ids asked for (or found in the cache) this session.
    asked: HashSet<Vec<u8>>,
    /// Servers that could not be reached: not asked again this session
    /// (a server behind a dropping firewall would cost a timeout a file).
    unreachable: HashSet<String>,
    busy: bool,
    worker: bool,
    fetched: usize,
    failed: usize,
}

struct Client {
    config: Config,
    state: Mutex<State>,
    changed: Condvar,
}

static CLIENT: OnceLock<Option<Client>> = OnceLock::new();

fn client() -> Option<&'static Client> {
    CLIENT
        .get_or_init(|| {
            Config::from(|k| std::env::var(k).ok()).map(|config| {
                tracing::info!(
                    "debuginfod: {} (cache {})",
                    config.urls.join(" "),
                    config.cache.display()
                );
                Client {
                    config,
                    state: Mutex::new(State::default()),
                    changed: Condvar::new(),
                }
            })
        })
        .as_ref()
}

/// Whether a server is configured.
pub fn enabled() -> bool {
    client().is_some()
}

/// The cached debug file of build id `id`, if one is there.
pub fn cached(id: &[u8]) -> Option<PathBuf> {
    let path = client()?.config.cached_path(&hex(id));
    std::fs::metadata(&path)
        .is_ok_and(|m| m.is_file() && m.len() > 0)
        .then_some(path)
}

/// Asks, in the background, for the debug file of the code file at
/// `binary` (a path we can open) if it needs one and none is installed.
pub fn prefetch(binary: &Path) {
    let Some(c) = client() else {
        return;
    };
    let mut s = c.state.lock().unwrap_or_else(|e| e.into_inner());
    s.queue.push_back(binary.to_path_buf());
    if !s.worker {
        s.worker = true;
        let spawned = std::thread::Builder::new()
            .name("debuginfod".into())
            .spawn(move || work(c));
        if spawned.is_err() {
            s.worker = false;
        }
    }
}

/// Bumped each time a debug file lands: names made before may improve.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// Debug files landed this session: read on every symbolizer lookup, so
/// an atomic rather than the state's lock.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// What waiting for the files still coming gave.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Waited {
    pub fetched: usize,
    pub failed: usize,
    /// Files still coming when the wait ended.
    pub pending: usize,
    /// Servers that could not be reached.
    pub unreachable: usize,
}

/// Waits until no file is being asked for, at most the configured timeout;
/// `progress` is called once if there is anything to wait for, with the
/// number of files queued or in flight.
pub fn wait(progress: impl FnOnce(usize)) -> Waited {
    let Some(c) = client() else {
        return Waited::default();
    };
    let deadline = Instant::now() + c.config.timeout;
    let mut s = c.state.lock().unwrap_or_else(|e| e.into_inner());
    let pending = |s: &State| s.queue.len() + usize::from(s.busy);
    if pending(&s) > 0 {
        progress(pending(&s));
    }
    while pending(&s) > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        s = c
            .changed
            .wait_timeout(s, left)
            .map_or_else(|e| e.into_inner().0, |(g, _)| g);
    }
    Waited {
        fetched: s.fetched,
        failed: s.failed,
        pending: pending(&s),
        unreachable: s.unreachable.len(),
    }
}

fn work(c: &'static Client) {
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(c.config.timeout)
        .timeout_read(c.config.timeout)
        .user_agent(concat!("memprof-ebpf/", env!("CARGO_PKG_VERSION")))
        .build();
    loop {
        let binary = {
            let mut s = c.state.lock().unwrap_or_else(|e| e.into_inner());
            match s.queue.pop_front() {
                Some(b) => {
                    s.busy = true;
                    b
                }
                None => {
                    s.busy = false;
                    s.worker = false;
                    c.changed.notify_all();
                    return;
                }
            }
        };
        let outcome = fetch_for(c, &agent, &binary);
        let mut s = c.state.lock().unwrap_or_else(|e| e.into_inner());
        match outcome {
            Outcome::Fetched => {
                s.fetched += 1;
                GENERATION.fetch_add(1, Ordering::Release);
            }
            Outcome::Failed => s.failed += 1,
            Outcome::Nothing => {}
        }
        c.changed.notify_all();
    }
}

enum Outcome {
    Fetched,
    Failed,
    Nothing,
}

/// Fetches the debug file of `binary` unless it has what one holds, one
/// is installed, it was asked for already, or it is in the cache.
fn fetch_for(c: &Client, agent: &ureq::Agent, binary: &Path) -> Outcome {
    let Some(links) = debugfile::links(binary) else {
        return Outcome::Nothing;
    };
    let Some(id) = links.build_id.clone().filter(|id| id.len() > 1) else {
        return Outcome::Nothing;
    };
    if links.symtab && links.dwarf {
        return Outcome::Nothing;
    }
    {
        let mut s = c.state.lock().unwrap_or_else(|e| e.into_inner());
        if !s.asked.insert(id.clone()) {
            return Outcome::Nothing;
        }
    }
    if debugfile::installed(binary, &links).is_some() || cached(&id).is_some() {
        return Outcome::Nothing;
    }
    let hex = hex(&id);
    let target = c.config.cached_path(&hex);
    for url in &c.config.urls {
        if c.state.lock().map_or(true, |s| s.unreachable.contains(url)) {
            continue;
        }
        let at = format!("{url}/buildid/{hex}/debuginfo");
        match download(agent, &at, &target) {
            Ok(bytes) => {
                tracing::info!("debuginfod: {} from {at} ({bytes} bytes)", binary.display());
                return Outcome::Fetched;
            }
            Err(Failure::Unreachable(e)) => {
                tracing::info!("debuginfod: {url} not reached, not asked again: {e}");
                if let Ok(mut s) = c.state.lock() {
                    s.unreachable.insert(url.clone());
                }
            }
            Err(Failure::Other(e)) => tracing::debug!("debuginfod: {at}: {e}"),
        }
    }
    Outcome::Failed
}

/// Why a download failed.
enum Failure {
    /// The server was not reached (no answer, name not resolved).
    Unreachable(String),
    /// It answered, but not with the file (404), or writing it failed.
    Other(String),
}

/// GETs `url` into `target` (through a temporary file beside it, so a
/// reader never sees half a file); the bytes written.
fn download(agent: &ureq::Agent, url: &str, target: &Path) -> Result<u64, Failure> {
    let response = agent.get(url).call().map_err(|e| match e {
        ureq::Error::Transport(t) => Failure::Unreachable(t.to_string()),
        e => Failure::Other(e.to_string()),
    })?;
    let dir = target.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".debuginfo.{}.tmp", std::process::id()));
    let written = (|| {
        std::fs::create_dir_all(dir)?;
        let mut file = std::fs::File::create(&tmp)?;
        let n = std::io::copy(&mut response.into_reader().take(MAX_BYTES), &mut file)?;
        file.sync_all()?;
        if n == 0 {
            return Err(std::io::Error::other("empty answer"));
        }
        std::fs::rename(&tmp, target)?;
        Ok(n)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(|e| Failure::Other(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn servers_cache_and_timeout_come_from_the_environment() {
        assert_eq!(Config::from(env(&[("HOME", "/root")])), None);
        assert_eq!(
            Config::from(env(&[("DEBUGINFOD_URLS", "  "), ("HOME", "/root")])),
            None
        );
        let c = Config::from(env(&[
            (
                "DEBUGINFOD_URLS",
                "https://debuginfod.debian.net/ ftp://x http://127.0.0.1:8002",
            ),
            ("HOME", "/home/u"),
        ]))
        .unwrap();
        assert_eq!(
            c.urls,
            ["https://debuginfod.debian.net", "http://127.0.0.1:8002"]
        );
        assert_eq!(c.cache, Path::new("/home/u/.cache/debuginfod_client"));
        assert_eq!(c.timeout, Duration::from_secs(DEFAULT_TIMEOUT_S));
        assert_eq!(
            c.cached_path("abcd"),
            Path::new("/home/u/.cache/debuginfod_client/abcd/debuginfo")
        );
        let c = Config::from(env(&[
            ("DEBUGINFOD_URLS", "http://h"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/home/u"),
            ("DEBUGINFOD_TIMEOUT", "5"),
        ]))
        .unwrap();
        assert_eq!(c.cache, Path::new("/x/debuginfod_client"));
        assert_eq!(c.timeout, Duration::from_secs(5));
        let c = Config::from(env(&[
            ("DEBUGINFOD_URLS", "http://h"),
            ("DEBUGINFOD_CACHE_PATH", "/var/cache/d"),
            ("XDG_CACHE_HOME", "/x"),
        ]))
        .unwrap();
        assert_eq!(c.cache, Path::new("/var/cache/d"));
    }

    #[test]
    fn build_ids_are_spelled_in_lower_hex() {
        assert_eq!(hex(&[0xd4, 0x0c, 0xff]), "d40cff");
    }
}
