//! `hub check`: the configuration, the database and the plugins, checked.

use anyhow::Result;
use hub::config::Config;
use hub::tryout;

use super::out;

pub(crate) async fn check(file: &std::path::Path, config: &Config) -> Result<()> {
    let mut checked = tryout::check_plugins(config).await;
    // The GeoIP file must be a database the hub can read, not only a file.
    if let Some(db) = &config.geoip.database
        && let Err(e) = hub::http::geoip::GeoIp::open(&config.resolve(db))
    {
        let problem = format!("geoip.database: {e}");
        match &mut checked {
            Ok(_) => checked = Err(vec![problem]),
            Err(problems) => problems.push(problem),
        }
    }
    // A PostgreSQL URL is checked by connecting (within the connect
    // timeout, at most 2 minutes): a wrong host, port, database or password
    // shows here rather than at the first start.
    if config.storage.url.starts_with("postgres")
        && let Err(e) =
            hub::store::probe_postgres(&config.storage.url, config.storage.connect_timeout()).await
    {
        let key = match config.env.get(hub::config::ENV_DATABASE_URL) {
            Some(_) => format!("storage.url ({})", hub::config::ENV_DATABASE_URL),
            None => "storage.url".to_owned(),
        };
        let problem = format!("{key}: {e}");
        match &mut checked {
            Ok(_) => checked = Err(vec![problem]),
            Err(problems) => problems.push(problem),
        }
    }
    match checked {
        Ok(n) => out(&format!("{}: ok ({n} plugins)", file.display())),
        Err(problems) => {
            let lines: Vec<String> = problems
                .iter()
                .map(|p| format!("{}: {p}", file.display()))
                .collect();
            anyhow::bail!("{}", lines.join("\n"))
        }
    }
}
