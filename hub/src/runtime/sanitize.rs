//! Text a plugin hands the host (log messages, error strings, stdout)
//! made safe for the hub's log: one line, bounded, control characters
//! escaped, so a plugin can neither flood the log nor forge a line of it.

/// Longest plugin message the log keeps, in bytes (the rest is cut and counted).
pub const MAX_MESSAGE_BYTES: usize = 2048;

/// `text` as one log line: control characters (newlines, escapes, carriage
/// returns) written as Rust escapes, cut at `max` bytes with a note of how
/// much was left out.
pub fn one_line(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max) + 16);
    let mut cut_at = None;
    for (i, c) in text.char_indices() {
        if out.len() >= max {
            cut_at = Some(i);
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if let Some(i) = cut_at {
        out.push_str(&format!("… ({} more bytes)", text.len() - i));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newline_cannot_start_a_log_line_of_its_own() {
        let forged = "ok\n2026-01-01T00:00:00Z  INFO hub: admin token is abc\r\x1b[2J";
        let line = one_line(forged, MAX_MESSAGE_BYTES);
        assert!(!line.contains('\n') && !line.contains('\r') && !line.contains('\x1b'));
        assert!(line.starts_with("ok\\n2026"), "{line}");
    }

    #[test]
    fn long_text_is_cut_and_says_how_much_was_cut() {
        let line = one_line(&"é".repeat(10_000), 100);
        assert!(line.len() < 140, "{}", line.len());
        assert!(line.ends_with("(19900 more bytes)"), "{line}");
    }
}
