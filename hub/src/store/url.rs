//! Database URLs: SQLite's made ready to open, PostgreSQL's probed, and
//! both redacted (the password) wherever they are shown.

use super::*;

/// Settings of every SQLite connection; the writer adds its durability.
pub(super) fn prepare_sqlite_url(url: &str) -> Result<String, StoreError> {
    let rest = url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    let path = rest.split('?').next().unwrap_or_default();
    if !path.is_empty()
        && path != ":memory:"
        && let Some(dir) = std::path::Path::new(path).parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Directory {
            path: dir.display().to_string(),
            source,
        })?;
    }
    if url.contains("mode=") {
        Ok(url.to_owned())
    } else if url.contains('?') {
        Ok(format!("{url}&mode=rwc"))
    } else {
        Ok(format!("{url}?mode=rwc"))
    }
}

/// Connects once to the PostgreSQL database at `url` within `timeout`,
/// pings it and closes again: `hub check` with a PostgreSQL URL, and the
/// first step of [`Store::open`] there. The error names the database, the
/// host and the port (never the password): [`StoreError::Unreachable`].
pub async fn probe_postgres(url: &str, timeout: Duration) -> Result<(), StoreError> {
    use std::str::FromStr;
    let options = match sqlx::postgres::PgConnectOptions::from_str(url) {
        Ok(options) => options,
        Err(e) => {
            return Err(StoreError::Unreachable {
                target: redacted_url(url),
                reason: scrub(&format!("not a PostgreSQL URL: {e}"), url),
            });
        }
    };
    let target = postgres_target(&options);
    let attempt = async {
        let mut conn = sqlx::PgConnection::connect_with(&options).await?;
        conn.ping().await?;
        conn.close().await
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(StoreError::Unreachable {
            target,
            reason: scrub(&e.to_string(), url),
        }),
        Err(_) => Err(StoreError::Unreachable {
            target,
            reason: format!("no connection within {} ms", timeout.as_millis()),
        }),
    }
}

/// `database `hub` on 127.0.0.1:5432 as user `hub``: where a connection goes.
pub(super) fn postgres_target(options: &sqlx::postgres::PgConnectOptions) -> String {
    let user = options.get_username();
    // Without a database in the URL, PostgreSQL takes the user's name.
    let database = options.get_database().unwrap_or(user);
    let place = match options.get_socket() {
        Some(socket) => format!("socket {}", socket.display()),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    };
    format!("database `{database}` on {place} as user `{user}`")
}

/// `url` with the password of its user info, if any, replaced by `***`:
/// a database URL fit for logs and messages.
pub fn redacted_url(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[start..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    match authority[..at].find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..start],
            &authority[..colon],
            &url[start + at..]
        ),
        None => url.to_owned(),
    }
}

/// `text` without the password of `url` in it, should a driver's message
/// ever quote it.
pub(super) fn scrub(text: &str, url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return text.to_owned();
    };
    let rest = &url[start..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let password = authority
        .rfind('@')
        .and_then(|at| authority[..at].split_once(':'))
        .map(|(_, password)| password)
        .filter(|p| !p.is_empty());
    match password {
        Some(password) => text
            .replace(password, "***")
            .replace(&percent_decoded(password), "***"),
        None => text.to_owned(),
    }
}

/// `%XX` escapes of a URL part decoded (others left as they are).
pub(super) fn percent_decoded(part: &str) -> String {
    percent_encoding::percent_decode_str(part)
        .decode_utf8_lossy()
        .into_owned()
}
