//! PostgreSQL: statements prepared by name on each connection and run with
//! `EXECUTE` from a simple query, so a batch's first statement (its read,
//! or its results' write) shares the round trip that begins its
//! transaction, and a claim the round trip of its lock and next due time,
//! and their plans are still kept.
//!
//! Why: a simple query carries several statements in one round trip but no
//! parameters, so a statement in it is planned every time (a batch's read
//! planned anew cost more than it saved); an `EXECUTE` with its values
//! written in runs the plan the connection keeps. A connection gets the
//! statements as it connects (the pool's `after_connect`) once the schema
//! is this build's; the connection that applied the migrations is closed
//! after them. One that lacks a statement all the same (deallocated, a
//! pooler's `DISCARD ALL`) gets them the first time a begin finds one
//! missing (`26000`, one `ERROR` line in the server's log): rolled back,
//! prepared, begun again.

use super::batch::{Literal, inline};
use super::{First, FirstStatement, StoreError, ingress};

/// A statement every connection has under `name`, with its parameters'
/// types.
pub(super) struct Prepared {
    name: &'static str,
    params: &'static str,
    sql: fn() -> &'static str,
}

/// A batch of customer messages' known clients (`ingress.rs`).
pub(super) const KNOWN_CLIENTS: Prepared = Prepared {
    name: "hub_known_clients",
    params: "(TEXT)",
    sql: || ingress::known_sql(true),
};

/// A batch of customer messages' messages and events (`ingress.rs`), when
/// its `COMMIT` goes with it (`TxConn::finish`).
pub(super) const CUSTOMER_MESSAGES: Prepared = Prepared {
    name: "hub_customer_messages",
    params: "(TEXT)",
    sql: || ingress::PG_MESSAGES,
};

/// The batch's new visitors' numbers (`ingress.rs`), the same.
pub(super) const NUMBERING: Prepared = Prepared {
    name: "hub_numbering",
    params: "(TEXT, BIGINT)",
    sql: || ingress::PG_NUMBERING,
};

/// A batch of agent messages' messages, events and outbox rows
/// (`outgoing.rs`), the same.
pub(super) const OUTGOING: Prepared = Prepared {
    name: "hub_outgoing",
    params: "(TEXT, BIGINT)",
    sql: || super::outgoing::PG_SCRIPT,
};

/// The chats an agent batch accepts (`outgoing.rs` `accept_chats`).
pub(super) const ACCEPT_CHATS: Prepared = Prepared {
    name: "hub_accept_chats",
    params: "(TEXT, BIGINT)",
    sql: || super::chats::accept_chats_sql(true),
};

/// Their cards, for their `chat_accepted` webhooks (the same).
pub(super) const CHAT_CARDS: Prepared = Prepared {
    name: "hub_chat_cards",
    params: "(TEXT, BIGINT)",
    sql: || super::webhooks::chat_cards_sql(true),
};

/// A batch of agent messages' chats (`outgoing.rs`).
pub(super) const CHATS_BY_IDS: Prepared = Prepared {
    name: "hub_chats_by_ids",
    params: "(TEXT, BIGINT)",
    sql: || super::outgoing::chats_sql(true),
};

/// A batch of delivery results (`outbox/write.rs`).
pub(super) const FINISH: Prepared = Prepared {
    name: "hub_finish",
    params: "(TEXT, BIGINT)",
    sql: || super::outbox::PG_FINISH,
};

/// The deliverer's claim (`outbox/claim.rs`): `$1` the lease's end, `$2`
/// now, `$3` the most rows, `$4` the instance.
pub(super) const CLAIM: Prepared = Prepared {
    name: "hub_claim",
    params: "(BIGINT, BIGINT, BIGINT, TEXT)",
    sql: || super::outbox::claim_sql(super::Backend::Postgres),
};

/// The outbox's next due time after a claim (`outbox/claim.rs`).
pub(super) const NEXT_DUE: Prepared = Prepared {
    name: "hub_next_due",
    params: "(BIGINT)",
    sql: || super::outbox::next_due_sql(super::Backend::Postgres),
};

/// The locks a row-mode batch takes as it begins (`locks.rs`
/// `RowLocks::executes`): its senders, its chats' senders with its order
/// keys, its outbox rows' order keys.
pub(super) const LOCK_SENDERS: Prepared = Prepared {
    name: "hub_lock_senders",
    params: "(TEXT)",
    sql: super::locks::senders_prepared,
};

pub(super) const LOCK_CHATS: Prepared = Prepared {
    name: "hub_lock_chats",
    params: "(TEXT, TEXT)",
    sql: super::locks::chats_prepared,
};

pub(super) const LOCK_ROWS: Prepared = Prepared {
    name: "hub_lock_rows",
    params: "(TEXT)",
    sql: super::locks::rows_prepared,
};

/// The row mode's settings and shared lock ([`super::PG_ROWS_TURN`]), one
/// statement kept planned instead of two planned in every begin. Last of
/// [`ALL`]: a begin that finds it has every other.
pub(super) const ROWS_TURN: Prepared = Prepared {
    name: "hub_rows_turn",
    params: "",
    sql: || super::ROWS_TURN_SQL,
};

/// Every statement a connection is given at once.
///
/// A connection that has one of them has every one before it: they are
/// prepared in this order and stop at the first that fails. So those the
/// batches `EXECUTE` in the middle of their transactions, where a missing
/// one cannot be given (the transaction has failed), come before
/// [`KNOWN_CLIENTS`] and [`CHATS_BY_IDS`], whose `EXECUTE` in a batch's
/// begin finds a connection that lacks them and gives it all
/// ([`is_missing`]).
const ALL: [&Prepared; 14] = [
    &CUSTOMER_MESSAGES,
    &NUMBERING,
    &OUTGOING,
    &ACCEPT_CHATS,
    &CHAT_CARDS,
    &KNOWN_CLIENTS,
    &CHATS_BY_IDS,
    &FINISH,
    &CLAIM,
    &NEXT_DUE,
    &LOCK_SENDERS,
    &LOCK_CHATS,
    &LOCK_ROWS,
    &ROWS_TURN,
];

impl Prepared {
    /// `EXECUTE` of the statement with `values` written in (`batch::inline`).
    pub(super) fn execute(&self, values: &[Literal<'_>]) -> Result<String, StoreError> {
        let args: Vec<String> = (1..=values.len()).map(|n| format!("${n}")).collect();
        inline(
            &format!("EXECUTE {}({})", self.name, args.join(", ")),
            values,
        )
    }

    /// The statement itself with `values` written in: planned where it
    /// runs, for a connection that may not have it prepared.
    pub(super) fn inline(&self, values: &[Literal<'_>]) -> Result<String, StoreError> {
        inline((self.sql)(), values)
    }

    /// [`execute`](Prepared::execute) as a batch's first statement.
    pub(super) fn read(&self, values: &[Literal<'_>]) -> Result<FirstStatement, StoreError> {
        self.execute(values).map(|sql| {
            FirstStatement(First::Postgres {
                sql,
                commits: false,
            })
        })
    }
}

/// The statements that give a connection every [`Prepared`] but those it
/// has (`have`, the names in its `pg_prepared_statements`), one each: a
/// `PREPARE` of a name it has would fail ([`is_duplicate`]), an `ERROR`
/// line in the server's log.
pub(super) fn prepare_statements(have: &[String]) -> Vec<String> {
    ALL.iter()
        .filter(|p| !have.iter().any(|name| name == p.name))
        .map(|p| format!("PREPARE {} {} AS {}", p.name, p.params, (p.sql)()))
        .collect()
}

/// Whether `error` says a prepared statement is missing on the connection.
pub(super) fn is_missing(error: &StoreError) -> bool {
    has_code(error, "26000")
}

/// Whether `error` says the connection has the statement already.
pub(super) fn is_duplicate(error: &StoreError) -> bool {
    has_code(error, "42P05")
}

fn has_code(error: &StoreError, code: &str) -> bool {
    let StoreError::Db { source, .. } = error else {
        return false;
    };
    source
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|c| c == code)
}
