//! Assembles the hub from its parts and runs it: the state every handler
//! shares, start-up, and orderly shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::conversations::Conversations;
use crate::delivery::{Deliverer, HttpSender, Kick, Policies};
use crate::live::Live;
use crate::pipeline::Pipeline;
use crate::provisioning::{self, ProvisionError};
use crate::store::{Store, StoreError};

/// What every request handler can reach.
pub struct App {
    pub config: Arc<Config>,
    pub store: Store,
    pub live: Live,
    pub conversations: Arc<Conversations>,
    /// Public base URL, no trailing slash.
    pub base: String,
    /// The installation's random path segment of channel endpoints.
    pub path_secret: String,
    pub admin_token: Option<String>,
    /// Turns true when the hub stops; long-lived responses end on it.
    pub shutdown: watch::Receiver<bool>,
}

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
    #[error("declared channels: {0}")]
    Provision(#[from] ProvisionError),
    #[error(transparent)]
    Tls(#[from] crate::delivery::TlsSetupError),
}

/// A started hub.
pub struct Running {
    addr: SocketAddr,
    base: String,
    store: Store,
    stop: watch::Sender<bool>,
    server: JoinHandle<()>,
    deliverer: JoinHandle<()>,
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
        self.store.close().await;
        tracing::info!("stopped");
    }
}

/// Opens storage, provisions declared channels, binds and starts serving.
pub async fn start(config: Config) -> Result<Running, StartError> {
    let store = Store::open(&config.storage.url).await?;
    provisioning::sync_declared(&store, &config.channels).await?;
    let path_secret = provisioning::path_secret(&store).await?;
    let listen = config.server.listen;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| StartError::Bind {
            addr: listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: listen,
        source,
    })?;
    let base = config.public_base(addr);
    let grace = Duration::from_millis(config.server.shutdown_grace_ms);

    let (stop, shutdown) = watch::channel(false);
    let live = Live::default();
    let kick = Kick::default();
    let pipeline = Pipeline::default();
    let conversations = Conversations::new(store.clone(), live.clone(), pipeline, kick.clone());
    let deliverer = Deliverer::new(
        store.clone(),
        HttpSender::new()?,
        Policies::from_config(&config.delivery),
        conversations.clone(),
        kick,
    );
    let app = Arc::new(App {
        admin_token: config.admin.token.clone().filter(|t| !t.is_empty()),
        config: Arc::new(config),
        store: store.clone(),
        live,
        conversations,
        base: base.clone(),
        path_secret,
        shutdown: shutdown.clone(),
    });
    let deliverer = tokio::spawn(deliverer.run(shutdown.clone(), grace));
    let server = tokio::spawn(crate::server::serve(listener, app, shutdown, grace));
    tracing::info!(%addr, base = %base, "listening");
    Ok(Running {
        addr,
        base,
        store,
        stop,
        server,
        deliverer,
    })
}
