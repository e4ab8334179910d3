//! One test's result: its figures, the checks that failed, or why it was
//! skipped; printed as the test's one line, with the hubs' log tails on a
//! failure.

use std::fmt::Display;
use std::path::PathBuf;

pub enum Verdict {
    Ok,
    Failed,
    Skipped,
}

pub struct Outcome {
    name: String,
    figures: Vec<(String, String)>,
    failures: Vec<String>,
    skipped: Option<String>,
    details: Vec<String>,
    logs: Vec<PathBuf>,
    /// Kept until the line is printed, so a failed test's logs are still there.
    dirs: Vec<tempfile::TempDir>,
}

impl Outcome {
    pub fn new(name: &str) -> Outcome {
        Outcome {
            name: name.to_owned(),
            figures: Vec::new(),
            failures: Vec::new(),
            skipped: None,
            details: Vec::new(),
            logs: Vec::new(),
            dirs: Vec::new(),
        }
    }

    /// Sets a figure of the line (a later value replaces an earlier one).
    pub fn fig(&mut self, key: &str, value: impl Display) {
        let value = value.to_string();
        match self.figures.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.figures.push((key.to_owned(), value)),
        }
    }

    /// Records a failed check unless `ok`; returns `ok`.
    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) -> bool {
        if !ok {
            self.failures.push(what());
        }
        ok
    }

    pub fn fail(&mut self, what: String) {
        self.failures.push(what);
    }

    /// A line shown under the test's own when it fails, or in the long mode.
    pub fn detail(&mut self, line: String) {
        self.details.push(line);
    }

    /// The test could not run here (not a failure): the line says why.
    pub fn skip(&mut self, reason: String) {
        self.skipped = Some(reason);
    }

    /// A fresh directory that lives until the line is printed.
    pub fn dir(&mut self) -> Result<PathBuf, String> {
        let dir = tempfile::Builder::new()
            .prefix("hub-battery-")
            .tempdir()
            .map_err(|e| format!("cannot make a temporary directory: {e}"))?;
        let path = dir.path().to_owned();
        self.dirs.push(dir);
        Ok(path)
    }

    /// A hub's log, whose tail is shown if the test fails.
    pub fn watch_log(&mut self, path: PathBuf) {
        if !self.logs.contains(&path) {
            self.logs.push(path);
        }
    }

    /// Prints the line (and, for a failure, the log tails on stderr); the
    /// details too when `verbose`.
    pub fn print(self, verbose: bool) -> Verdict {
        let figures = self
            .figures
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        let name = &self.name;
        if !self.failures.is_empty() {
            println!(
                "battery {name:<16} FAILED  {figures}\n    failed: {}",
                self.failures.join("\n    failed: ")
            );
            for detail in &self.details {
                println!("    {detail}");
            }
            for log in &self.logs {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(25)..];
                eprintln!(
                    "--- last {} lines of {}:\n{}",
                    tail.len(),
                    log.display(),
                    tail.join("\n")
                );
            }
            return Verdict::Failed;
        }
        if let Some(reason) = &self.skipped {
            println!("battery {name:<16} skipped {reason}");
            return Verdict::Skipped;
        }
        println!("battery {name:<16} ok      {figures}");
        if verbose {
            for detail in &self.details {
                println!("    {detail}");
            }
        }
        Verdict::Ok
    }
}
