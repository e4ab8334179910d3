//! Who holds the outbox's leases: each running hub's identity and heartbeat
//! (`instances`), so a restarted instance takes back its own leases at once
//! and a dead one's are taken over after a few seconds, not after a lease.

use super::{Ctx, Store, StoreError};

/// This process as the outbox knows it: `id` names it across restarts (the
/// operator's `[server] instance_id`, or the host and the address it
/// listens on), `boot` this run of it alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub id: String,
    pub boot: String,
}

impl Identity {
    /// An identity of its own for a process that names none (the CLI's
    /// commands, tests): its leases are never taken back by a restart, only
    /// over by others once its heartbeat stops.
    pub fn anonymous() -> Identity {
        let boot = crate::ids::random_token();
        Identity {
            id: format!("anonymous-{boot}"),
            boot,
        }
    }

    /// A named identity with a fresh boot.
    pub fn named(id: impl Into<String>) -> Identity {
        Identity {
            id: id.into(),
            boot: crate::ids::random_token(),
        }
    }
}

/// What a heartbeat found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// The row is this run's.
    Alive,
    /// Another run took this identity over (two processes configured alike,
    /// or this one was taken for dead while it stalled and has just come
    /// back): the row is this run's again, but its leases may have been
    /// taken over meanwhile.
    Reclaimed,
}

/// Leases a dead instance held, now free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenOver {
    pub instance: String,
    pub deliveries: u64,
}

impl Store {
    /// This process's identity (what its claims write as `lease_owner`).
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Marks this run as the live holder of its identity and gives back the
    /// leases the identity's previous run left (it died mid-delivery: those
    /// rows are retried now, not when their lease runs out). Returns how
    /// many leases it gave back.
    pub async fn register_instance(&self, now: i64) -> Result<u64, StoreError> {
        let Identity { id, boot } = self.identity();
        let mut w = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO instances (id, boot, started_at, heartbeat_at) VALUES ($1, $2, $3, $3) \
             ON CONFLICT (id) DO UPDATE SET boot = excluded.boot, \
             started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at",
        )
        .bind(id)
        .bind(boot)
        .bind(now)
        .execute(&mut *w.tx)
        .await
        .ctx("registering this instance")?;
        let given = release_owned_by(&mut w.tx, id).await?;
        w.commit().await?;
        Ok(given)
    }

    /// Tells the other instances this one is alive. A single statement
    /// outside the write turn: it touches only this instance's row.
    pub async fn heartbeat(&self, now: i64) -> Result<Beat, StoreError> {
        let Identity { id, boot } = self.identity();
        let done =
            sqlx::query("UPDATE instances SET heartbeat_at = $1 WHERE id = $2 AND boot = $3")
                .bind(now)
                .bind(id)
                .bind(boot)
                .execute(self.pool())
                .await
                .ctx("recording a heartbeat")?;
        if done.rows_affected() == 1 {
            return Ok(Beat::Alive);
        }
        // The row is gone (taken for dead) or names another run: this run is
        // alive, so it says so again. Its own leases stay as they are: it is
        // still sending them.
        sqlx::query(
            "INSERT INTO instances (id, boot, started_at, heartbeat_at) VALUES ($1, $2, $3, $3) \
             ON CONFLICT (id) DO UPDATE SET boot = excluded.boot, heartbeat_at = excluded.heartbeat_at",
        )
        .bind(id)
        .bind(boot)
        .bind(now)
        .execute(self.pool())
        .await
        .ctx("recording a heartbeat")?;
        Ok(Beat::Reclaimed)
    }

    /// How many other instances beat at or after `since`.
    pub async fn others_alive(&self, since: i64) -> Result<usize, StoreError> {
        let (alive,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM instances WHERE id <> $1 AND heartbeat_at >= $2")
                .bind(&self.identity().id)
                .bind(since)
                .fetch_one(self.pool())
                .await
                .ctx("reading the other instances")?;
        Ok(usize::try_from(alive).unwrap_or(0))
    }

    /// Takes over the leases of every other instance whose heartbeat is
    /// older than `dead_before`, and forgets those instances. Cheap when
    /// nobody died: one read of the (small) instances table.
    pub async fn take_over_dead(&self, dead_before: i64) -> Result<Vec<TakenOver>, StoreError> {
        let own = &self.identity().id;
        let stale: Vec<(String,)> =
            sqlx::query_as("SELECT id FROM instances WHERE heartbeat_at < $1 AND id <> $2")
                .bind(dead_before)
                .bind(own)
                .fetch_all(self.pool())
                .await
                .ctx("finding instances without a heartbeat")?;
        let mut taken = Vec::new();
        for (instance,) in stale {
            let mut w = self.begin_write().await?;
            // Only if it is still dead now, under the write: two survivors
            // looking at once take it over once, and an instance that beat
            // meanwhile keeps its leases.
            let gone = sqlx::query("DELETE FROM instances WHERE id = $1 AND heartbeat_at < $2")
                .bind(&instance)
                .bind(dead_before)
                .execute(&mut *w.tx)
                .await
                .ctx("forgetting a dead instance")?;
            if gone.rows_affected() == 0 {
                continue;
            }
            let deliveries = release_owned_by(&mut w.tx, &instance).await?;
            w.commit().await?;
            taken.push(TakenOver {
                instance,
                deliveries,
            });
        }
        Ok(taken)
    }

    /// Forgets this instance at a clean shutdown (its leases were given
    /// back one by one already).
    pub async fn deregister_instance(&self) -> Result<(), StoreError> {
        let Identity { id, boot } = self.identity();
        sqlx::query("DELETE FROM instances WHERE id = $1 AND boot = $2")
            .bind(id)
            .bind(boot)
            .execute(self.pool())
            .await
            .ctx("deregistering this instance")?;
        Ok(())
    }
}

/// Frees the pending rows leased by `owner`; how many. Pending rows are a
/// range of `outbox_due`, so this reads the queue, not the history.
async fn release_owned_by(conn: &mut sqlx::AnyConnection, owner: &str) -> Result<u64, StoreError> {
    let done = sqlx::query(
        "UPDATE outbox SET lease_until = NULL, lease_owner = NULL \
         WHERE state = 'pending' AND lease_owner = $1 AND lease_until IS NOT NULL",
    )
    .bind(owner)
    .execute(conn)
    .await
    .ctx("giving back an instance's leases")?;
    Ok(done.rows_affected())
}
