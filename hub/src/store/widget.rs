//! Widget visitors: their client rows by visitor key, the session the page
//! reports, custom data, user token, history and the attribute-call budget.

use sqlx::{AnyConnection, Row};

use super::chats::{CLIENT_COLUMNS, MESSAGE_COLUMNS, client_from_row, message_from_row, qualified};
use super::{Client, Ctx, MessageRow, Store, StoreError};

/// What the page reports of the visitor's session.
#[derive(Debug, Clone, Default)]
pub struct PageReport<'a> {
    pub url: Option<&'a str>,
    pub title: Option<&'a str>,
    pub referrer: Option<&'a str>,
    pub ip: Option<&'a str>,
    pub user_agent: Option<&'a str>,
    /// `utm_json` as JSON text.
    pub utm_json: Option<&'a str>,
    /// Country, region, city of `ip` as JSON text (with a GeoIP database).
    pub geoip_json: Option<&'a str>,
}

/// A page opened this long after the previous one starts a new visit.
pub const VISIT_GAP_MS: i64 = 30 * 60 * 1000;

/// Records the page (only what is given replaces what was known). A page
/// load (`page_load`) counts a new visit in `visits_count` when the previous
/// one was [`VISIT_GAP_MS`] or more ago.
pub async fn set_page(
    conn: &mut AnyConnection,
    client_id: i64,
    page: &PageReport<'_>,
    page_load: bool,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE clients SET url = COALESCE($1, url), page_title = COALESCE($2, page_title), \
         referrer = COALESCE($3, referrer), ip = COALESCE($4, ip), \
         user_agent = COALESCE($5, user_agent), utm_json = COALESCE($6, utm_json), \
         geoip_json = COALESCE($11, geoip_json), \
         visits_count = visits_count + CASE WHEN $7 = 1 AND (last_visit_at IS NULL \
             OR last_visit_at <= $8 - $10) THEN 1 ELSE 0 END, \
         last_visit_at = CASE WHEN $7 = 1 THEN $8 ELSE last_visit_at END, \
         updated_at = $8 WHERE id = $9",
    )
    .bind(page.url)
    .bind(page.title)
    .bind(page.referrer)
    .bind(page.ip)
    .bind(page.user_agent)
    .bind(page.utm_json)
    .bind(i64::from(page_load))
    .bind(now)
    .bind(client_id)
    .bind(VISIT_GAP_MS)
    .bind(page.geoip_json)
    .execute(conn)
    .await
    .ctx("recording a visitor's page")?;
    Ok(())
}

pub async fn set_custom_data(
    conn: &mut AnyConnection,
    client_id: i64,
    fields_json: &str,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE clients SET widget_custom_data = $1 WHERE id = $2")
        .bind(fields_json)
        .bind(client_id)
        .execute(conn)
        .await
        .ctx("saving custom data")?;
    Ok(())
}

pub async fn set_user_token(
    conn: &mut AnyConnection,
    client_id: i64,
    token: &str,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE clients SET user_token = $1 WHERE id = $2")
        .bind(token)
        .bind(client_id)
        .execute(conn)
        .await
        .ctx("saving a user token")?;
    Ok(())
}

/// The visitor's history starts at `from` (Unix ms): `clearHistory`.
pub async fn set_history_from(
    conn: &mut AnyConnection,
    client_id: i64,
    from: i64,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE clients SET history_from = $1 WHERE id = $2")
        .bind(from)
        .bind(client_id)
        .execute(conn)
        .await
        .ctx("clearing a visitor's history")?;
    Ok(())
}

/// Counts a `setClientAttributes` call if fewer than `max` were made since
/// `since`; false (and nothing counted) otherwise.
pub async fn take_attribute_call(
    conn: &mut AnyConnection,
    client_id: i64,
    since: i64,
    max: i64,
    now: i64,
) -> Result<bool, StoreError> {
    sqlx::query("DELETE FROM widget_attribute_calls WHERE client_id = $1 AND at < $2")
        .bind(client_id)
        .bind(since)
        .execute(&mut *conn)
        .await
        .ctx("counting attribute calls")?;
    let (made,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM widget_attribute_calls WHERE client_id = $1")
            .bind(client_id)
            .fetch_one(&mut *conn)
            .await
            .ctx("counting attribute calls")?;
    if made >= max {
        return Ok(false);
    }
    sqlx::query("INSERT INTO widget_attribute_calls (client_id, at) VALUES ($1, $2)")
        .bind(client_id)
        .bind(now)
        .execute(conn)
        .await
        .ctx("counting attribute calls")?;
    Ok(true)
}

/// A visitor's session data the widget shows back to the page.
#[derive(Debug, Clone, Default)]
pub struct VisitorExtras {
    pub description: Option<String>,
    /// `setCustomData`'s fields as JSON text.
    pub custom_data: Option<String>,
    pub page_title: Option<String>,
    pub referrer: Option<String>,
    pub ip: Option<String>,
    pub user_agent: Option<String>,
    pub utm_json: Option<String>,
    pub geoip_json: Option<String>,
    pub visits_count: i64,
    pub history_from: Option<i64>,
    /// `setUserToken`'s token.
    pub user_token: Option<String>,
    /// The client's attributes (a JSON object as text), set by agents.
    pub attributes: Option<String>,
}

impl Store {
    /// The client of visitor `key` on widget channel `channel_id`.
    pub async fn visitor(&self, channel_id: i64, key: &str) -> Result<Option<Client>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {CLIENT_COLUMNS} FROM clients WHERE channel_id = $1 AND external_key = $2"
        ))
        .bind(channel_id)
        .bind(key)
        .fetch_optional(self.pool())
        .await
        .ctx("looking up a visitor")?;
        row.as_ref().map(client_from_row).transpose()
    }

    pub async fn visitor_extras(&self, client_id: i64) -> Result<VisitorExtras, StoreError> {
        let row = sqlx::query(
            "SELECT description, widget_custom_data, page_title, referrer, ip, user_agent, \
             utm_json, geoip_json, visits_count, history_from, user_token, attributes \
             FROM clients WHERE id = $1",
        )
        .bind(client_id)
        .fetch_optional(self.pool())
        .await
        .ctx("reading a visitor")?;
        let Some(row) = row else {
            return Ok(VisitorExtras::default());
        };
        let text = |c: &str| row.try_get::<Option<String>, _>(c).ctx("reading a visitor");
        Ok(VisitorExtras {
            description: text("description")?,
            custom_data: text("widget_custom_data")?,
            page_title: text("page_title")?,
            referrer: text("referrer")?,
            ip: text("ip")?,
            user_agent: text("user_agent")?,
            utm_json: text("utm_json")?,
            geoip_json: text("geoip_json")?,
            visits_count: row.try_get("visits_count").ctx("reading a visitor")?,
            history_from: row.try_get("history_from").ctx("reading a visitor")?,
            user_token: text("user_token")?,
            attributes: text("attributes")?,
        })
    }

    /// The visitor's messages in all their chats since `from`, oldest first,
    /// at most the latest `limit`.
    pub async fn visitor_messages(
        &self,
        client_id: i64,
        from: i64,
        limit: i64,
    ) -> Result<Vec<MessageRow>, StoreError> {
        let columns = qualified("m", MESSAGE_COLUMNS);
        let rows = sqlx::query(&format!(
            "SELECT * FROM (SELECT {columns} FROM messages m JOIN chats c ON c.id = m.chat_id \
             WHERE c.client_id = $1 AND m.created_at >= $2 ORDER BY m.id DESC LIMIT $3) \
             AS latest ORDER BY id"
        ))
        .bind(client_id)
        .bind(from)
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .ctx("reading a visitor's history")?;
        rows.iter().map(message_from_row).collect()
    }

    /// The visitor's messages after message `after` (by id) since `from`,
    /// oldest first, at most `limit`: what a visitor's stream missed. Message
    /// ids follow commit order (every write takes the one write turn), so a
    /// message committed later never has a smaller id than one read here.
    pub async fn visitor_messages_after(
        &self,
        client_id: i64,
        after: i64,
        from: i64,
        limit: i64,
    ) -> Result<Vec<MessageRow>, StoreError> {
        let columns = qualified("m", MESSAGE_COLUMNS);
        let rows = sqlx::query(&format!(
            "SELECT {columns} FROM messages m JOIN chats c ON c.id = m.chat_id \
             WHERE c.client_id = $1 AND m.id > $2 AND m.created_at >= $3 ORDER BY m.id LIMIT $4"
        ))
        .bind(client_id)
        .bind(after)
        .bind(from)
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .ctx("reading a visitor's missed messages")?;
        rows.iter().map(message_from_row).collect()
    }

    /// The id of the visitor's latest message (0 without any): where a
    /// stream opened without a resume point starts.
    pub async fn visitor_last_message_id(&self, client_id: i64) -> Result<i64, StoreError> {
        let (id,): (Option<i64>,) = sqlx::query_as(
            "SELECT MAX(m.id) FROM messages m JOIN chats c ON c.id = m.chat_id \
             WHERE c.client_id = $1",
        )
        .bind(client_id)
        .fetch_one(self.pool())
        .await
        .ctx("reading a visitor's latest message")?;
        Ok(id.unwrap_or(0))
    }

    /// The ids of the visitor's chats, and the latest one with its state.
    pub async fn visitor_chats(
        &self,
        client_id: i64,
    ) -> Result<Vec<(i64, String, Option<i64>)>, StoreError> {
        sqlx::query_as("SELECT id, state, agent_id FROM chats WHERE client_id = $1 ORDER BY id")
            .bind(client_id)
            .fetch_all(self.pool())
            .await
            .ctx("reading a visitor's chats")
    }
}
