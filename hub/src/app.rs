//! Assembles the hub from its parts and runs it: start-up (on a listener of
//! its own or one the caller bound), and orderly shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::clock::Clock;
use crate::config::{Config, ConfigError};
use crate::core::conversations::Conversations;
use crate::core::live::Live;
use crate::core::provisioning::{self, ProvisionError};
use crate::delivery::{Deliverer, Kick, Policies};
use crate::http::App;
use crate::outbound::oauth::TokenCache;
use crate::outbound::{HttpSender, TlsSetupError};
use crate::pipeline::Pipeline;
use crate::pipeline::wiring::{Wiring, WiringHandle};
use crate::runtime::{Runtime, RuntimeError};
use crate::store::instances::Identity;
use crate::store::{Durability, Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("storage: {0}")]
    Store(#[from] StoreError),
    // The reason is in the text and not a `source`, so `{:#}` does not print it twice.
    #[error("declared channels and bots: {0}")]
    Provision(ProvisionError),
    #[error(transparent)]
    Tls(#[from] TlsSetupError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("plugins:\n  {}", .0.join("\n  "))]
    Plugins(Vec<String>),
    #[error("geoip.database: {0}")]
    GeoIp(String),
}

impl From<ProvisionError> for StartError {
    fn from(e: ProvisionError) -> Self {
        StartError::Provision(e)
    }
}

/// Why a reload kept the old wiring.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("the configuration was not loaded from a file")]
    NoFile,
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("plugins:\n  {}", .0.join("\n  "))]
    Plugins(Vec<String>),
    #[error("bots: {0}")]
    Bots(#[from] ProvisionError),
    #[error("outbound: {0}")]
    Outbound(TlsSetupError),
}

/// What loading plugins needs, kept for reloads.
#[derive(Clone)]
struct Loader {
    runtime: Runtime,
    store: Store,
    sender: HttpSender,
}

impl Loader {
    /// Compiles on a blocking thread: compiling is CPU work that must not
    /// stall request handling. Problems come as `hub check` prints them:
    /// each after the file it is about, when there is one.
    async fn load(&self, config: Config) -> Result<Wiring, Vec<String>> {
        let file = config.source.clone();
        self.load_from(config).await.map_err(|problems| match file {
            Some(file) => problems
                .into_iter()
                .map(|p| format!("{}: {p}", file.display()))
                .collect(),
            None => problems,
        })
    }

    async fn load_from(&self, config: Config) -> Result<Wiring, Vec<String>> {
        let this = self.clone();
        let config_for_checks = config.clone();
        let joined = tokio::task::spawn_blocking(move || {
            Wiring::load(&config, &this.runtime, &this.store, &this.sender)
        })
        .await;
        let (wiring, loaded) = match joined {
            Ok(result) => result?,
            Err(e) => return Err(vec![format!("plugin loading stopped: {e}")]),
        };
        let wiring = wiring.validate_configs(&config_for_checks).await?;
        if !loaded.compiled.is_empty() || !loaded.cached.is_empty() {
            tracing::info!(compiled = ?loaded.compiled, cached = ?loaded.cached, routes = wiring.routes.len(), "plugins loaded");
        }
        Ok(wiring)
    }
}

/// A started hub.
pub struct Running {
    addr: SocketAddr,
    base: String,
    store: Store,
    source: Option<std::path::PathBuf>,
    /// The environment the configuration was loaded with; a reload reads the file with it again.
    env: crate::config::Env,
    loader: Loader,
    wiring: WiringHandle,
    conversations: Arc<Conversations>,
    stop: watch::Sender<bool>,
    server: JoinHandle<()>,
    deliverer: JoinHandle<()>,
    reminders: JoinHandle<()>,
}

impl Running {
    /// The address actually bound (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Public base URL endpoint URLs start with.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Reads the configuration file again and puts its plugins, routes and
    /// destinations in force. On any error the old ones stay.
    pub async fn reload(&self) -> Result<(), ReloadError> {
        let file = self.source.as_deref().ok_or(ReloadError::NoFile)?;
        let config = Config::load_with(file, &self.env)?;
        let bots = config.bots.clone();
        let outbound = config.outbound.policy();
        let wiring = self
            .loader
            .load(config)
            .await
            .map_err(ReloadError::Plugins)?;
        self.loader
            .sender
            .replace_policy(outbound.clone())
            .map_err(ReloadError::Outbound)?;
        self.wiring.replace(wiring);
        // After the plugins, so a plugin bot's plugin is there when it is needed.
        provisioning::sync_declared_bots(&self.store, &bots, &outbound).await?;
        self.conversations
            .bots_changed()
            .await
            .map_err(|e| ReloadError::Bots(e.into()))?;
        tracing::info!(file = %file.display(), "plugins, routes, destinations, bots and the outbound policy reloaded");
        Ok(())
    }

    /// Stops intake, lets in-flight requests and deliveries finish within the
    /// configured grace, then closes the database.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.server.await {
            tracing::error!(error = %e, "server task failed");
        }
        if let Err(e) = self.deliverer.await {
            tracing::error!(error = %e, "deliverer task failed");
        }
        if let Err(e) = self.reminders.await {
            tracing::error!(error = %e, "task reminder scheduler failed");
        }
        // The recorder writes after a short wait: what it holds goes now,
        // while the database is open.
        self.conversations.pipeline.flush_records().await;
        if self.store.backend() == crate::store::Backend::Postgres
            && let Err(e) = self.store.deregister_instance().await
        {
            tracing::warn!(error = %e, "cannot deregister this instance");
        }
        self.store.close().await;
        tracing::info!("stopped");
    }
}

/// Binds `[server] listen` and starts the hub on it ([`start_on`]).
pub async fn start(config: Config) -> Result<Running, StartError> {
    let listen = config.server.listen;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| StartError::Bind {
            addr: listen,
            source,
        })?;
    start_on(listener, config).await
}

/// Opens the configured database with the configured durability.
pub async fn open_store(storage: &crate::config::StorageConfig) -> Result<Store, StoreError> {
    open_store_as(storage, None).await
}

/// [`open_store`] for a serving instance: its leases carry `identity`.
async fn open_store_as(
    storage: &crate::config::StorageConfig,
    identity: Option<Identity>,
) -> Result<Store, StoreError> {
    let durability = match storage.durability {
        crate::config::Durability::Full => Durability::Full,
        crate::config::Durability::Normal => Durability::Normal,
    };
    let pool = crate::store::PoolSettings {
        max_connections: storage.max_connections,
        write_lanes: storage.write_lanes as usize,
        acquire_timeout: storage.acquire_timeout(),
        connect_timeout: storage.connect_timeout(),
    };
    Store::open(
        &storage.url,
        crate::store::OpenOptions {
            durability,
            pool,
            identity,
        },
    )
    .await
}

/// Starts the hub on a listener the caller bound (tests bind port 0 and
/// know the address before the hub starts); `[server] listen` is not used.
pub async fn start_on(listener: TcpListener, config: Config) -> Result<Running, StartError> {
    start_on_clock(listener, config, Clock::system()).await
}

/// [`start_on`] with the hub's time read from `clock` (tests hold it still
/// and move it on: retries, reminders, sign-in locks, token renewal).
pub async fn start_on_clock(
    listener: TcpListener,
    config: Config,
    clock: Clock,
) -> Result<Running, StartError> {
    crate::obs::mark_started();
    let addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: config.server.listen,
        source,
    })?;
    let identity = Identity::named(instance_id(&config.server, addr));
    let store = open_store_as(&config.storage, Some(identity)).await?;
    // A SQLite file has one hub: every lease left in it belongs to a process
    // that is gone. On PostgreSQL other instances may hold live leases: this
    // one takes back those of its own previous run, and the heartbeat task
    // those of instances that stopped beating.
    let reclaimed = match store.backend() {
        crate::store::Backend::Sqlite => store.reclaim_leases().await?,
        crate::store::Backend::Postgres => store.register_instance(clock.now_ms()).await?,
    };
    if reclaimed > 0 {
        tracing::info!(
            deliveries = reclaimed,
            "took over deliveries a previous run left in flight"
        );
    }
    let outbound = config.outbound.policy();
    provisioning::sync_declared(&store, &config.channels, &outbound).await?;
    let path_secret = provisioning::path_secret(&store).await?;
    let visitor_keys = crate::core::widget::VisitorKeys::load(&store).await?;
    let geoip = match &config.geoip.database {
        Some(path) => Some(Arc::new(
            crate::http::geoip::GeoIp::open(&config.resolve(path)).map_err(StartError::GeoIp)?,
        )),
        None => None,
    };
    let base = config.public_base(addr);
    let grace = Duration::from_millis(config.server.shutdown_grace_ms);

    // Every request the hub makes (deliveries, webhooks, bots, plugin
    // destinations, the bot token exchange) goes through this sender.
    let sender = HttpSender::with_policy(outbound.clone())?.on_clock(clock.clone());
    let runtime = Runtime::with_memory_budget(
        config.resolve(&config.runtime.cache_dir),
        config.runtime.max_concurrent_calls,
        (config.runtime.max_memory_mb as usize) << 20,
    )?;
    let loader = Loader {
        runtime: runtime.clone(),
        store: store.clone(),
        sender: sender.clone(),
    };
    let wiring = WiringHandle::new(
        loader
            .load(config.clone())
            .await
            .map_err(StartError::Plugins)?,
    );

    let (stop, shutdown) = watch::channel(false);
    let mut live = Live::default();
    if store.backend() == crate::store::Backend::Postgres {
        // Until each of them said whether it watches, this instance relays
        // everything (`core::live::audience`).
        let since = clock
            .now_ms()
            .saturating_sub(i64::try_from(config.delivery.takeover_ms).unwrap_or(i64::MAX));
        let peers = store.others_alive(since).await.ok();
        live.relay(store.clone(), &config.storage.url, peers, shutdown.clone())
            .await?;
    }
    let kick = Kick::default();
    let pipeline = Arc::new(Pipeline::new(wiring.clone(), store.clone()));
    pipeline.keep_inbound(config.storage.keep_inbound_hours);
    let conversations = Conversations::new(
        store.clone(),
        live.clone(),
        pipeline,
        kick.clone(),
        config.webhooks.safe_url,
        Arc::new(TokenCache::new(sender.clone(), clock.clone())),
        config.crm.clone(),
        clock.clone(),
    );
    provisioning::sync_declared_bots(&store, &config.bots, &outbound).await?;
    conversations.reload_bots().await?;
    // Another instance changed bots: this one's directory follows.
    tokio::spawn({
        let conversations = conversations.clone();
        let changed = live.bots_changed();
        let mut shutdown = shutdown.clone();
        async move {
            loop {
                tokio::select! {
                    _ = changed.notified() => {}
                    _ = shutdown.changed() => return,
                }
                if let Err(e) = conversations.reload_bots().await {
                    tracing::warn!(error = %e, "cannot reload bots changed by another instance");
                }
            }
        }
    });
    let deliverer = Deliverer::new(
        store.clone(),
        sender.clone(),
        Policies::from_config(&config.delivery, &config.webhooks),
        wiring.clone(),
        conversations.clone(),
        kick.clone(),
        clock.clone(),
    );
    let source = config.source.clone();
    let env = config.env.clone();
    let sign_ins = crate::core::accounts::SignIns::new(
        crate::core::accounts::SignInLimits {
            max_failures: config.console.max_failed_sign_ins,
            lock: Duration::from_secs(config.console.sign_in_lock_secs),
            session_ttl: Duration::from_secs(config.console.session_hours.saturating_mul(3600)),
        },
        clock.clone(),
    );
    let app = Arc::new(App {
        admin_token: config.admin.token.clone().filter(|t| !t.is_empty()),
        sign_ins,
        limits: crate::http::limits::Limits::new(&config.server, &config.limits),
        sender: sender.clone(),
        config: Arc::new(config),
        store: store.clone(),
        live,
        conversations,
        runtime,
        wiring: wiring.clone(),
        kick,
        base: base.clone(),
        path_secret,
        visitor_keys,
        widget_limits: Default::default(),
        geoip,
        shutdown: shutdown.clone(),
    });
    let deliverer = tokio::spawn(deliverer.run(shutdown.clone(), grace));
    let reminders = tokio::spawn(crate::core::reminders::run(
        store.clone(),
        app.config.crm.clone(),
        app.kick.clone(),
        clock.clone(),
        shutdown.clone(),
    ));
    if store.backend() == crate::store::Backend::Postgres {
        tokio::spawn(crate::delivery::heartbeat::run(
            store.clone(),
            app.kick.clone(),
            crate::delivery::heartbeat::Heartbeat {
                every: Duration::from_millis(app.config.delivery.heartbeat_ms),
                takeover: Duration::from_millis(app.config.delivery.takeover_ms),
            },
            app.conversations.live().others(),
            clock.clone(),
            shutdown.clone(),
        ));
    }
    tokio::spawn(crate::delivery::prune::run(
        store.clone(),
        app.config.storage.delivered_retention_hours,
        clock,
        shutdown.clone(),
    ));
    let conversations = app.conversations.clone();
    let server = tokio::spawn(crate::http::serve(listener, app, shutdown, grace));
    tracing::info!(%addr, base = %base, "listening");
    Ok(Running {
        addr,
        base,
        store,
        source,
        env,
        loader,
        wiring,
        conversations,
        stop,
        server,
        deliverer,
        reminders,
    })
}

/// The name this instance's leases carry: `[server] instance_id`, else the
/// host and the address it listens on (unique among the live processes of
/// a host, and the same after a restart on a fixed port).
fn instance_id(server: &crate::config::ServerConfig, addr: SocketAddr) -> String {
    if let Some(id) = &server.instance_id {
        return id.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}/{addr}")
}
