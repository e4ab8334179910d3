//! The durable outbox: one row per outbound request, written in the same
//! transaction as the state change that caused it, claimed by the deliverer
//! under a lease so a crashed attempt is picked up again.

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::batch::{self, Literal, Scripts, slots_for, values};
use super::{
    Backend, Ctx, DeliveryState, FirstRows, FirstStatement, Store, StoreError, flag, is_postgres,
    prepared,
};
use crate::event::Event;

mod admin;
mod claim;
mod handoff;
mod write;

pub(in crate::store) use claim::{claim_sql, next_due_sql};
pub(in crate::store) use write::PG_FINISH;

pub use admin::{DeliveryView, OutboxDepth, PendingRows};
pub(in crate::store) use handoff::Handing;
pub use handoff::Handoff;
pub use write::{
    Finished, MAX_FINISHED, add_note, enqueue, finish, finish_many, finish_statement, set_response,
    unstage,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxState {
    Pending,
    Delivered,
    /// Failed for good: for webhooks, a dead letter an operator may replay.
    Failed,
    /// Never sent on purpose: dropped by a plugin, or no receiver configured.
    Dropped,
}

impl OutboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            OutboxState::Pending => "pending",
            OutboxState::Delivered => "delivered",
            OutboxState::Failed => "failed",
            OutboxState::Dropped => "dropped",
        }
    }

    pub fn parse(s: &str) -> Option<OutboxState> {
        match s {
            "pending" => Some(OutboxState::Pending),
            "delivered" => Some(OutboxState::Delivered),
            "failed" => Some(OutboxState::Failed),
            "dropped" => Some(OutboxState::Dropped),
            _ => None,
        }
    }
}

/// When a failed delivery is tried next, given up, and stops holding back
/// later rows of its order key (Unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    pub next_at: i64,
    pub give_up_at: i64,
    pub hold_until: i64,
}

/// Names of the retry policies rows are sent under (`delivery::Policies`
/// says what each means); a forward's is `dest:<destination>`.
pub const POLICY_CHANNEL: &str = "channel";
pub const POLICY_TYPING: &str = "typing";
/// `chat_accepted` and `chat_updated`: an agent waits for the reply.
pub const POLICY_WEBHOOK_SYNC: &str = "webhook_sync";
/// Every other event webhook and every CRM webhook.
pub const POLICY_WEBHOOK: &str = "webhook";
pub const POLICY_DESTINATION_PREFIX: &str = "dest:";
/// Requests to bot providers: the spec's 3 s timeout, 3 attempts 3 s apart.
pub const POLICY_BOT: &str = "bot";
/// A row to a plugin bot has this target instead of a URL.
pub const PLUGIN_BOT_PREFIX: &str = "plugin:";

/// Row kinds of webhooks start with these (`webhook.<event_name>`,
/// `crm.<event_type>.<event_name>`); a plugin's forward is `forward`.
pub const EVENT_WEBHOOK_PREFIX: &str = "webhook.";
pub const CRM_WEBHOOK_PREFIX: &str = "crm.";
pub const FORWARD_KIND: &str = "forward";
pub const BOT_PREFIX: &str = "bot.";

/// What an outbox row is. The constructors of [`NewDelivery`] fix, per kind,
/// its policy, order key and staging; the deliverer and the bookkeeping of
/// results match on this instead of on the kind's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    /// An agent's message or typing notice to the channel's integrator; its
    /// answer is read by the channel's rules (an `{"error"}` body refuses).
    ChannelMessage,
    /// A plugin's forward to a named destination.
    Forward,
    /// An event webhook to a channel's receiver; any 2xx is delivered.
    EventWebhook,
    /// A CRM webhook to the CRM's receiver.
    CrmWebhook,
    /// An event to a bot provider (`bot.*`), or to a plugin bot.
    Bot,
}

impl RowKind {
    /// The kind of a stored row (rows of older versions read by their kind's text).
    pub fn of(kind: &str) -> RowKind {
        if kind == FORWARD_KIND {
            RowKind::Forward
        } else if kind.starts_with(EVENT_WEBHOOK_PREFIX) {
            RowKind::EventWebhook
        } else if kind.starts_with(CRM_WEBHOOK_PREFIX) {
            RowKind::CrmWebhook
        } else if kind.starts_with(BOT_PREFIX) {
            RowKind::Bot
        } else {
            RowKind::ChannelMessage
        }
    }

    pub fn is_webhook(self) -> bool {
        matches!(self, RowKind::EventWebhook | RowKind::CrmWebhook)
    }
}

impl NewDelivery {
    /// An agent's message (or typing notice) to the integrator: in order
    /// per chat, sent as queued. The message's id is filled in when it is
    /// stored with it (`store::outgoing`).
    pub fn channel_message(
        event_id: uuid::Uuid,
        kind: &str,
        target_url: String,
        body: String,
        chunked: bool,
        chat_id: i64,
        typing: bool,
    ) -> NewDelivery {
        NewDelivery {
            id: uuid::Uuid::now_v7(),
            event_id,
            kind: kind.to_owned(),
            policy: if typing {
                POLICY_TYPING
            } else {
                POLICY_CHANNEL
            }
            .to_owned(),
            target_url,
            body,
            chunked,
            order_key: Some(format!("chat:{chat_id}")),
            message_id: None,
            chat_id: Some(chat_id),
            staged: false,
            secret: None,
        }
    }

    /// An event to a bot (`kind` = `bot.<event>`): staged (the `bot.*`
    /// routes' plugins run when it is first claimed), in order per chat.
    /// `target_url` is the provider's `{endpoint}/{token}`, or
    /// [`PLUGIN_BOT_PREFIX`] and the plugin's name for a plugin bot.
    pub fn bot(
        event_id: uuid::Uuid,
        kind: &str,
        target_url: String,
        body: String,
        chat_id: i64,
    ) -> NewDelivery {
        NewDelivery {
            id: uuid::Uuid::now_v7(),
            event_id,
            kind: kind.to_owned(),
            policy: POLICY_BOT.to_owned(),
            target_url,
            body,
            chunked: false,
            order_key: Some(bot_order_key(chat_id)),
            message_id: None,
            chat_id: Some(chat_id),
            staged: true,
            secret: None,
        }
    }

    /// A plugin's forward to `destination`: per destination and chat, in the
    /// order the forwards were made.
    pub fn forward(
        event_id: uuid::Uuid,
        destination: &str,
        target_url: String,
        body: String,
        chat_id: Option<i64>,
    ) -> NewDelivery {
        let policy = format!("{POLICY_DESTINATION_PREFIX}{destination}");
        NewDelivery {
            id: uuid::Uuid::now_v7(),
            event_id,
            kind: FORWARD_KIND.to_owned(),
            order_key: chat_id.map(|chat| format!("{policy}:chat:{chat}")),
            policy,
            target_url,
            body,
            chunked: false,
            message_id: None,
            chat_id,
            staged: false,
            secret: None,
        }
    }

    /// An event webhook (`kind` = `webhook.<event_name>`): staged (its plugins
    /// run when it is first claimed), in the order [`webhook_order_key`]
    /// gives it. `sync` for the replies an agent waits for.
    #[allow(clippy::too_many_arguments)]
    pub fn event_webhook(
        event_id: uuid::Uuid,
        kind: &str,
        sync: bool,
        target_url: String,
        body: String,
        chat_id: Option<i64>,
        client_id: Option<i64>,
        secret: Option<String>,
    ) -> NewDelivery {
        let order_key = webhook_order_key(kind, chat_id, client_id);
        NewDelivery {
            id: uuid::Uuid::now_v7(),
            event_id,
            kind: kind.to_owned(),
            policy: if sync {
                POLICY_WEBHOOK_SYNC
            } else {
                POLICY_WEBHOOK
            }
            .to_owned(),
            target_url,
            body,
            chunked: false,
            order_key,
            message_id: None,
            chat_id,
            staged: true,
            secret,
        }
    }

    /// A CRM webhook (`kind` = `crm.<event_type>.<event_name>`): staged, and
    /// all of them in one order (a retried created_* must not follow its updated_*).
    pub fn crm_webhook(
        event_id: uuid::Uuid,
        kind: &str,
        target_url: String,
        body: String,
        secret: Option<String>,
    ) -> NewDelivery {
        NewDelivery {
            id: uuid::Uuid::now_v7(),
            event_id,
            kind: kind.to_owned(),
            policy: POLICY_WEBHOOK.to_owned(),
            target_url,
            body,
            chunked: false,
            order_key: Some("crm".to_owned()),
            message_id: None,
            chat_id: None,
            staged: true,
            secret,
        }
    }
}

/// The order a chat's requests to its bot keep.
pub fn bot_order_key(chat_id: i64) -> String {
    format!("bot:chat:{chat_id}")
}

/// The order an event webhook keeps among the others. A chat's conversation
/// (`chat_accepted`, `chat_updated`, `chat_assigned`, `chat_finished`,
/// `offline_message`) is one order: a receiver opens its record on
/// `chat_accepted`, links it on `chat_assigned` and closes it on
/// `chat_finished`. A chat's `call_event`s are another: a call's statuses
/// follow each other, but receivers written before calls refuse them, and
/// that must not hold the chat's `chat_finished` back. A client's snapshots
/// are ordered per event name: `sequence` compares snapshots of one kind
/// (`client_updated` and `client_attribute_updated` carry different data,
/// neither supersedes the other), so a receiver refusing one kind must not
/// stall the other.
pub(in crate::store) fn webhook_order_key(
    kind: &str,
    chat_id: Option<i64>,
    client_id: Option<i64>,
) -> Option<String> {
    let name = kind.strip_prefix(EVENT_WEBHOOK_PREFIX).unwrap_or(kind);
    match (chat_id, client_id) {
        (Some(chat), _) if name == "call_event" => Some(format!("webhook:chat:{chat}:{name}")),
        (Some(chat), _) => Some(format!("webhook:chat:{chat}")),
        (None, Some(client)) => Some(format!("webhook:client:{client}:{name}")),
        (None, None) => None,
    }
}

impl Claimed {
    pub fn row_kind(&self) -> RowKind {
        RowKind::of(&self.kind)
    }

    /// The plugin that answers a row to a plugin bot.
    pub fn plugin_bot(&self) -> Option<&str> {
        self.target_url.strip_prefix(PLUGIN_BOT_PREFIX)
    }

    /// The destination a forward goes to, by name.
    pub fn destination(&self) -> Option<&str> {
        self.policy.strip_prefix(POLICY_DESTINATION_PREFIX)
    }
}

/// A request to be made; `order_key` (the chat) serialises rows that share it.
#[derive(Debug, Clone)]
pub struct NewDelivery {
    pub id: uuid::Uuid,
    pub event_id: uuid::Uuid,
    pub kind: String,
    pub policy: String,
    pub target_url: String,
    pub body: String,
    pub chunked: bool,
    pub order_key: Option<String>,
    pub message_id: Option<i64>,
    pub chat_id: Option<i64>,
    /// Crosses its plugins when first claimed, not before it is queued.
    pub staged: bool,
    /// Standard Webhooks signing secret of the receiver.
    pub secret: Option<String>,
}

/// A row the deliverer holds a lease on.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub seq: i64,
    pub id: String,
    pub event_id: String,
    pub kind: String,
    pub policy: String,
    pub target_url: String,
    pub body: String,
    pub chunked: bool,
    pub message_id: Option<i64>,
    pub chat_id: Option<i64>,
    /// Attempts started before this claim (a claim counts its own in the
    /// database, so one cut off by a crash is not sent again as the same number).
    pub attempts: i64,
    /// When the first attempt started, if one did.
    pub first_attempt_at: Option<i64>,
    pub give_up_at: Option<i64>,
    pub last_error: Option<String>,
    pub staged: bool,
    pub secret: Option<String>,
    /// The channel of its chat, read with the claim.
    pub channel_id: Option<i64>,
}

const COLUMNS: &str = "seq, id, event_id, kind, policy, target_url, body, chunked, message_id, \
     chat_id, attempts, first_attempt_at, give_up_at, last_error, staged, secret";

fn from_row(row: &AnyRow) -> Result<Claimed, sqlx::Error> {
    Ok(Claimed {
        seq: row.try_get("seq")?,
        id: row.try_get("id")?,
        event_id: row.try_get("event_id")?,
        kind: row.try_get("kind")?,
        policy: row.try_get("policy")?,
        target_url: row.try_get("target_url")?,
        body: row.try_get("body")?,
        chunked: flag(row.try_get("chunked")?),
        message_id: row.try_get("message_id")?,
        chat_id: row.try_get("chat_id")?,
        attempts: row.try_get("attempts")?,
        first_attempt_at: row.try_get("first_attempt_at")?,
        give_up_at: row.try_get("give_up_at")?,
        last_error: row.try_get("last_error")?,
        staged: flag(row.try_get("staged")?),
        secret: row.try_get("secret")?,
        channel_id: row.try_get("channel_id")?,
    })
}

#[cfg(test)]
mod tests {
    use super::claim::{PRUNE, claim_in, claim_sql, next_due_sql};
    use super::*;
    use crate::store::Durability;

    async fn store(dir: &tempfile::TempDir) -> Store {
        let url = format!("sqlite://{}", dir.path().join("hub.db").display());
        Store::open(&url, Durability::Normal).await.expect("store")
    }

    /// On PostgreSQL a claim is one simple query that `EXECUTE`s the claim
    /// and the next due time prepared on its connection, which has them
    /// from the start (made after the migrations); one whose statements
    /// were deallocated gets them again, and the claim still takes its rows.
    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn a_claim_on_a_connection_without_its_statements_still_takes_its_rows() {
        let store = crate::store::test_postgres_one_connection().await;
        for (round, now) in [(0, 1_000), (1, 2_000)] {
            let id = queue(&store, None, now).await;
            // One connection: the one the claim runs on. Round 0: as it
            // was made; round 1: as the round before prepared it again.
            let had = crate::store::deallocate_if_prepared(&store, "hub_claim").await;
            assert!(had, "round {round}: the connection had the claim prepared");
            let (claimed, _) = store
                .claim_and_next_due(now, 60_000, 64)
                .await
                .expect("claimed");
            let ids: Vec<String> = claimed.into_iter().map(|c| c.id).collect();
            assert_eq!(ids, [id], "round {round}");
        }
    }

    /// Queues a forward on chat `chat` (its order key) at `now`; its id.
    async fn queue(store: &Store, chat: Option<i64>, now: i64) -> String {
        let d = NewDelivery::forward(
            uuid::Uuid::now_v7(),
            "crm",
            "http://127.0.0.1:9/".into(),
            "{}".into(),
            chat,
        );
        let mut w = store.begin_write().await.expect("write");
        enqueue(&mut w.tx, &d, now).await.expect("enqueue");
        w.commit().await.expect("commit");
        d.id.to_string()
    }

    /// SQLite's plan for `sql`, one line per step.
    async fn plan(store: &Store, sql: &str, params: &[i64]) -> Vec<String> {
        let mut conn = store.pool().acquire().await.expect("connection");
        let explain = format!("EXPLAIN QUERY PLAN {sql}");
        let mut query = sqlx::query(&explain);
        for param in params {
            query = query.bind(*param);
        }
        query
            .fetch_all(&mut *conn)
            .await
            .expect("plan")
            .iter()
            .map(|row| row.try_get::<String, _>("detail").unwrap_or_default())
            .collect()
    }

    async fn claim(store: &Store, now: i64) -> Vec<String> {
        let claimed = store.claim_due(now, 60_000, 64).await.expect("claim");
        claimed.into_iter().map(|c| c.id).collect()
    }

    /// A claim takes the oldest due rows that nothing earlier on their order
    /// key holds back, in order, and reads only the keys' heads and the rows
    /// behind an expired hold (never every pending row: that cost grew with
    /// the backlog, and was paid in full by a claim that found nothing).
    #[tokio::test]
    async fn a_claim_takes_each_order_keys_first_row_through_the_heads() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = store(&dir).await;
        let a1 = queue(&store, Some(1), 1_000).await;
        let b1 = queue(&store, Some(2), 1_000).await;
        let a2 = queue(&store, Some(1), 1_000).await;
        let _b2 = queue(&store, Some(2), 1_000).await;
        let n1 = queue(&store, None, 1_000).await;
        let later = queue(&store, None, 9_000).await;
        assert_eq!(claim(&store, 2_000).await, [a1.clone(), b1, n1]);
        assert!(claim(&store, 2_000).await.is_empty(), "the rest wait");
        let mut w = store.begin_write().await.expect("write");
        finish(&mut w.tx, &a1, OutboxState::Delivered, None, 1, 2_500)
            .await
            .expect("finish");
        w.commit().await.expect("commit");
        assert_eq!(claim(&store, 3_000).await, [a2]);
        assert_eq!(claim(&store, 9_000).await, [later]);

        let plan = plan(&store, claim_sql(Backend::Sqlite), &[1, 1, 64]).await;
        let heads = "SCAN o USING COVERING INDEX outbox_heads";
        assert!(plan.iter().any(|step| step == heads), "{plan:?}");
        assert!(
            plan.iter()
                .any(|step| step.starts_with("SEARCH h USING INDEX outbox_held")),
            "{plan:?}"
        );
        // The rows behind a held head, and the key's first row that holds
        // it, come from the index of pending rows by key (migration 13).
        assert!(
            plan.iter()
                .any(|step| step.starts_with("SEARCH o USING INDEX outbox_pending_order")),
            "{plan:?}"
        );
        // Every other read of the outbox is a seek; the co-routines' own
        // scans read the rows they found.
        let table_scan = |step: &&String| {
            let mut words = step.split(' ');
            words.next() == Some("SCAN")
                && matches!(words.next(), Some("o" | "h" | "p" | "outbox"))
                && step.as_str() != heads
        };
        assert!(!plan.iter().any(|step| table_scan(&step)), "{plan:?}");
    }

    /// Pruning deletes what was delivered or dropped before the cut-off, a
    /// batch at a time, through an index range; what waits, what is in
    /// flight, dead letters and recent deliveries stay.
    #[tokio::test]
    async fn pruning_deletes_old_finished_rows_only() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = store(&dir).await;
        pruning(&store).await;
        let plan = plan(&store, PRUNE, &[1, 1]).await;
        assert!(
            plan.iter().any(|step| step.starts_with(
                "SEARCH outbox USING INDEX outbox_due (state=? AND next_attempt_at<?)"
            )),
            "{plan:?}"
        );
    }

    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn pruning_deletes_old_finished_rows_only_on_postgres() {
        pruning(&crate::store::required_test_postgres().await).await;
    }

    async fn pruning(store: &Store) {
        let mut old = Vec::new();
        for state in [
            OutboxState::Delivered,
            OutboxState::Dropped,
            OutboxState::Delivered,
        ] {
            let id = queue(store, None, 1_000).await;
            finish_now(store, &id, state, 2_000).await;
            old.push(id);
        }
        let dead = queue(store, None, 1_000).await;
        finish_now(store, &dead, OutboxState::Failed, 2_000).await;
        let recent = queue(store, None, 1_000).await;
        finish_now(store, &recent, OutboxState::Delivered, 9_000).await;
        let in_flight = queue(store, Some(1), 1_000).await;
        let waiting = queue(store, Some(1), 1_000).await;
        assert_eq!(claim(store, 1_500).await, [in_flight.as_str()]);

        assert_eq!(store.prune_finished(5_000, 2).await.expect("prune"), 2);
        assert_eq!(store.prune_finished(5_000, 2).await.expect("prune"), 1);
        assert_eq!(store.prune_finished(5_000, 2).await.expect("prune"), 0);
        for id in &old {
            assert!(store.delivery(id).await.expect("read").is_none(), "{id}");
        }
        for id in [&dead, &recent, &waiting, &in_flight] {
            assert!(store.delivery(id).await.expect("read").is_some(), "{id}");
        }
    }

    async fn finish_now(store: &Store, id: &str, state: OutboxState, now: i64) {
        let mut w = store.begin_write().await.expect("write");
        finish(&mut w.tx, id, state, None, 1, now)
            .await
            .expect("finish");
        w.commit().await.expect("commit");
    }

    /// A failing row holds its key until its hold passes; then the rows
    /// behind it go, one at a time up to the first that holds the key
    /// itself, while the failing row waits for its retry; a dead letter
    /// replayed goes first again.
    #[tokio::test]
    async fn rows_behind_an_expired_hold_go_and_a_replayed_row_goes_first() {
        let dir = tempfile::tempdir().expect("temp dir");
        behind_an_expired_hold(store(&dir).await).await;
    }

    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn rows_behind_an_expired_hold_go_and_a_replayed_row_goes_first_on_postgres() {
        behind_an_expired_hold(crate::store::required_test_postgres().await).await;
    }

    async fn behind_an_expired_hold(store: Store) {
        let a1 = queue(&store, Some(1), 1_000).await;
        let a2 = queue(&store, Some(1), 1_000).await;
        let a3 = queue(&store, Some(1), 1_000).await;
        assert_eq!(claim(&store, 2_000).await, [a1.as_str()]);
        let retry = Retry {
            next_at: 10_000,
            give_up_at: 20_000,
            hold_until: 4_000,
        };
        store
            .reschedule_delivery(&a1, 1, retry, "refused")
            .await
            .expect("reschedule");
        assert!(claim(&store, 3_000).await.is_empty(), "held");
        assert_eq!(claim(&store, 4_000).await, [a2.as_str()]);
        assert!(claim(&store, 5_000).await.is_empty(), "a2 holds a3");
        finish_now(&store, &a2, OutboxState::Delivered, 5_000).await;
        assert_eq!(claim(&store, 5_000).await, [a3.as_str()]);
        assert_eq!(claim(&store, 10_000).await, [a1.as_str()], "its retry");

        let b1 = queue(&store, Some(2), 1_000).await;
        let b2 = queue(&store, Some(2), 1_000).await;
        assert_eq!(claim(&store, 11_000).await, [b1.as_str()]);
        finish_now(&store, &b1, OutboxState::Failed, 11_000).await;
        assert_eq!(claim(&store, 11_000).await, [b2.as_str()], "next in line");
        finish_now(&store, &b2, OutboxState::Delivered, 11_000).await;
        let b3 = queue(&store, Some(2), 12_000).await;
        let replayed = store
            .replay_dead(std::slice::from_ref(&b1), 12_000)
            .await
            .expect("replay");
        assert_eq!(replayed, [b1.as_str()]);
        assert_eq!(claim(&store, 12_000).await, [b1.as_str()], "b1 before b3");
        finish_now(&store, &b1, OutboxState::Delivered, 12_000).await;
        assert_eq!(claim(&store, 12_000).await, [b3.as_str()]);
    }

    /// Results for `claimed`, as the deliverer records them.
    fn delivered(claimed: &[Claimed], now: i64) -> Vec<Finished> {
        claimed
            .iter()
            .map(|c| Finished::delivered(c.seq, now))
            .collect()
    }

    /// PostgreSQL's counts of what this backend did to the outbox: read
    /// before and after within one transaction, since a backend reports its
    /// counts when idle, and until then this view adds up its earlier
    /// transactions too.
    struct OutboxCounts {
        scans: i64,
        updates: i64,
        hot_updates: i64,
    }

    impl OutboxCounts {
        async fn now(conn: &mut AnyConnection) -> OutboxCounts {
            let (scans, updates, hot_updates): (i64, i64, i64) = sqlx::query_as(
                "SELECT CAST(COALESCE(SUM(seq_scan), 0) AS BIGINT), \
                 CAST(COALESCE(SUM(n_tup_upd), 0) AS BIGINT), \
                 CAST(COALESCE(SUM(n_tup_hot_upd), 0) AS BIGINT) \
                 FROM pg_stat_xact_user_tables WHERE relname = 'outbox'",
            )
            .fetch_one(&mut *conn)
            .await
            .expect("the outbox's counts");
            OutboxCounts {
                scans,
                updates,
                hot_updates,
            }
        }
    }

    /// Records `claimed` as delivered at `now`, as one batch of results.
    async fn deliver_all(store: &Store, claimed: &[Claimed], now: i64) {
        let results = delivered(claimed, now);
        let mut w = store.begin_write().await.expect("write");
        finish_many(&mut w.tx, &results.iter().collect::<Vec<_>>(), None)
            .await
            .expect("results");
        w.commit().await.expect("commit");
    }

    /// On PostgreSQL the claim and the results are planned for the outbox
    /// as it is, not as it was: after many turns of the deliverer on a
    /// nearly empty outbox (a plan the connection kept from then reads the
    /// table whole) and a backlog of 20 000 rows since, a claim and its
    /// results read the outbox only through its indexes (the chats and
    /// messages they also read are empty here: scanning those is right).
    #[tokio::test]
    #[ignore = "needs PostgreSQL (scripts/with-postgres.sh)"]
    async fn behind_a_sudden_backlog_the_deliverer_reads_no_table_whole() {
        let store = crate::store::required_test_postgres().await;
        for round in 0..40 {
            queue(&store, Some(round % 3), 1_000).await;
            let claimed = store.claim_due(2_000, 60_000, 64).await.expect("claim");
            deliver_all(&store, &claimed, 2_000).await;
        }
        let mut w = store.begin_write().await.expect("write");
        sqlx::query(
            "INSERT INTO outbox (id, event_id, kind, policy, target_url, body, order_key, \
             chat_id, state, next_attempt_at, created_at, head) \
             SELECT 'backlog-' || g, 'e', 'forward', 'crm', 'http://127.0.0.1:9/', '{}', \
             'crm:chat:' || (g % 500), g % 500, 'pending', 3000, 3000, \
             CASE WHEN g <= 500 THEN 1 ELSE 0 END FROM generate_series(1, 20000) g",
        )
        .execute(&mut *w.tx)
        .await
        .expect("backlog");
        w.commit().await.expect("commit");

        let mut w = store.begin_write().await.expect("write");
        let before = OutboxCounts::now(&mut w.tx).await;
        let claimed = claim_in(&mut w.tx, Backend::Postgres, "test", 4_000, 60_000, 64)
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 64, "the first rows of 64 keys");
        let results = delivered(&claimed, 4_000);
        finish_many(&mut w.tx, &results.iter().collect::<Vec<_>>(), None)
            .await
            .expect("results");
        let after = OutboxCounts::now(&mut w.tx).await;
        assert_eq!(after.scans - before.scans, 0, "the outbox was read whole");
        w.commit().await.expect("commit");
    }

    /// Results written as one batch hand each order key on to its next row,
    /// and only to it, on either database: after two keys' first rows are
    /// delivered together, the next claim takes each key's second row, and
    /// the third rows wait behind them.
    async fn batched_results_hand_each_key_on(store: &Store) {
        let a1 = queue(store, Some(1), 1_000).await;
        let b1 = queue(store, Some(2), 1_000).await;
        let a2 = queue(store, Some(1), 1_000).await;
        let b2 = queue(store, Some(2), 1_000).await;
        queue(store, Some(1), 1_000).await;
        queue(store, Some(2), 1_000).await;
        let first = store.claim_due(2_000, 60_000, 64).await.expect("claim");
        let ids: Vec<&str> = first.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, [a1.as_str(), b1.as_str()]);
        deliver_all(store, &first, 2_500).await;
        assert_eq!(claim(store, 3_000).await, [a2, b2]);
        assert!(claim(store, 3_000).await.is_empty(), "the third rows wait");
    }

    #[tokio::test]
    async fn batched_results_hand_each_key_on_sqlite() {
        let dir = tempfile::tempdir().expect("temp dir");
        batched_results_hand_each_key_on(&store(&dir).await).await;
    }

    #[tokio::test]
    #[ignore = "needs PostgreSQL (scripts/with-postgres.sh)"]
    async fn batched_results_hand_each_key_on_postgres() {
        let store = crate::store::required_test_postgres().await;
        batched_results_hand_each_key_on(&store).await;
    }

    /// On PostgreSQL a claim changes no indexed column (migration 14), so
    /// the rows it leases get their new versions on their own pages (HOT
    /// updates) instead of new entries in each of the outbox's indexes.
    /// With `lease_until` in `outbox_heads`, none was.
    #[tokio::test]
    #[ignore = "needs PostgreSQL (scripts/with-postgres.sh)"]
    async fn a_claim_on_postgresql_leaves_the_outbox_indexes_alone() {
        let store = crate::store::required_test_postgres().await;
        // Rows of a typical size: an agent message's delivery body.
        let body = serde_json::json!({ "message": { "type": "text", "text": "x".repeat(300) } });
        let mut w = store.begin_write().await.expect("write");
        for chat in 0..40 {
            let d = NewDelivery::forward(
                uuid::Uuid::now_v7(),
                "crm",
                "http://127.0.0.1:9/".into(),
                body.to_string(),
                Some(chat),
            );
            enqueue(&mut w.tx, &d, 1_000).await.expect("enqueue");
        }
        w.commit().await.expect("commit");

        let mut w = store.begin_write().await.expect("write");
        let before = OutboxCounts::now(&mut w.tx).await;
        let claimed = claim_in(&mut w.tx, Backend::Postgres, "test", 2_000, 60_000, 64)
            .await
            .expect("claim");
        let after = OutboxCounts::now(&mut w.tx).await;
        w.commit().await.expect("commit");
        assert_eq!(claimed.len(), 40);
        let (updated, hot) = (
            after.updates - before.updates,
            after.hot_updates - before.hot_updates,
        );
        assert_eq!(updated, 40, "one update per claimed row");
        // The pages keep room for about half their rows' second versions;
        // the rest move. Before migration 14: none stayed.
        assert!(hot >= updated / 2, "{hot} of {updated} claims were HOT");
    }

    /// A connection keeps the plan of its prepared claim, and may have made
    /// it while the outbox was empty (a fresh database). Behind a backlog
    /// that plan must still read a few pages, not every pending row against
    /// every other (which took seconds per claim).
    #[tokio::test]
    #[ignore = "needs PostgreSQL (scripts/with-postgres.sh)"]
    async fn a_claim_behind_a_backlog_reads_a_few_pages_whatever_plan_was_kept_on_postgres() {
        let store = crate::store::required_test_postgres().await;
        let mut conn = store.pool().acquire().await.expect("connection");
        let claim = format!(
            "PREPARE kept_claim (BIGINT, BIGINT, BIGINT, TEXT) AS {}",
            claim_sql(Backend::Postgres)
        );
        for sql in [
            "SET plan_cache_mode = force_generic_plan",
            claim.as_str(),
            // Planned now, on the empty table, and kept.
            "EXECUTE kept_claim(31000, 1000, 64, 'test')",
            "INSERT INTO outbox (id, event_id, kind, policy, target_url, body, order_key, \
             chat_id, state, next_attempt_at, created_at, head) \
             SELECT 'p' || g, 'e' || g, 'agent.message', 'p', 'http://127.0.0.1:9/', '{}', \
             'chat:' || (g % 3), NULL, 'pending', 900, 900, CASE WHEN g <= 3 THEN 1 ELSE 0 END \
             FROM generate_series(1, 3000) g",
            "BEGIN",
        ] {
            sqlx::query(sql)
                .execute(&mut *conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        let lines: Vec<(String,)> = sqlx::query_as(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE kept_claim(31000, 1000, 64, 'test')",
        )
        .fetch_all(&mut *conn)
        .await
        .expect("explain");
        sqlx::query("ROLLBACK")
            .execute(&mut *conn)
            .await
            .expect("rollback");
        let plan: Vec<&str> = lines.iter().map(|(l,)| l.as_str()).collect();
        assert!(plan[0].contains("rows=3 "), "the three heads: {plan:#?}");
        // The top node's line: "Buffers: shared hit=N read=M …".
        let pages: i64 = plan
            .iter()
            .find_map(|l| l.trim().strip_prefix("Buffers: shared "))
            .map(|b| {
                b.split_whitespace()
                    .filter_map(|kv| kv.split_once('='))
                    .filter(|(k, _)| matches!(*k, "hit" | "read"))
                    .filter_map(|(_, v)| v.trim_end_matches(',').parse::<i64>().ok())
                    .sum()
            })
            .unwrap_or_else(|| panic!("no buffers line: {plan:#?}"));
        assert!(pages < 500, "{pages} pages read for one claim: {plan:#?}");
    }

    /// The deliverer's next look reads no pending row but through an
    /// index seek: the next attempt through `outbox_due`, the earliest hold
    /// through `outbox_held`.
    #[tokio::test]
    async fn the_next_look_is_two_index_seeks() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = store(&dir).await;
        let plan = plan(&store, next_due_sql(Backend::Sqlite), &[1]).await;
        let seeks: Vec<&String> = plan.iter().filter(|s| s.starts_with("SEARCH")).collect();
        assert_eq!(seeks.len(), 2, "{plan:?}");
        assert!(
            seeks[0].contains("outbox_due (state=? AND next_attempt_at>?)"),
            "{plan:?}"
        );
        assert!(seeks[1].contains("outbox_held (hold_until>?)"), "{plan:?}");
    }

    /// The deliverer's next look without a kick: the next attempt or hold
    /// after the claim, never a row that was already due at it (the claim
    /// took what it could; the rest waits for a row in flight).
    #[tokio::test]
    async fn the_next_look_is_the_next_attempt_or_hold_after_the_claim() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = store(&dir).await;
        assert_eq!(store.next_due_at(1_000).await.expect("next"), None);
        let first = queue(&store, Some(1), 1_000).await;
        queue(&store, Some(1), 1_000).await;
        assert_eq!(store.next_due_at(1_000).await.expect("next"), None);
        queue(&store, None, 8_000).await;
        assert_eq!(store.next_due_at(1_000).await.expect("next"), Some(8_000));
        store
            .reschedule_delivery(
                &first,
                1,
                Retry {
                    next_at: 10_000,
                    give_up_at: 20_000,
                    hold_until: 4_000,
                },
                "refused",
            )
            .await
            .expect("reschedule");
        assert_eq!(store.next_due_at(1_000).await.expect("next"), Some(4_000));
        assert_eq!(store.next_due_at(4_000).await.expect("next"), Some(8_000));
        assert_eq!(store.next_due_at(8_000).await.expect("next"), Some(10_000));
        assert_eq!(store.next_due_at(10_000).await.expect("next"), None);
    }
}
