//! Errors a session can end with, and the exit code each maps to.

use std::path::PathBuf;

/// Process exit codes (also listed in `--help`).
pub mod exit_code {
    pub const OK: i32 = 0;
    pub const INTERNAL: i32 = 1;
    pub const USAGE: i32 = 2;
    pub const NO_SUCH_PROCESS: i32 = 3;
    pub const PRIVILEGE: i32 = 4;
    pub const KERNEL_FEATURE: i32 = 5;
    pub const LAUNCH_FAILED: i32 = 6;
}

/// Why a session could not run. Each variant's message tells the user what
/// to do next.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Usage(String),

    #[error("no such process: {pid} (check the pid with `ps -p {pid}`)")]
    NoSuchProcess { pid: u32 },

    #[error("cannot launch `{command}`: {reason}")]
    LaunchFailed { command: String, reason: String },

    #[error("insufficient privilege: {0}")]
    Privilege(String),

    #[error("the kernel lacks {feature}: {hint}")]
    KernelFeature { feature: &'static str, hint: String },

    #[error("cannot write {what} to {path}: {source}")]
    Output {
        /// "the JSON report", "the log", ...
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },

    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) => exit_code::USAGE,
            Error::NoSuchProcess { .. } => exit_code::NO_SUCH_PROCESS,
            Error::LaunchFailed { .. } => exit_code::LAUNCH_FAILED,
            Error::Privilege(_) => exit_code::PRIVILEGE,
            Error::KernelFeature { .. } => exit_code::KERNEL_FEATURE,
            Error::Output { .. } | Error::Internal(_) => exit_code::INTERNAL,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_code() {
        let errors = [
            Error::Usage("x".into()),
            Error::NoSuchProcess { pid: 1 },
            Error::LaunchFailed {
                command: "x".into(),
                reason: "y".into(),
            },
            Error::Privilege("x".into()),
            Error::KernelFeature {
                feature: "BTF",
                hint: "x".into(),
            },
            Error::Internal(anyhow::anyhow!("x")),
        ];
        let mut codes: Vec<i32> = errors.iter().map(Error::exit_code).collect();
        assert!(!codes.contains(&exit_code::OK));
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), errors.len());
    }
}
