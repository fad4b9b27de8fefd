//! What the event loop waits for besides the rings: signals, deadlines
//! and the dashboard.

use std::time::Instant;

use crate::{
    error::Result,
    tui::{Action, Dashboard},
};

/// SIGINT (Ctrl-C) and SIGTERM, both of which end the session cleanly.
pub struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn new() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        let install =
            |kind| signal(kind).map_err(|e| anyhow::anyhow!("installing a signal handler: {e}"));
        Ok(Self {
            interrupt: install(SignalKind::interrupt())?,
            terminate: install(SignalKind::terminate())?,
        })
    }

    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// Sleeps until `deadline`; forever without one.
pub async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `deadline`; forever without one.
pub async fn sleep_until_instant(deadline: Option<Instant>) {
    sleep_until(deadline.map(Into::into)).await
}

/// The dashboard's next action; never, without a dashboard.
pub async fn next_action(dashboard: Option<&mut Dashboard>) -> Action {
    match dashboard {
        Some(d) => d.next_action().await,
        None => std::future::pending().await,
    }
}
