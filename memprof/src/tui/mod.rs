//! The live dashboard.
//!
//! Terminal set-up and tear-down live here only: [`Dashboard`] restores the
//! terminal on drop, and `ratatui::init` installs a panic hook that does the
//! same. Keys are read on a plain thread (crossterm's reads block) and come
//! to the session as [`Action`]s; rendering is a pure function of [`App`].

mod app;
pub(crate) mod layout;
pub mod log;
pub(crate) mod rates;
mod tabs;
pub(crate) mod widgets;

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

/// The dashboard on a test terminal, as text (for the slices' tests).
#[cfg(test)]
pub(crate) use app::tests::{app_on, assert_centred, assert_fits, assert_shows, screen_at};
pub use app::{Action, App};
pub use layout::Selection;
pub use log::LogRing;
use ratatui::{
    crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers},
    DefaultTerminal,
};
pub use tabs::Tab;
use tokio::sync::mpsc;

use crate::report::Report;

/// The dashboard on the terminal.
pub struct Dashboard {
    terminal: DefaultTerminal,
    app: App,
    actions: mpsc::UnboundedReceiver<Action>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
    log: LogRing,
}

impl Dashboard {
    /// Takes over the terminal (alternate screen, raw mode); the newest
    /// line of `log` is shown at the bottom.
    pub fn start(title: String, log: LogRing) -> std::io::Result<Self> {
        let terminal = ratatui::try_init()?;
        // ratatui's hook restores the terminal on any panic, also one that
        // symbolization catches: those must skip it.
        crate::object::symbolize::install_quiet_panic_hook();
        let (tx, actions) = mpsc::unbounded_channel();
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("memprof-keys".into())
                .spawn(move || {
                    crate::privilege::drop_all_in_this_thread();
                    read_keys(&tx, &stop)
                })?
        };
        let mut dashboard = Self {
            terminal,
            app: App::new(title),
            actions,
            stop,
            reader: Some(reader),
            log,
        };
        dashboard.draw();
        Ok(dashboard)
    }

    /// Shows a new report.
    pub fn update(&mut self, report: Report) {
        self.app.set_report(report);
        self.draw();
    }

    /// Waits for the next key that matters to the session (quit); other
    /// keys change the view and redraw here.
    pub async fn next_action(&mut self) -> Action {
        loop {
            let Some(action) = self.actions.recv().await else {
                return std::future::pending().await;
            };
            if action == Action::Quit {
                return Action::Quit;
            }
            self.app.handle(action);
            self.draw();
        }
    }

    fn draw(&mut self) {
        self.app.log_line = self.log.last();
        let app = &self.app;
        if let Err(e) = self.terminal.draw(|frame| app.render(frame)) {
            tracing::warn!("drawing the dashboard: {e}");
        }
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        ratatui::restore();
    }
}

fn read_keys(tx: &mpsc::UnboundedSender<Action>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match event::poll(Duration::from_millis(100)) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(_) => return,
        }
        let action = match event::read() {
            Ok(Event::Key(key)) if key.kind == KeyEventKind::Press => match key.code {
                KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => Action::Quit,
                KeyCode::Char('q') | KeyCode::Esc => Action::Quit,
                KeyCode::Tab | KeyCode::Right | KeyCode::Char('l') => Action::NextTab,
                KeyCode::BackTab | KeyCode::Left | KeyCode::Char('h') => Action::PrevTab,
                KeyCode::Char(c @ '1'..='9') => Action::Tab(c as usize - '1' as usize),
                KeyCode::Down | KeyCode::Char('j') => Action::Down,
                KeyCode::Up | KeyCode::Char('k') => Action::Up,
                _ => continue,
            },
            Ok(Event::Resize(..)) => Action::Redraw,
            Ok(_) => continue,
            Err(_) => return,
        };
        if tx.send(action).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod snapshot_tests;
