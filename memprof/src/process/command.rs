//! What a launched command finally runs, seen through `env`.
//!
//! `memprof-ebpf -- env LD_PRELOAD=libjemalloc.so.2 ./server` execs `env`,
//! which sets the variable and execs `./server`: the allocator and the
//! lock functions are looked up (before anything runs, so the probes are in
//! from the first call) in what that last exec will map: the program `env`
//! finally runs and the libraries the environment it gives preloads. Taking
//! `env` itself and our own environment found glibc where the target uses
//! the preloaded allocator.
//!
//! Pure: the command line and a view of our environment in, the final
//! program and its environment out.

use std::{
    collections::BTreeMap,
    ffi::OsString,
    path::{Path, PathBuf},
};

/// The program a launched command ends up running, with the environment
/// variables that decide which libraries it maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalCommand {
    /// The executable of the last exec.
    pub exe: PathBuf,
    /// `LD_PRELOAD` in the environment it gets, if set.
    pub preload: Option<String>,
    /// `LD_LIBRARY_PATH` in the environment it gets, if set.
    pub library_path: Option<String>,
    /// How many `env` launchers were seen through (0: the command itself).
    pub through: usize,
}

/// The environment a command runs with: ours, changed by `env`.
struct Environment<'a> {
    inherited: &'a dyn Fn(&str) -> Option<OsString>,
    /// `-i`: nothing inherited.
    cleared: bool,
    /// Set (`Some`) or unset (`None`) by `env`.
    changed: BTreeMap<String, Option<String>>,
}

impl Environment<'_> {
    fn get(&self, name: &str) -> Option<String> {
        match self.changed.get(name) {
            Some(value) => value.clone(),
            None if self.cleared => None,
            None => (self.inherited)(name).map(|v| v.to_string_lossy().into_owned()),
        }
    }
}

/// Follows `command` through any number of leading `env` invocations
/// (`env [-i] [-u NAME] [-C DIR] [NAME=VALUE]... PROGRAM ARGS`) to the
/// program that finally runs, resolving names on `PATH` as `execvp` does
/// (with `env`'s `PATH` once it sets one). `None` when the program cannot
/// be found or `env` is used in a way we do not follow (`-S`, no program);
/// the launch itself reports that the command does not exist.
pub fn final_command(
    command: &[String],
    inherited: &dyn Fn(&str) -> Option<OsString>,
) -> Option<FinalCommand> {
    let mut env = Environment {
        inherited,
        cleared: false,
        changed: BTreeMap::new(),
    };
    let mut dir: Option<PathBuf> = None;
    let mut rest = command;
    let mut through = 0;
    loop {
        let program = rest.first()?;
        let exe = super::launch::resolve(
            &in_dir(dir.as_deref(), program),
            env.get("PATH").map(OsString::from),
        )?;
        if !is_env(&exe) {
            return Some(FinalCommand {
                exe,
                preload: env.get("LD_PRELOAD"),
                library_path: env.get("LD_LIBRARY_PATH"),
                through,
            });
        }
        rest = env_arguments(&rest[1..], &mut env, &mut dir)?;
        through += 1;
    }
}

/// A relative program path is relative to `env -C DIR`'s directory.
fn in_dir(dir: Option<&Path>, program: &str) -> String {
    match dir {
        Some(d) if program.contains('/') && !program.starts_with('/') => {
            d.join(program).to_string_lossy().into_owned()
        }
        _ => program.to_string(),
    }
}

/// Whether `exe` is coreutils' (or busybox's) `env`.
fn is_env(exe: &Path) -> bool {
    let real = std::fs::canonicalize(exe).unwrap_or_else(|_| exe.to_path_buf());
    let name = |p: &Path| p.file_name().and_then(|n| n.to_str()).map(str::to_string);
    name(exe).as_deref() == Some("env") && name(&real).is_some_and(|n| n == "env" || n == "busybox")
}

/// Applies `env`'s options and assignments to `env`, returning the command
/// it runs. `None` for what we do not follow.
fn env_arguments<'a>(
    args: &'a [String],
    env: &mut Environment<'_>,
    dir: &mut Option<PathBuf>,
) -> Option<&'a [String]> {
    let mut i = 0;
    let mut options = true;
    while let Some(arg) = args.get(i) {
        i += 1;
        let value = |i: &mut usize| -> Option<String> {
            *i += 1;
            args.get(*i - 1).cloned()
        };
        if options && arg == "--" {
            options = false;
        } else if options && (arg == "-i" || arg == "-" || arg == "--ignore-environment") {
            env.cleared = true;
            env.changed.clear();
        } else if options && (arg == "-u" || arg == "--unset") {
            env.changed.insert(value(&mut i)?, None);
        } else if let Some(name) = options
            .then(|| arg.strip_prefix("--unset=").or(arg.strip_prefix("-u")))
            .flatten()
        {
            env.changed.insert(name.to_string(), None);
        } else if options && (arg == "-C" || arg == "--chdir") {
            *dir = Some(PathBuf::from(value(&mut i)?));
        } else if let Some(d) = options
            .then(|| arg.strip_prefix("--chdir=").or(arg.strip_prefix("-C")))
            .flatten()
        {
            *dir = Some(PathBuf::from(d));
        } else if options && arg.starts_with('-') {
            // -v, --debug, --*-signal[=SIG]: no effect on what runs;
            // -S (split a string into arguments) and -0: not followed.
            let harmless = ["-v", "--debug"].contains(&arg.as_str())
                || ["--block-signal", "--default-signal", "--ignore-signal"]
                    .iter()
                    .any(|o| arg.starts_with(o));
            if !harmless {
                return None;
            }
        } else if let Some((name, value)) = arg.split_once('=').filter(|(n, _)| !n.is_empty()) {
            options = false;
            env.changed
                .insert(name.to_string(), Some(value.to_string()));
        } else {
            return Some(&args[i - 1..]);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    fn ours(name: &str) -> Option<OsString> {
        match name {
            "PATH" => Some("/usr/bin:/bin".into()),
            "LD_PRELOAD" => Some("/ours.so".into()),
            _ => None,
        }
    }

    fn follow(s: &str) -> Option<FinalCommand> {
        final_command(&args(s), &ours)
    }

    #[test]
    fn a_plain_command_is_itself_with_our_environment() {
        let f = follow("/bin/true x").expect("found");
        assert_eq!(f.exe, PathBuf::from("/bin/true"));
        assert_eq!((f.preload.as_deref(), f.through), (Some("/ours.so"), 0));
    }

    #[test]
    fn env_assignments_reach_the_program_it_runs() {
        let f = follow("env LD_PRELOAD=/lib/x.so LD_LIBRARY_PATH=/opt/lib true 1").expect("found");
        assert!(f.exe.ends_with("true"), "{f:?}");
        assert_eq!(f.preload.as_deref(), Some("/lib/x.so"));
        assert_eq!(f.library_path.as_deref(), Some("/opt/lib"));
        assert_eq!(f.through, 1);
    }

    #[test]
    fn env_options_clear_and_unset_what_is_inherited() {
        assert_eq!(follow("env -i true").expect("found").preload, None);
        assert_eq!(
            follow("env -u LD_PRELOAD true").expect("found").preload,
            None
        );
        assert_eq!(
            follow("env --unset=LD_PRELOAD true")
                .expect("found")
                .preload,
            None
        );
        // Cleared, then set: the assignment after -i counts.
        let f = follow("env -i LD_PRELOAD=/a.so /bin/true").expect("found");
        assert_eq!(f.preload.as_deref(), Some("/a.so"));
    }

    #[test]
    fn nested_env_and_its_path_are_followed() {
        let f = follow("/usr/bin/env A=1 env -- LD_PRELOAD=/b.so true").expect("found");
        assert_eq!((f.preload.as_deref(), f.through), (Some("/b.so"), 2));
        // env's PATH decides where the program is found.
        assert!(follow("env PATH=/nonexistent true").is_none());
    }

    #[test]
    fn what_env_does_not_run_or_we_do_not_follow_is_none() {
        assert!(follow("env").is_none());
        assert!(follow("env A=1").is_none());
        assert!(follow("env -S 'true'").is_none());
        assert!(follow("env -u").is_none());
    }

    #[test]
    fn a_relative_program_is_found_in_envs_directory() {
        let f = follow("env -C /usr bin/true").expect("found");
        assert_eq!(f.exe, PathBuf::from("/usr/bin/true"));
    }
}
