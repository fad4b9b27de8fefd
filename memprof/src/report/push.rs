//! `--push URL` (experimental): the pprof profiles sent to a
//! Pyroscope-compatible ingest endpoint (`POST URL/ingest`, the
//! documented HTTP API of Grafana Pyroscope), at the end of the session
//! and, with `--push-every`, periodically while it runs.
//!
//! The profiles are cumulative since the session started; each request
//! also carries the previous one sent for the same concern
//! (`prev_profile`), so the server turns cumulative types into the
//! interval's delta itself (`sample_type_config` says which types are
//! cumulative: all but the in-use heap, a snapshot).

use std::{
    collections::HashMap,
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use super::{
    pprof,
    profiles::{main_object, profiles, ProfileKind},
    Report,
};

/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// What `--push` was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushSettings {
    /// The server's base URL (`http://host:4040`).
    pub url: String,
    /// The application name (`--app`), else the target's command.
    pub app: Option<String>,
    /// `--push-every`: also push this often while tracing.
    pub every: Option<Duration>,
}

/// One request: a concern's profile over `[from, until]` (Unix seconds).
#[derive(Debug, Clone, PartialEq)]
pub struct Upload {
    pub kind: ProfileKind,
    pub from: u64,
    pub until: u64,
    pub profile: Vec<u8>,
    pub prev: Option<Vec<u8>>,
}

/// The pushes of one session.
pub struct Pusher {
    settings: PushSettings,
    app: String,
    pid: u32,
    /// Unix seconds of the last push (the next one starts there).
    last_until: u64,
    /// The last profile sent per concern.
    last: HashMap<&'static str, Vec<u8>>,
    next_due: Option<Instant>,
    inflight: Option<JoinHandle<Vec<String>>>,
    /// Requests sent, and the errors met.
    pub sent: usize,
    pub errors: Vec<String>,
}

impl Pusher {
    /// `command`: the target's command line, whose program names the
    /// application unless `--app` did.
    pub fn new(settings: PushSettings, command: &str, pid: u32) -> Self {
        let app = settings.app.clone().unwrap_or_else(|| app_name(command));
        Self {
            next_due: settings.every.map(|e| Instant::now() + e),
            settings,
            app,
            pid,
            last_until: unix_now(),
            last: HashMap::new(),
            inflight: None,
            sent: 0,
            errors: Vec::new(),
        }
    }

    /// The pusher of a session, if `--push` was given.
    pub fn for_session(settings: Option<&PushSettings>, command: &str, pid: u32) -> Option<Self> {
        settings.map(|s| Self::new(s.clone(), command, pid))
    }

    /// Whether a periodic push is due now (and the last one is done).
    pub fn due(&self) -> bool {
        self.next_due.is_some_and(|t| t <= Instant::now())
            && self.inflight.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Sends the profiles of `report` on a thread of their own (the
    /// session's loop must not wait for the network).
    pub fn push_in_background(&mut self, report: &Report) {
        self.collect_inflight();
        let uploads = self.uploads(report);
        let requests: Vec<_> = uploads.iter().map(|u| self.request(u)).collect();
        self.sent += requests.len();
        self.inflight = Some(std::thread::spawn(move || send_all(requests)));
        self.next_due = self.settings.every.map(|e| Instant::now() + e);
    }

    /// The last push, at the end of the session: waits for it.
    pub fn finish(&mut self, report: &Report) {
        self.collect_inflight();
        let uploads = self.uploads(report);
        let requests: Vec<_> = uploads.iter().map(|u| self.request(u)).collect();
        self.sent += requests.len();
        self.errors.extend(send_all(requests));
    }

    fn collect_inflight(&mut self) {
        if let Some(h) = self.inflight.take() {
            match h.join() {
                Ok(errors) => self.errors.extend(errors),
                Err(_) => self.errors.push("a push thread panicked".into()),
            }
        }
    }

    /// The uploads for `report` since the last push, remembered as the
    /// previous profiles of the next.
    fn uploads(&mut self, report: &Report) -> Vec<Upload> {
        let until = unix_now().max(self.last_until + 1);
        let from = self.last_until;
        self.last_until = until;
        let main = main_object(report);
        let mut no_build_ids = |_: &str| None;
        let mut out = Vec::new();
        for p in profiles(report) {
            let encoded = pprof::encode(
                &p,
                main.as_deref(),
                (from as i64) * 1_000_000_000,
                &mut no_build_ids,
            );
            let Ok(bytes) = pprof::to_gzip(&encoded) else {
                continue;
            };
            let prev = self.last.insert(p.kind.name(), bytes.clone());
            out.push(Upload {
                kind: p.kind,
                from,
                until,
                profile: bytes,
                prev,
            });
        }
        out
    }

    /// The URL and multipart body of one upload.
    fn request(&self, u: &Upload) -> Request {
        let query = [
            (
                "name",
                format!("{}.{}{{pid={}}}", self.app, u.kind.name(), self.pid),
            ),
            ("from", u.from.to_string()),
            ("until", u.until.to_string()),
            ("format", "pprof".into()),
            ("spyName", "memprof-ebpf".into()),
        ];
        let query: Vec<String> = query
            .iter()
            .map(|(k, v)| format!("{k}={}", percent_encode(v)))
            .collect();
        let url = format!(
            "{}/ingest?{}",
            self.settings.url.trim_end_matches('/'),
            query.join("&")
        );
        let (content_type, body) = multipart(u);
        Request {
            url,
            content_type,
            body,
        }
    }

    /// For the summary: what was pushed where.
    pub fn summary(&self) -> String {
        let url = &self.settings.url;
        match self.errors.first() {
            None => format!("pushed {} profiles to {url} as {}", self.sent, self.app),
            Some(e) => format!(
                "pushing to {url}: {} of {} requests failed; first: {e}",
                self.errors.len(),
                self.sent
            ),
        }
    }
}

/// A request ready to send.
pub struct Request {
    pub url: String,
    pub content_type: String,
    pub body: Vec<u8>,
}

fn send_all(requests: Vec<Request>) -> Vec<String> {
    let agent = ureq::AgentBuilder::new().timeout(TIMEOUT).build();
    requests
        .into_iter()
        .filter_map(|r| {
            agent
                .post(&r.url)
                .set("Content-Type", &r.content_type)
                .send_bytes(&r.body)
                .err()
                .map(|e| e.to_string())
        })
        .collect()
}

/// The application name from a command line: its program's file name.
pub fn app_name(command: &str) -> String {
    let program = command.split_whitespace().next().unwrap_or("unknown");
    let name = program.rsplit('/').next().unwrap_or(program);
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.is_empty() {
        "unknown".into()
    } else {
        clean
    }
}

/// The upload as `multipart/form-data`: the profile, the previous one,
/// and how the server should treat each sample type.
fn multipart(u: &Upload) -> (String, Vec<u8>) {
    let boundary = format!("memprof-ebpf-{:016x}", fingerprint(&u.profile));
    let mut body = Vec::new();
    let mut part = |name: &str, filename: Option<&str>, data: &[u8]| {
        body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        let disposition = match filename {
            Some(f) => format!("Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\nContent-Type: application/octet-stream\r\n\r\n"),
            None => format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n"),
        };
        body.extend_from_slice(disposition.as_bytes());
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    };
    part("profile", Some("profile.pb.gz"), &u.profile);
    if let Some(prev) = &u.prev {
        part("prev_profile", Some("prev_profile.pb.gz"), prev);
    }
    part(
        "sample_type_config",
        Some("sample_type_config.json"),
        sample_type_config().as_bytes(),
    );
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// Units and aggregation of our sample types, in the server's terms.
fn sample_type_config() -> String {
    let types = [
        ("samples", "samples", true),
        ("alloc_objects", "objects", true),
        ("alloc_space", "bytes", true),
        ("inuse_objects", "objects", false),
        ("inuse_space", "bytes", false),
        ("contentions", "lock_samples", true),
        ("delay", "lock_nanoseconds", true),
        ("caused_delay", "lock_nanoseconds", true),
        ("accesses", "samples", true),
        ("invalidations", "samples", true),
    ];
    let entries: Vec<String> = types
        .iter()
        .map(|(t, units, cumulative)| {
            let aggregation = if *cumulative { "sum" } else { "average" };
            format!(
                "\"{t}\":{{\"units\":\"{units}\",\"aggregation\":\"{aggregation}\",\"cumulative\":{cumulative}}}"
            )
        })
        .collect();
    format!("{{{}}}", entries.join(","))
}

/// A boundary that does not occur in the data (checked by the caller's
/// tests; 64 random-looking bits from the data itself).
fn fingerprint(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_application_is_named_after_the_program() {
        assert_eq!(
            app_name("/usr/bin/redis-server 127.0.0.1:6379"),
            "redis-server"
        );
        assert_eq!(app_name("./a b"), "a");
        assert_eq!(app_name("weird{name}"), "weird_name_");
        assert_eq!(app_name(""), "unknown");
    }

    #[test]
    fn the_body_is_multipart_with_every_part() {
        let u = Upload {
            kind: ProfileKind::Lock,
            from: 10,
            until: 20,
            profile: b"PROFILE".to_vec(),
            prev: Some(b"PREV".to_vec()),
        };
        let (ct, body) = multipart(&u);
        let boundary = ct.strip_prefix("multipart/form-data; boundary=").unwrap();
        let text = String::from_utf8(body).unwrap();
        assert!(text.starts_with(&format!("--{boundary}\r\n")));
        assert!(text.ends_with(&format!("--{boundary}--\r\n")));
        assert!(text.contains("name=\"profile\"; filename=\"profile.pb.gz\""));
        assert!(text.contains("\r\n\r\nPROFILE\r\n"));
        assert!(text.contains("name=\"prev_profile\""));
        assert!(text.contains("\r\n\r\nPREV\r\n"));
        let config_part = text.split("sample_type_config.json\"").nth(1).unwrap();
        let config = config_part.split("\r\n\r\n").nth(1).unwrap();
        let config: serde_json::Value =
            serde_json::from_str(config.split("\r\n").next().unwrap()).unwrap();
        assert_eq!(config["inuse_space"]["cumulative"], false);
        assert_eq!(config["delay"]["units"], "lock_nanoseconds");
    }

    #[test]
    fn the_query_names_the_application_and_the_interval() {
        let p = Pusher::new(
            PushSettings {
                url: "http://h:4040/".into(),
                app: None,
                every: None,
            },
            "/bin/prog x",
            42,
        );
        let u = Upload {
            kind: ProfileKind::Cpu,
            from: 100,
            until: 110,
            profile: Vec::new(),
            prev: None,
        };
        let r = p.request(&u);
        assert_eq!(
            r.url,
            "http://h:4040/ingest?name=prog.cpu%7Bpid%3D42%7D&from=100&until=110&format=pprof&spyName=memprof-ebpf"
        );
        assert!(r.content_type.starts_with("multipart/form-data; boundary="));
    }
}
