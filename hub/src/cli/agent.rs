//! `hub agent`: agents from the command line.

use anyhow::{Context, Result};
use clap::Subcommand;
use hub::config::Config;
use hub::core::provisioning::{self};

use super::{open_store, out};

#[derive(Subcommand)]
pub(crate) enum AgentCommand {
    /// Create an agent and print its bearer token (shown only once).
    Create {
        #[arg(long)]
        name: String,
        #[arg(long)]
        email: String,
        #[arg(long)]
        photo: Option<String>,
        /// Read a console password from the first line of standard input.
        #[arg(long)]
        password_stdin: bool,
        /// Let the agent use the admin API from the console.
        #[arg(long)]
        admin: bool,
        #[arg(long)]
        json: bool,
    },
    /// List agents.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Set an agent's console password (ends its console sessions).
    SetPassword {
        #[arg(long)]
        email: String,
        /// Read the password from the first line of standard input.
        #[arg(long, required = true)]
        password_stdin: bool,
    },
}

/// The first line of standard input, without its line ending: how passwords
/// reach the command line without landing in shell history or `ps`.
pub(crate) fn password_from_stdin() -> Result<String> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("reading the password from standard input")?;
    let password = line.trim_end_matches(['\n', '\r']).to_owned();
    if password.is_empty() {
        anyhow::bail!("no password on standard input (--password-stdin reads its first line)");
    }
    Ok(password)
}

pub(crate) async fn agent(config: Config, cmd: AgentCommand) -> Result<()> {
    let store = open_store(&config).await?;
    match cmd {
        AgentCommand::Create {
            name,
            email,
            photo,
            password_stdin,
            admin,
            json,
        } => {
            let password = if password_stdin {
                Some(password_from_stdin()?)
            } else {
                None
            };
            let spec = provisioning::AgentSpec {
                name,
                email,
                photo,
                password,
                admin,
            };
            let (agent, token) = provisioning::create_agent(&store, &spec).await?;
            if json {
                let v = serde_json::json!({ "id": agent.id, "name": agent.name,
                    "email": agent.email, "photo": agent.photo, "admin": agent.admin, "token": token });
                out(&serde_json::to_string_pretty(&v)?)?;
            } else {
                out(&format!(
                    "created agent {} <{}> (id {})\ntoken: {token}\nThe token is shown only now.",
                    agent.name, agent.email, agent.id
                ))?;
            }
        }
        AgentCommand::List { json } => {
            let agents = store.list_agents().await?;
            if json {
                out(&serde_json::to_string_pretty(&agents)?)?;
            } else {
                for a in agents {
                    let state = if a.online { "online" } else { "offline" };
                    let admin = if a.admin { "\tadmin" } else { "" };
                    out(&format!(
                        "{}\t{}\t{}\t{state}{admin}",
                        a.id, a.name, a.email
                    ))?;
                }
            }
        }
        AgentCommand::SetPassword {
            email,
            password_stdin: _,
        } => {
            let password = password_from_stdin()?;
            let Some(agent) = store.agent_by_email(&email).await? else {
                anyhow::bail!("no agent has the e-mail `{email}`");
            };
            hub::core::accounts::set_password(&store, agent.id, &password).await?;
            out(&format!(
                "set the console password of {} <{}>; its console sessions have ended",
                agent.name, agent.email
            ))?;
        }
    }
    store.close().await;
    Ok(())
}
