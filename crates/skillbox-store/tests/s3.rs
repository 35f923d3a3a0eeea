//! The artifact store on S3 (`s3://bucket/prefix`), against a real S3 server: moto's,
//! on 127.0.0.1 (scripts/test.sh installs it; without it these tests skip, and fail
//! under SKILLBOX_REQUIRE_ALL=1). What the store wrote is looked at with the server's own
//! plain requests, not through the store.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::path::Path;

use bytes::Bytes;
use futures_util::StreamExt;
use skillbox_env::ErrorCode;
use skillbox_env::testkit::s3::MotoServer;
use skillbox_store::{ArtifactStore, RecordsDb, StoreError, sha256_hex};

fn moto(test: &str) -> Option<MotoServer> {
    MotoServer::start(test, Path::new(env!("CARGO_TARGET_TMPDIR")))
}

async fn open(moto: &MotoServer, url: &str) -> Result<ArtifactStore, StoreError> {
    let vars = moto
        .aws_env()
        .into_iter()
        .map(|(key, value)| (key.to_string(), value));
    ArtifactStore::from_url_with(url, vars).await
}

fn key(prefix: &str, sha256: &str) -> String {
    format!("{prefix}/objects/{}/{sha256}", &sha256[..2])
}

#[tokio::test]
async fn objects_land_in_the_bucket_under_the_prefix_and_come_back_checked() {
    let Some(moto) = moto("objects_land_in_the_bucket_under_the_prefix_and_come_back_checked")
    else {
        return;
    };
    moto.create_bucket("artifacts");
    let store = open(&moto, "s3://artifacts/team-a/runs").await.unwrap();
    let bytes = Bytes::from_static(b"a deck, say");
    let sha256 = store.put_once(bytes.clone()).await.unwrap();
    assert_eq!(sha256, sha256_hex(&bytes));
    assert_eq!(
        moto.keys("artifacts", ""),
        vec![key("team-a/runs", &sha256)],
        "one object, under the prefix, named by its sha256"
    );
    assert_eq!(
        moto.get("artifacts", &key("team-a/runs", &sha256)).unwrap(),
        bytes.to_vec()
    );
    // A second put of the same bytes is no put.
    assert_eq!(store.put_once(bytes.clone()).await.unwrap(), sha256);
    assert_eq!(moto.keys("artifacts", "").len(), 1);

    assert_eq!(store.get(&sha256).await.unwrap(), bytes);
    assert_eq!(store.head(&sha256).await.unwrap(), Some(bytes.len() as u64));
    let mut range = store.get_range(&sha256, 2..6).await.unwrap();
    let mut part = Vec::new();
    while let Some(chunk) = range.stream.next().await {
        part.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(part, b"deck");
    let absent = sha256_hex(b"never stored");
    assert_eq!(store.head(&absent).await.unwrap(), None);
    assert_eq!(
        store.get(&absent).await.unwrap_err().code(),
        ErrorCode::NotFound
    );
}

#[tokio::test]
async fn a_put_never_replaces_what_the_bucket_holds() {
    let Some(moto) = moto("a_put_never_replaces_what_the_bucket_holds") else {
        return;
    };
    moto.create_bucket("artifacts");
    let store = open(&moto, "s3://artifacts/p").await.unwrap();
    // Someone with the bucket's keys planted other bytes under the key of `real`.
    let real = Bytes::from_static(b"what the run made");
    let sha256 = sha256_hex(&real);
    moto.put(
        "artifacts",
        &key("p", &sha256),
        b"planted, and longer than the real bytes",
    );

    // The put is conditional (If-None-Match: *): the planted object stays, and the
    // store says the key holds something else.
    let err = store.put_once(real.clone()).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert_eq!(
        moto.get("artifacts", &key("p", &sha256)).unwrap(),
        b"planted, and longer than the real bytes".to_vec(),
        "nothing was overwritten"
    );
    // Reads check the hash: the planted bytes are never handed out as `real`.
    let err = store.get(&sha256).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    let mut stream = store.get_stream(&sha256).await.unwrap().stream;
    let mut last = None;
    while let Some(item) = stream.next().await {
        last = Some(item);
    }
    assert!(
        matches!(last, Some(Err(StoreError::Corrupt { .. }))),
        "a streamed read ends in an error, not a clean end: {last:?}"
    );
}

#[tokio::test]
async fn a_download_streams_in_chunks_and_is_checked_whole() {
    let Some(moto) = moto("a_download_streams_in_chunks_and_is_checked_whole") else {
        return;
    };
    moto.create_bucket("artifacts");
    let store = open(&moto, "s3://artifacts/big").await.unwrap();
    let bytes: Bytes = (0..24 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect::<Vec<u8>>()
        .into();
    let sha256 = store.put_once(bytes.clone()).await.unwrap();
    let download = store.get_stream(&sha256).await.unwrap();
    assert_eq!(download.size, bytes.len() as u64);
    let mut stream = download.stream;
    let (mut chunks, mut got) = (0, Vec::with_capacity(bytes.len()));
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        chunks += 1;
        got.extend_from_slice(&chunk);
    }
    assert!(
        chunks > 1,
        "24 MiB came in {chunks} chunk(s): buffered whole"
    );
    assert!(got == bytes, "the streamed bytes are the stored bytes");
}

#[tokio::test]
async fn a_budget_counts_what_the_bucket_holds_and_refuses_past_it() {
    let Some(moto) = moto("a_budget_counts_what_the_bucket_holds_and_refuses_past_it") else {
        return;
    };
    moto.create_bucket("artifacts");
    let url = "s3://artifacts/shared";
    let first = open(&moto, url).await.unwrap();
    let old = Bytes::from(vec![7u8; 1000]);
    first.put_once(old.clone()).await.unwrap();

    // Another node opens the same bucket with a budget: the 1000 bytes there count.
    let second = open(&moto, url)
        .await
        .unwrap()
        .with_budget(1500)
        .await
        .unwrap();
    let err = second
        .put_once(Bytes::from(vec![8u8; 600]))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::QuotaExceeded {
                used: 1000,
                budget: 1500,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.code(), ErrorCode::QuotaExceeded);
    assert_eq!(
        moto.keys("artifacts", "shared/").len(),
        1,
        "nothing written"
    );
    // Bytes already in the bucket cost nothing.
    second.put_once(old).await.unwrap();
    second.put_once(Bytes::from(vec![9u8; 500])).await.unwrap();
    assert_eq!(moto.keys("artifacts", "shared/").len(), 2);
}

/// Servers on one bucket and one Postgres database count one budget for it, whichever
/// of them puts; a store under another prefix has a count of its own.
#[tokio::test]
async fn servers_on_one_bucket_and_database_count_one_budget() {
    let test = "servers_on_one_bucket_and_database_count_one_budget";
    let Some(moto) = moto(test) else { return };
    let Some(postgres) = skillbox_env::testkit::postgres::PostgresServer::start(test) else {
        return;
    };
    moto.create_bucket("artifacts");
    let node = |url: &'static str| {
        let (moto, postgres) = (&moto, &postgres);
        async move {
            let records = RecordsDb::postgres(&postgres.url()).await.unwrap();
            open(moto, url)
                .await
                .unwrap()
                .with_budget_in(1000, &records)
                .await
                .unwrap()
        }
    };
    let a = node("s3://artifacts/shared").await;
    let b = node("s3://artifacts/shared").await;
    a.put_once(Bytes::from(vec![1u8; 600])).await.unwrap();
    let err = b.put_once(Bytes::from(vec![2u8; 600])).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::QuotaExceeded {
                used: 600,
                budget: 1000,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        moto.keys("artifacts", "shared/").len(),
        1,
        "nothing written"
    );
    let other = node("s3://artifacts/other").await;
    other
        .put_once(Bytes::from(vec![2u8; 600]))
        .await
        .expect("another prefix, another count");
}

#[tokio::test]
async fn retention_lists_the_bucket_and_spares_what_is_in_its_grace_time() {
    let Some(moto) = moto("retention_lists_the_bucket_and_spares_what_is_in_its_grace_time") else {
        return;
    };
    moto.create_bucket("artifacts");
    let store = open(&moto, "s3://artifacts/r").await.unwrap();
    let sha256 = store.put_once(Bytes::from(vec![1u8; 300])).await.unwrap();
    // A store that did not put it (another node) judges by the bucket's times alone.
    let other = open(&moto, "s3://artifacts/r").await.unwrap();
    let pruned = other
        .prune(skillbox_store::Retention {
            max_bytes: Some(0),
            max_age: Some(std::time::Duration::ZERO),
        })
        .await
        .unwrap();
    assert!(pruned.removed.is_empty(), "{pruned:?}");
    assert_eq!((pruned.kept, pruned.kept_bytes), (1, 300));
    assert!(moto.get("artifacts", &key("r", &sha256)).is_some());
}

#[tokio::test]
async fn a_bucket_that_is_not_there_is_refused_when_the_store_opens() {
    let Some(moto) = moto("a_bucket_that_is_not_there_is_refused_when_the_store_opens") else {
        return;
    };
    let err = open(&moto, "s3://no-such-bucket/x").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable);
    let text = err.to_string();
    assert!(
        text.contains("s3://no-such-bucket/x") && text.contains("AWS_ENDPOINT_URL"),
        "{text}"
    );
}

#[tokio::test]
async fn a_store_that_does_not_answer_is_refused_not_waited_for() {
    let test = "a_store_that_does_not_answer_is_refused_not_waited_for";
    // Needs no S3 server, but the same skip rule as the others keeps it beside them.
    let Some(moto) = moto(test) else { return };
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let vars = moto.aws_env().into_iter().map(|(key, value)| {
        let value = if key == "AWS_ENDPOINT_URL" {
            format!("http://127.0.0.1:{closed}")
        } else {
            value
        };
        (key.to_string(), value)
    });
    // Only a hang guard: a refused connection fails within seconds with object_store's
    // default retries too (what bounds a store that never answers is the RetryConfig in
    // `ArtifactStore::s3`, which no test times).
    let opened = tokio::time::timeout(
        std::time::Duration::from_secs(100),
        ArtifactStore::from_url_with("s3://artifacts/x", vars),
    )
    .await
    .expect("the store's open gave up within its bounded retries");
    let err = opened.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert!(err.to_string().contains("s3://artifacts/x"), "{err}");
}
