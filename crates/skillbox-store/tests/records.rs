//! The records (agent runs, plain runs, objects' owners, schema versions) on both
//! engines: every case runs on SQLite files and on a real Postgres server.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

#[macro_use]
mod engines;

use std::time::Duration;

use engines::Engine;
use skillbox_env::ErrorCode;
use skillbox_env::testkit::postgres::PostgresServer;
use skillbox_store::{
    KeyRecords, Nodes, ObjectOwners, OwnedObject, RecordsDb, RunRecord, RunRecords, StoreError,
};

on_both_engines!(
    records_round_trip_and_a_restart_closes_what_was_running,
    a_tenants_list_is_newest_first_paged_and_its_own,
    plain_runs_are_paged_per_tenant_and_only_the_newest_are_kept,
    records_of_ended_runs_go_and_running_ones_stay,
    progress_never_undoes_how_a_run_ended,
    a_tenant_sees_only_what_its_runs_made,
    a_database_migrated_past_this_build_is_refused,
    a_silent_node_is_claimed_once_and_a_node_that_speaks_is_not,
    a_kept_key_is_found_by_its_hash_listed_by_its_id_and_revoked,
);

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{body}: {e}"))
}

async fn records_round_trip_and_a_restart_closes_what_was_running(engine: Engine) {
    let records = RunRecords::open(&engine.records, "n1").await.expect("open");
    records
        .insert("a", "t1", "running", r#"{"prompt":"x"}"#)
        .await
        .expect("insert");
    records
        .insert("b", "t2", "running", r#"{"prompt":"y"}"#)
        .await
        .expect("insert");
    records
        .update("b", "succeeded", r#"{"prompt":"y","attempts":[]}"#)
        .await
        .expect("update");
    assert!(
        records.insert("a", "t2", "running", "{}").await.is_err(),
        "ids are unique"
    );
    assert!(records.update("zzz", "failed", "{}").await.is_err());
    let b = records.get("b").await.expect("get").expect("b");
    assert_eq!((b.status.as_str(), b.tenant.as_str()), ("succeeded", "t2"));
    assert_eq!(records.get("nope").await.expect("get"), None);
    drop(records);
    // A restart of the node: the run that was running is closed as failed, with the
    // reason beside what its body held; the finished one is kept as it was.
    let records = RunRecords::open(&engine.reopen().await, "n1")
        .await
        .expect("reopen");
    let a = records.get("a").await.expect("get").expect("a");
    assert_eq!((a.status.as_str(), a.tenant.as_str()), ("failed", "t1"));
    let body = json(&a.body);
    assert_eq!(body["prompt"], "x", "{body}");
    assert!(
        body["reason"]
            .as_str()
            .is_some_and(|r| r.contains("interrupted")),
        "{body}"
    );
    assert_eq!(
        json(&records.get("b").await.expect("get").expect("b").body),
        json(r#"{"prompt":"y","attempts":[]}"#)
    );
}

async fn a_tenants_list_is_newest_first_paged_and_its_own(engine: Engine) {
    let records = RunRecords::open(&engine.records, "n1").await.expect("open");
    // Five of t1's and one of t2's; several share a millisecond, as quick inserts do.
    for id in ["r1", "r2", "r3", "r4", "r5"] {
        records
            .insert(id, "t1", "running", "{}")
            .await
            .expect("insert");
    }
    records
        .insert("other", "t2", "running", "{}")
        .await
        .expect("insert");
    let ids = |page: &[RunRecord]| page.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
    let all = records.list("t1", 100, None).await.expect("list");
    assert_eq!(ids(&all), ["r5", "r4", "r3", "r2", "r1"]);
    let first = records.list("t1", 2, None).await.expect("list");
    assert_eq!(ids(&first), ["r5", "r4"]);
    let second = records.list("t1", 2, first.last()).await.expect("list");
    assert_eq!(ids(&second), ["r3", "r2"]);
    let third = records.list("t1", 2, second.last()).await.expect("list");
    assert_eq!(ids(&third), ["r1"]);
    assert!(
        records
            .list("t1", 2, third.last())
            .await
            .expect("list")
            .is_empty()
    );
    assert_eq!(
        ids(&records.list("t2", 10, None).await.expect("list")),
        ["other"]
    );
    assert!(records.list("t3", 10, None).await.expect("list").is_empty());
}

async fn plain_runs_are_paged_per_tenant_and_only_the_newest_are_kept(engine: Engine) {
    let records = RunRecords::open(&engine.records, "n1").await.expect("open");
    for id in ["p1", "p2", "p3", "p4"] {
        records
            .insert_plain(id, "t1", "{}", 3)
            .await
            .expect("insert");
    }
    records
        .insert_plain("q1", "t2", "{}", 3)
        .await
        .expect("insert");
    let ids = |page: &[skillbox_store::PlainRunRecord]| {
        page.iter().map(|r| r.id.clone()).collect::<Vec<_>>()
    };
    // The oldest of t1 went past the bound of 3; t2's own is untouched.
    assert_eq!(records.get_plain("p1").await.expect("get"), None);
    let first = records.list_plain("t1", 2, None).await.expect("list");
    assert_eq!(ids(&first), ["p4", "p3"]);
    let second = records
        .list_plain("t1", 2, first.last())
        .await
        .expect("list");
    assert_eq!(ids(&second), ["p2"]);
    assert_eq!(
        ids(&records.list_plain("t2", 9, None).await.expect("list")),
        ["q1"]
    );
    assert_eq!(
        records
            .get_plain("q1")
            .await
            .expect("get")
            .expect("q1")
            .tenant,
        "t2"
    );
    // Retention takes them by age, as it takes ended agent runs.
    let day = Duration::from_secs(24 * 3600);
    assert_eq!(records.prune(day).await.expect("prune"), 0);
    engine.exec(
        "agent-runs.sqlite",
        "UPDATE plain_runs SET created_ms = 1 WHERE tenant = 't1'",
    );
    assert_eq!(records.prune(day).await.expect("prune"), 3);
    assert!(
        records
            .list_plain("t1", 9, None)
            .await
            .expect("list")
            .is_empty()
    );
    assert_eq!(
        records.list_plain("t2", 9, None).await.expect("list").len(),
        1
    );
}

async fn records_of_ended_runs_go_and_running_ones_stay(engine: Engine) {
    let records = RunRecords::open(&engine.records, "n1").await.expect("open");
    records
        .insert("ended", "t", "running", "{}")
        .await
        .expect("insert");
    records
        .update("ended", "succeeded", "{}")
        .await
        .expect("update");
    records
        .insert("running", "t", "running", "{}")
        .await
        .expect("insert");
    let day = Duration::from_secs(24 * 3600);
    assert_eq!(
        records.prune(day).await.expect("prune"),
        0,
        "nothing is a day old"
    );
    engine.exec(
        "agent-runs.sqlite",
        "UPDATE agent_runs SET updated_ms = 1, created_ms = 1",
    );
    assert_eq!(records.prune(day).await.expect("prune"), 1);
    assert_eq!(records.get("ended").await.expect("get"), None);
    assert!(records.get("running").await.expect("get").is_some());
}

async fn progress_never_undoes_how_a_run_ended(engine: Engine) {
    let records = RunRecords::open(&engine.records, "n1").await.expect("open");
    records
        .insert("r", "t", "running", r#"{"attempts":[]}"#)
        .await
        .expect("insert");
    records
        .update_running("r", r#"{"attempts":[1]}"#)
        .await
        .expect("progress");
    assert_eq!(
        records.get("r").await.expect("get").expect("r").body,
        r#"{"attempts":[1]}"#
    );
    records
        .update("r", "succeeded", r#"{"attempts":[1,2],"answer":"done"}"#)
        .await
        .expect("end");
    // A progress write that lands after the end changes nothing.
    records
        .update_running("r", r#"{"attempts":[1]}"#)
        .await
        .expect("late progress");
    let r = records.get("r").await.expect("get").expect("r");
    assert_eq!(r.status, "succeeded");
    assert_eq!(r.body, r#"{"attempts":[1,2],"answer":"done"}"#);
}

async fn a_tenant_sees_only_what_its_runs_made(engine: Engine) {
    let owners = ObjectOwners::open(&engine.records).expect("open");
    owners
        .grant("a", "abc", 3, "text/plain")
        .await
        .expect("grant");
    assert_eq!(
        owners.get("a", "abc").await.expect("get"),
        Some(OwnedObject {
            size: 3,
            content_type: "text/plain".into()
        })
    );
    assert_eq!(owners.get("b", "abc").await.expect("get"), None);
    // The same bytes made by b: b owns them too, with its own type; a's stays.
    owners
        .grant("b", "abc", 3, "application/json")
        .await
        .expect("grant");
    owners
        .grant("a", "abc", 3, "image/png")
        .await
        .expect("grant again");
    assert_eq!(
        owners
            .get("b", "abc")
            .await
            .expect("get")
            .map(|o| o.content_type),
        Some("application/json".into())
    );
    assert_eq!(
        owners
            .get("a", "abc")
            .await
            .expect("get")
            .map(|o| o.content_type),
        Some("text/plain".into())
    );
    // Retention removed the object: nobody owns it any more.
    owners
        .grant("a", "def", 1, "text/plain")
        .await
        .expect("grant");
    owners.forget(&["abc".to_string()]).await.expect("forget");
    assert_eq!(owners.get("a", "abc").await.expect("get"), None);
    assert_eq!(owners.get("b", "abc").await.expect("get"), None);
    assert!(owners.get("a", "def").await.expect("get").is_some());
}

async fn a_database_migrated_past_this_build_is_refused(engine: Engine) {
    // Open once, so the runs' tables exist at this build's version.
    drop(RunRecords::open(&engine.records, "n1").await.expect("open"));
    engine.exec(
        "agent-runs.sqlite",
        "UPDATE skillbox_schema SET version = 99 WHERE component = 'runs'",
    );
    let error = match engine.reopen_result().await {
        Err(e) => e,
        Ok(at) => RunRecords::open(&at, "n1")
            .await
            .expect_err("a newer schema must be refused"),
    };
    let text = error.to_string();
    assert!(
        text.contains("schema version 99") && text.contains("newer skillbox"),
        "{text}"
    );
}

async fn a_silent_node_is_claimed_once_and_a_node_that_speaks_is_not(engine: Engine) {
    let nodes = Nodes::open(&engine.records).expect("open");
    for name in ["a", "b", "c"] {
        nodes
            .beat(name, &format!("http://{name}:8080"), true)
            .await
            .expect("beat");
    }
    let minute = Duration::from_secs(60);
    assert!(nodes.silent("a", minute).await.expect("silent").is_empty());
    // b and c were last seen long ago; c speaks again before anyone claims it.
    engine.exec(
        "nodes.sqlite",
        "UPDATE nodes SET seen_ms = 1 WHERE name IN ('b', 'c')",
    );
    let silent = nodes.silent("a", minute).await.expect("silent");
    let names: Vec<&str> = silent.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["b", "c"], "never the asking node itself");
    assert!(
        nodes
            .silent("b", minute)
            .await
            .expect("silent")
            .iter()
            .all(|n| n.name != "b")
    );
    nodes
        .beat("c", "http://c:9090", false)
        .await
        .expect("c speaks");
    assert_eq!(
        nodes.address("c").await.expect("address").as_deref(),
        Some("http://c:9090")
    );
    assert!(nodes.claim_dead(&silent[0]).await.expect("claim b"));
    assert!(
        !nodes.claim_dead(&silent[0]).await.expect("claim b again"),
        "one node closes a dead node's runs"
    );
    assert!(
        !nodes.claim_dead(&silent[1]).await.expect("claim c"),
        "a node that spoke since is not dead"
    );
    assert_eq!(nodes.address("b").await.expect("address"), None);
    nodes.leave("a").await.expect("leave");
    let left = nodes.silent("x", Duration::ZERO).await.expect("silent");
    assert_eq!(
        left.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        ["c"]
    );
}

async fn a_kept_key_is_found_by_its_hash_listed_by_its_id_and_revoked(engine: Engine) {
    let keys = KeyRecords::open(&engine.records).expect("open");
    let acme = "a".repeat(64);
    let globex = format!("{}{}", "a".repeat(15), "b".repeat(49));
    assert_eq!(keys.add("acme", &acme).await.expect("add"), "a".repeat(16));
    let globex_id = keys.add("globex", &globex).await.expect("add");
    assert_eq!(globex_id, format!("{}b", "a".repeat(15)));
    // Another node (a restart) finds both.
    let again = KeyRecords::open(&engine.reopen().await).expect("reopen");
    assert_eq!(
        again.tenant_of(&acme).await.expect("look up").as_deref(),
        Some("acme")
    );
    assert_eq!(
        again.tenant_of(&globex).await.expect("look up").as_deref(),
        Some("globex")
    );
    assert_eq!(
        again.tenant_of(&"c".repeat(64)).await.expect("look up"),
        None
    );
    let listed = again.list().await.expect("list");
    assert_eq!(
        listed
            .iter()
            .map(|k| (k.id.as_str(), k.tenant.as_str()))
            .collect::<Vec<_>>(),
        [("aaaaaaaaaaaaaaaa", "acme"), (globex_id.as_str(), "globex")]
    );
    // Not a hash, not an id: refused with what a key and an id are, nothing kept or gone.
    let e = keys
        .add("acme", "sha256:abc")
        .await
        .expect_err("not a hash");
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    for id in ["aaaa", "%", &format!("{}%", "a".repeat(15))] {
        let e = keys.revoke(id).await.expect_err(id);
        assert!(e.to_string().contains("16 hex digits"), "{e}");
    }
    assert_eq!(keys.list().await.expect("list").len(), 2);
    // Revoked by id, exactly that one: every node refuses it from then on.
    assert!(
        keys.revoke(&globex_id.to_uppercase())
            .await
            .expect("revoke")
    );
    assert!(!keys.revoke(&globex_id).await.expect("revoke again"));
    assert_eq!(again.tenant_of(&globex).await.expect("look up"), None);
    assert_eq!(
        again.tenant_of(&acme).await.expect("look up").as_deref(),
        Some("acme")
    );
}

/// Postgres only: nodes share the database, and each closes only its own runs.
#[tokio::test]
async fn a_node_that_starts_closes_its_own_runs_not_another_nodes() {
    let Some(engine) = Engine::postgres("a_node_that_starts_closes_its_own_runs").await else {
        return;
    };
    let one = RunRecords::open(&engine.records, "one")
        .await
        .expect("open");
    let two = RunRecords::open(&engine.reopen().await, "two")
        .await
        .expect("open");
    one.insert("of-one", "t", "running", "{}")
        .await
        .expect("insert");
    two.insert("of-two", "t", "running", "{}")
        .await
        .expect("insert");
    // Node one restarts: its run is closed; two's, still running there, is not.
    let one = RunRecords::open(&engine.reopen().await, "one")
        .await
        .expect("restart");
    let status = |r: Option<RunRecord>| r.expect("record").status;
    assert_eq!(status(one.get("of-one").await.expect("get")), "failed");
    assert_eq!(status(one.get("of-two").await.expect("get")), "running");
    // Two is found dead: what it ran is closed, with the reason given.
    assert_eq!(
        one.close_running("two", "node two stopped answering")
            .await
            .expect("close"),
        1
    );
    let of_two = one.get("of-two").await.expect("get").expect("of-two");
    assert_eq!(of_two.status, "failed");
    assert_eq!(json(&of_two.body)["reason"], "node two stopped answering");
    // Every node reads every record (the other node's too).
    assert_eq!(
        two.get("of-one").await.expect("get").map(|r| r.tenant),
        Some("t".into())
    );
}

/// A file from before tenants (and before versioned migrations) is brought up to date:
/// its records belong to the local tenant.
#[tokio::test]
async fn a_sqlite_file_from_before_tenants_is_migrated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = rusqlite::Connection::open(dir.path().join("agent-runs.sqlite")).expect("open");
    old.execute_batch(
        "CREATE TABLE agent_runs (id TEXT PRIMARY KEY, status TEXT NOT NULL,
             created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL, body TEXT NOT NULL);
         INSERT INTO agent_runs VALUES ('old', 'succeeded', 1, 1, '{}');",
    )
    .expect("old schema");
    drop(old);
    let records = RunRecords::open(&RecordsDb::sqlite(dir.path()), "n")
        .await
        .expect("open");
    assert_eq!(
        records.get("old").await.expect("get").expect("old").tenant,
        skillbox_store::LOCAL_TENANT
    );
    records
        .insert("new", "t", "running", "{}")
        .await
        .expect("insert");
    assert_eq!(
        records.get("new").await.expect("get").expect("new").tenant,
        "t"
    );
}

#[tokio::test]
async fn a_database_url_that_cannot_be_served_is_refused_with_its_reason() {
    let refused = |e: StoreError| (e.code(), e.to_string());
    // A CA file that is not there, or not PEM, is named; so is a CA with TLS not
    // asked for (it would be read for nothing).
    let dir = tempfile::tempdir().expect("tempdir");
    let not_pem = dir.path().join("not-a-ca.pem");
    std::fs::write(&not_pem, "hello").expect("write");
    for (query, names) in [
        (
            "sslmode=require&sslrootcert=/nonexistent/ca.pem",
            "/nonexistent/ca.pem",
        ),
        (
            &format!("sslmode=verify-full&sslrootcert={}", not_pem.display()),
            &not_pem.display().to_string(),
        ),
        (
            &format!("sslrootcert={}", not_pem.display()),
            "sslmode=require",
        ),
    ] {
        let (code, text) = refused(
            RecordsDb::postgres(&format!("postgres://u:hunter2@127.0.0.1:1/db?{query}"))
                .await
                .expect_err(query),
        );
        assert_eq!(code, ErrorCode::Invalid, "{query}: {text}");
        assert!(
            text.contains("sslrootcert") && text.contains(names) && !text.contains("hunter2"),
            "{query}: {text}"
        );
    }
    let (code, text) = refused(
        RecordsDb::postgres("postgres://u@127.0.0.1:99999/db")
            .await
            .expect_err("bad port"),
    );
    assert_eq!(code, ErrorCode::Invalid, "{text}");
    // Nothing listens on port 1: unavailable, naming where, never the password.
    let (code, text) = refused(
        RecordsDb::postgres("postgres://u:hunter2@127.0.0.1:1/db")
            .await
            .expect_err("nothing there"),
    );
    assert_eq!(code, ErrorCode::Unavailable, "{text}");
    assert!(
        text.contains("postgres://u@127.0.0.1:1/db") && !text.contains("hunter2"),
        "{text}"
    );
}

/// The `application_name` the TLS tests connect with, to find their connections.
const TLS_APP: &str = "skillbox-tls-test";

/// Whether each connection the server holds from `app` is over TLS (`t` or `f`, one
/// a line).
fn tls_of_connections(server: &PostgresServer, app: &str) -> String {
    server.psql(&format!(
        "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.application_name = '{app}'"
    ))
}

/// `sslmode=require` with the server's CA named: records go over TLS, the server's
/// certificate and name verified, and the server sees nothing of skillbox's in plain
/// text; `verify-full` (libpq's) is the same. `prefer` stays plain text.
#[tokio::test]
async fn records_go_to_postgres_over_tls_verified_against_the_named_ca() {
    let test = "records_go_to_postgres_over_tls_verified_against_the_named_ca";
    let Some(server) = PostgresServer::start_with_tls(test) else {
        return;
    };
    let ca = server
        .ca_file()
        .expect("the server's CA")
        .display()
        .to_string();
    for (url, mode) in [
        (server.url(), "require"),
        (
            server.url().replace("127.0.0.1", "localhost"),
            "verify-full",
        ),
    ] {
        let url = format!("{url}?sslmode={mode}&sslrootcert={ca}&application_name={TLS_APP}");
        let db = RecordsDb::postgres(&url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let records = RunRecords::open(&db, "n1").await.expect("open");
        records
            .insert(mode, "t1", "running", "{}")
            .await
            .expect("insert");
        let read = records.get(mode).await.expect("get").expect("the record");
        assert_eq!(
            (read.status.as_str(), read.tenant.as_str()),
            ("running", "t1")
        );
        let seen = tls_of_connections(&server, TLS_APP);
        assert!(
            !seen.is_empty() && seen.lines().all(|ssl| ssl == "t"),
            "{url}: {seen:?}"
        );
    }
    let plain = format!(
        "{}?sslmode=prefer&application_name={TLS_APP}-plain",
        server.url()
    );
    let _db = RecordsDb::postgres(&plain).await.expect("plain");
    let seen = tls_of_connections(&server, &format!("{TLS_APP}-plain"));
    assert!(
        !seen.is_empty() && seen.lines().all(|ssl| ssl == "f"),
        "{plain}: {seen:?}"
    );
}

/// A certificate nobody vouched for, or for another name, is refused: TLS is never
/// used unverified, and nothing connects.
#[tokio::test]
async fn a_postgres_certificate_that_cannot_be_verified_is_refused() {
    let test = "a_postgres_certificate_that_cannot_be_verified_is_refused";
    let Some(server) = PostgresServer::start_with_tls(test) else {
        return;
    };
    let ca = server
        .ca_file()
        .expect("the server's CA")
        .display()
        .to_string();
    let port = server.port();
    for (url, why) in [
        // The CA not named: an issuer nobody trusts.
        (
            format!(
                "{}?sslmode=require&application_name={TLS_APP}",
                server.url()
            ),
            "UnknownIssuer",
        ),
        // The CA named, another host's name asked for at the server's address.
        (
            format!(
                "postgres://skillbox:hunter2@db.example:{port}/postgres?hostaddr=127.0.0.1\
                 &sslmode=require&sslrootcert={ca}&application_name={TLS_APP}"
            ),
            "db.example",
        ),
    ] {
        let e = RecordsDb::postgres(&url).await.expect_err(&url);
        let text = e.to_string();
        assert_eq!(e.code(), ErrorCode::Unavailable, "{text}");
        assert!(
            text.contains("invalid peer certificate")
                && text.contains(why)
                && text.contains("sslrootcert")
                && !text.contains("hunter2"),
            "{text}"
        );
    }
    assert_eq!(
        tls_of_connections(&server, TLS_APP),
        "",
        "nothing connected"
    );
}

/// `sslmode=require` at a server without TLS is refused, never served in plain text.
#[tokio::test]
async fn tls_asked_of_a_postgres_without_it_is_refused() {
    let Some(server) = PostgresServer::start("tls_asked_of_a_postgres_without_it_is_refused")
    else {
        return;
    };
    let url = format!(
        "{}?sslmode=require&application_name={TLS_APP}",
        server.url()
    );
    let e = RecordsDb::postgres(&url).await.expect_err("no TLS there");
    let text = e.to_string();
    assert_eq!(e.code(), ErrorCode::Unavailable, "{text}");
    assert!(text.contains("server does not support TLS"), "{text}");
    assert_eq!(
        tls_of_connections(&server, TLS_APP),
        "",
        "nothing connected"
    );
}
