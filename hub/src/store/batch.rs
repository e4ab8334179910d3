//! What the batch writers (`ingress.rs`, the delivery results in
//! `outbox.rs`) share: a batch bound as rows of anonymous parameters,
//! scripts prepared per power-of-two batch size, a script's rows collected
//! per statement in one round trip, and (PostgreSQL) values written into
//! a simple query of several statements.

use futures_util::{Stream, StreamExt};
use sqlx::any::{AnyQueryResult, AnyRow};
use sqlx::{AnyConnection, Either, Row};

use super::{Ctx, StoreError};

pub(super) type Query<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

/// The smallest power of two that holds `n` rows: a batch is padded to it
/// (with NULL rows the statements skip), so a few prepared scripts serve
/// every batch size.
pub(super) fn slots_for(n: usize) -> usize {
    n.next_power_of_two()
}

/// `slots` rows of `width` parameters, for a `VALUES` list.
///
/// Anonymous `?` parameters: the driver looks each numbered one up by name,
/// a scan of all the statement's names, which is quadratic in a batch.
pub(super) fn values(width: usize, slots: usize) -> String {
    let row = format!("({})", vec!["?"; width].join(", "));
    vec![row; slots].join(", ")
}

/// Binds NULL to the `width` columns of each unused row between `used` and
/// `slots`: a script is built for a power of two of rows.
pub(super) fn pad_slots(
    mut query: Query<'_>,
    width: usize,
    used: usize,
    slots: usize,
) -> Query<'_> {
    for _ in 0..width * slots.saturating_sub(used) {
        query = query.bind(None::<String>);
    }
    query
}

/// The scripts for batches of 1, 2, 4 … `max` rows, built once by `build`.
pub(super) struct Scripts {
    built: std::sync::OnceLock<Vec<String>>,
    build: fn(usize) -> String,
    max: usize,
}

impl Scripts {
    pub(super) const fn new(max: usize, build: fn(usize) -> String) -> Scripts {
        Scripts {
            built: std::sync::OnceLock::new(),
            build,
            max,
        }
    }

    /// The script for `slots` rows (a power of two up to `max`).
    pub(super) fn get(&self, slots: usize) -> &str {
        let scripts = self.built.get_or_init(|| {
            (0..=self.max.trailing_zeros())
                .map(|power| (self.build)(1 << power))
                .collect()
        });
        let power = slots.trailing_zeros() as usize;
        scripts.get(power).map(String::as_str).unwrap_or_default()
    }
}

/// Reads column `column` of the one row of a statement as JSON: results come
/// back aggregated (`json_group_array`), one row per statement, because every
/// row is a hand-off between the driver's thread and ours.
pub(super) fn json_cell<T: serde::de::DeserializeOwned>(
    rows: Option<&Vec<AnyRow>>,
    column: usize,
) -> Result<T, StoreError> {
    let Some(row) = rows.and_then(|rows| rows.first()) else {
        return Err(StoreError::Corrupt(
            "a batch statement returned no row".into(),
        ));
    };
    let text: Option<String> = row.try_get(column).ctx("reading a batch result")?;
    serde_json::from_str(text.as_deref().unwrap_or("[]"))
        .map_err(|e| StoreError::Corrupt(format!("a batch result: {e}")))
}

/// A value written into a statement: PostgreSQL's simple queries, which
/// carry several statements in one round trip, take no parameters.
pub(super) enum Literal<'a> {
    Int(i64),
    Text(&'a str),
}

/// `sql` with each `$n` replaced by `values[n - 1]` written in: an integer
/// as a `BIGINT`, text as hexadecimal the server decodes, so no value is
/// ever part of the statement's syntax. A `$` not followed by a digit is
/// left as it is; a `$n` without a value is an error.
pub(super) fn inline(sql: &str, values: &[Literal<'_>]) -> Result<String, StoreError> {
    let mut out = String::with_capacity(sql.len() + 64);
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            out.push('$');
            rest = after;
            continue;
        }
        let value = after[..digits]
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| values.get(i))
            .ok_or_else(|| {
                StoreError::Corrupt(format!("a statement's ${} has no value", &after[..digits]))
            })?;
        match value {
            Literal::Int(n) => out.push_str(&format!("CAST({n} AS BIGINT)")),
            Literal::Text(text) => out.push_str(&text_literal(text)),
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `text` as an SQL expression of type TEXT of which nothing is ever part
/// of the statement's syntax: dollar-quoted as it is ([`DOLLAR_TAG`]) when
/// the tag cannot end it early, else as hexadecimal the server decodes.
///
/// Why dollar quotes: a batch's JSON is most of a simple query's bytes, and
/// hexadecimal doubled what the server's lexer scans and added a decode
/// and a conversion (measured with it: see docs/performance.md).
/// The fallback: `convert_from`'s result takes the collation of its `name`
/// argument (`C`), and an index on a text column (of the database's
/// collation) cannot serve a comparison with it: the text gets the default
/// one, as a quoted literal has.
pub(super) fn text_literal(text: &str) -> String {
    if dollar_quotable(text) {
        return format!("CAST({DOLLAR_TAG}{text}{DOLLAR_TAG} AS TEXT)");
    }
    format!(
        "(convert_from(decode('{}', 'hex'), 'UTF8') COLLATE \"default\")",
        hex::encode(text)
    )
}

/// The dollar-quote tag of [`text_literal`].
const DOLLAR_TAG: &str = "$hub$";

/// Whether `text` between two [`DOLLAR_TAG`]s is read back as itself: the
/// server ends the string at the first tag after the opening one, so the
/// tag may not occur in the text, nor begin in it and end in the closing
/// tag (`…$hub` then `$hub$`); and a NUL would end the query string.
fn dollar_quotable(text: &str) -> bool {
    let closing = text.len();
    let joined = format!("{text}{DOLLAR_TAG}");
    joined.find(DOLLAR_TAG) == Some(closing) && !text.contains('\0')
}

/// An event's payload as a cell of a batch's JSON for PostgreSQL's
/// `json_to_recordset` into a TEXT column: an object or array written in
/// as JSON, which the server hands the column as the exact text it was
/// sent (what `Value::to_string` writes), so it is neither escaped here nor
/// unescaped there; anything else as its text in a JSON string (a string
/// written in would reach the column unquoted, `null` as NULL), and so is
/// a payload holding a NUL (`\u0000`), which the server refuses to unescape
/// inside a nested value but keeps as text inside a string.
#[derive(serde::Serialize)]
#[serde(untagged)]
pub(super) enum PayloadCell<'a> {
    Nested(&'a serde_json::Value),
    Text(String),
}

impl<'a> PayloadCell<'a> {
    pub(super) fn of(payload: &'a serde_json::Value) -> PayloadCell<'a> {
        match payload {
            serde_json::Value::Object(_) | serde_json::Value::Array(_) if !holds_nul(payload) => {
                PayloadCell::Nested(payload)
            }
            other => PayloadCell::Text(other.to_string()),
        }
    }
}

/// Whether a string or key anywhere in `value` holds a NUL.
fn holds_nul(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(items) => items.iter().any(holds_nul),
        serde_json::Value::Object(map) => map
            .iter()
            .any(|(key, item)| key.contains('\0') || holds_nul(item)),
        _ => false,
    }
}

/// Runs a script of statements with one text parameter; the rows of each
/// statement, in order.
pub(super) async fn run_script(
    conn: &mut AnyConnection,
    sql: &str,
    param: String,
    what: &'static str,
) -> Result<Vec<Vec<AnyRow>>, StoreError> {
    run(conn, sqlx::query(sql).bind(param), what).await
}

/// Runs a bound script in one round trip; the rows of each statement, in order.
pub(super) async fn run(
    conn: &mut AnyConnection,
    query: Query<'_>,
    what: &'static str,
) -> Result<Vec<Vec<AnyRow>>, StoreError> {
    collect(sqlx::Executor::fetch_many(conn, query), what).await
}

/// Runs `sql`, statements with their values written in ([`inline`]), as
/// one simple query: one round trip; the rows of each statement, in order.
pub(super) async fn run_simple(
    conn: &mut AnyConnection,
    sql: &str,
    what: &'static str,
) -> Result<Vec<Vec<AnyRow>>, StoreError> {
    collect(sqlx::Executor::fetch_many(conn, sqlx::raw_sql(sql)), what).await
}

async fn collect(
    results: impl Stream<Item = Result<Either<AnyQueryResult, AnyRow>, sqlx::Error>>,
    what: &'static str,
) -> Result<Vec<Vec<AnyRow>>, StoreError> {
    let mut statements = Vec::new();
    let mut current = Vec::new();
    let mut results = std::pin::pin!(results);
    while let Some(result) = results.next().await {
        match result.ctx(what)? {
            Either::Right(row) => current.push(row),
            Either::Left(_) => statements.push(std::mem::take(&mut current)),
        }
    }
    Ok(statements)
}

/// Tests' check that PostgreSQL finds a batch's rows by key whatever plan
/// it keeps, part one: each of `plans` (what, statement, its arguments
/// written in) is prepared as `p<i>` on `conn`, which has `plan_cache_mode
/// = force_generic_plan` set (the plan a prepared statement runs after five
/// executions), and run once through `EXPLAIN` in a transaction with the
/// write transactions' settings (`PG_KEYED_PLANS`), which makes the plan
/// the connection keeps from then on, for the tables as they are now.
#[cfg(test)]
pub(crate) async fn prepare_plans(conn: &mut sqlx::PgConnection, plans: &[(&str, String, String)]) {
    for (i, (what, sql, args)) in plans.iter().enumerate() {
        sqlx::raw_sql(&format!(
            "BEGIN; {}; PREPARE p{i} AS {sql}; EXPLAIN EXECUTE p{i}({args}); COMMIT",
            super::PG_KEYED_PLANS
        ))
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("preparing {what}: {e}"));
    }
}

/// Part two, after the tables changed: no kept plan of [`prepare_plans`]
/// scans any of `tables` whole or walks its primary key backward.
#[cfg(test)]
pub(crate) async fn assert_read_by_key(
    conn: &mut sqlx::PgConnection,
    plans: &[(&str, String, String)],
    tables: &[&str],
) {
    use sqlx::Row;
    for (i, (what, _, args)) in plans.iter().enumerate() {
        // With the write transactions' settings, as the hub runs them: a
        // plan the server dropped meanwhile (an autoanalyze of the grown
        // tables) is made again as the hub's would be.
        let explained = sqlx::raw_sql(&format!(
            "BEGIN; {}; EXPLAIN EXECUTE p{i}({args}); COMMIT",
            super::PG_KEYED_PLANS
        ))
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("explaining {what}: {e}"));
        let plan: Vec<String> = explained.iter().map(|r| r.get::<String, _>(0)).collect();
        // A scan of the whole table, or a walk down its primary key in
        // order (`ORDER BY id DESC LIMIT 1` with a filter) which reads it
        // whole when nothing matches.
        let scanned: Vec<&&str> = tables
            .iter()
            .filter(|t| {
                let scan = format!("Seq Scan on {t}");
                let walk = format!("Index Scan Backward using {t}_pkey");
                plan.iter().any(|l| {
                    l.contains(&format!("{scan} ")) || l.ends_with(&scan) || l.contains(&walk)
                })
            })
            .collect();
        assert!(
            scanned.is_empty(),
            "{what} reads {scanned:?} whole:\n{}",
            plan.join("\n")
        );
    }
}

/// A text argument written into SQL for [`assert_read_by_key`].
#[cfg(test)]
pub(crate) fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_in_as_numbers_and_hexadecimal_text() {
        let sql = inline(
            "SELECT $1, $2, '$.path', $10 || $1",
            &[
                Literal::Int(-7),
                Literal::Text("it's'); DROP TABLE x; --"),
                Literal::Int(0),
                Literal::Int(0),
                Literal::Int(0),
                Literal::Int(0),
                Literal::Int(0),
                Literal::Int(0),
                Literal::Int(0),
                Literal::Text("ten"),
            ],
        )
        .expect("inline");
        assert_eq!(
            sql,
            "SELECT CAST(-7 AS BIGINT), CAST($hub$it's'); DROP TABLE x; --$hub$ AS TEXT), \
             '$.path', CAST($hub$ten$hub$ AS TEXT) || CAST(-7 AS BIGINT)"
        );
        // Text the tag could end early goes as hexadecimal.
        for early in ["a $hub$ b", "ends in $hub", "nul \0"] {
            let sql = inline("SELECT $1", &[Literal::Text(early)]).expect("inline");
            assert_eq!(
                sql,
                format!(
                    "SELECT (convert_from(decode('{}', 'hex'), 'UTF8') COLLATE \"default\")",
                    hex::encode(early)
                ),
                "{early:?}"
            );
        }
        // The server ends the string at the tag's first whole occurrence:
        // a `$` or another tag just before the closing one is text.
        for kept in ["ends in $", "$hu", "x$hubby$", "$x$"] {
            let sql = inline("SELECT $1", &[Literal::Text(kept)]).expect("inline");
            assert_eq!(sql, format!("SELECT CAST($hub${kept}$hub$ AS TEXT)"));
        }
        assert!(
            inline("SELECT $2", &[Literal::Int(1)]).is_err(),
            "no second value"
        );
    }

    /// What the server reads back from text written in is the text itself,
    /// dollar-quoted or, where the tag could end it early, in hexadecimal.
    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn text_written_in_reads_back_as_itself_on_postgres() {
        let store = crate::store::required_test_postgres().await;
        let mut conn = store.pool().acquire().await.expect("connection");
        let texts = [
            "plain",
            "",
            "it's'); DROP TABLE x; --",
            "back\\slash \\' and \"quotes\"",
            "ends in $",
            "ends in $hub",
            "a $hub$ b; SELECT 1",
            "$hu",
            "x$hubby$",
            "$x$",
            "$$",
            "line\nbreak\ttab \u{1F600} ünï",
            r#"[{"body":"$hub$","k":"$1"}]"#,
        ];
        for text in texts {
            let sql = inline("SELECT $1", &[Literal::Text(text)]).expect("inline");
            let statements = run_simple(&mut conn, &sql, "reading back")
                .await
                .expect("run");
            let back: String = statements[0][0].try_get(0).expect("text");
            assert_eq!(back, text, "{sql}");
        }
    }

    /// Every payload's cell reaches a TEXT column of `json_to_recordset` as
    /// the payload's own text: objects and arrays as sent, the rest as
    /// their JSON text.
    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn payload_cells_read_back_as_the_payloads_text_on_postgres() {
        let store = crate::store::required_test_postgres().await;
        let mut conn = store.pool().acquire().await.expect("connection");
        let payloads = [
            serde_json::json!({"message": {"type": "text", "text": "a \"quote\", \\ é 😀 \u{0}"}, "n": 2.5}),
            serde_json::json!([1, {"b": null}, "x"]),
            serde_json::json!({"key \u{0}": 1}),
            serde_json::json!({}),
            serde_json::json!("just text"),
            serde_json::json!(42),
            serde_json::json!(null),
            serde_json::json!(true),
        ];
        #[derive(serde::Serialize)]
        struct Row<'a> {
            ord: usize,
            payload: PayloadCell<'a>,
        }
        let rows: Vec<Row> = payloads
            .iter()
            .enumerate()
            .map(|(ord, p)| Row {
                ord,
                payload: PayloadCell::of(p),
            })
            .collect();
        let json = serde_json::to_string(&rows).expect("json");
        let sql = inline(
            "SELECT payload FROM json_to_recordset($1::JSON) AS x(ord BIGINT, payload TEXT) \
             ORDER BY ord",
            &[Literal::Text(&json)],
        )
        .expect("inline");
        let statements = run_simple(&mut conn, &sql, "reading back")
            .await
            .expect("run");
        let back: Vec<String> = statements[0]
            .iter()
            .map(|row| row.try_get(0).expect("text"))
            .collect();
        let sent: Vec<String> = payloads.iter().map(|p| p.to_string()).collect();
        assert_eq!(back, sent);
    }
}
