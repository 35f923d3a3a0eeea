//! Retention over a real local store: objects past an age or a byte budget go, oldest
//! first; an object in its grace time (just put, or put again) never goes; records of
//! ended agent runs go, running ones stay.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::path::Path;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use skillbox_store::{ArtifactStore, Retention};

const DAY: Duration = Duration::from_secs(24 * 3600);

/// Sets an object's file time `ago` in the past, as if it were put then.
fn age(dir: &Path, sha256: &str, ago: Duration) {
    let file = std::fs::File::options()
        .write(true)
        .open(dir.join("objects").join(&sha256[..2]).join(sha256))
        .unwrap();
    file.set_modified(SystemTime::now() - ago).unwrap();
}

async fn put(dir: &Path, content: &str, ago: Duration) -> String {
    let store = ArtifactStore::local(dir).await.unwrap();
    let sha = store
        .put_once(Bytes::from(content.to_string()))
        .await
        .unwrap();
    age(dir, &sha, ago);
    sha
}

#[tokio::test]
async fn old_objects_go_oldest_first_and_fresh_ones_stay() {
    let dir = tempfile::tempdir().unwrap();
    let oldest = put(dir.path(), &"a".repeat(1000), 30 * DAY).await;
    let old = put(dir.path(), &"b".repeat(1000), 20 * DAY).await;
    let recent = put(dir.path(), &"c".repeat(1000), DAY).await;
    let fresh = put(dir.path(), &"d".repeat(5000), Duration::ZERO).await;
    // Another process's view: nothing of these was put by it.
    let store = ArtifactStore::local(dir.path()).await.unwrap();
    let by_age = Retention {
        max_bytes: None,
        max_age: Some(7 * DAY),
    };
    let pruned = store.prune(by_age).await.unwrap();
    assert_eq!(pruned.removed, [oldest.as_str(), old.as_str()]);
    assert_eq!(pruned.removed_bytes, 2000);
    for gone in [&oldest, &old] {
        assert_eq!(store.head(gone).await.unwrap(), None);
    }
    // A budget: the oldest left goes; the fresh one stays although the store is still
    // over it (a live run may be about to hand it out).
    let budget = Retention {
        max_bytes: Some(1000),
        max_age: None,
    };
    let pruned = store.prune(budget).await.unwrap();
    assert_eq!(pruned.removed, [recent]);
    assert_eq!(store.head(&fresh).await.unwrap(), Some(5000));
    assert_eq!(pruned.kept_bytes, 5000);
}

#[tokio::test]
async fn an_object_put_again_is_in_its_grace_time_whatever_its_file_says() {
    let dir = tempfile::tempdir().unwrap();
    let sha = put(dir.path(), "made long ago", 30 * DAY).await;
    // A run in this process makes the same bytes again: the put is a no-op that leaves
    // the file's time as it was, and the object must stay for the run to hand it out.
    let store = ArtifactStore::local(dir.path()).await.unwrap();
    assert_eq!(
        store.put_once(Bytes::from("made long ago")).await.unwrap(),
        sha
    );
    let pruned = store
        .prune(Retention {
            max_bytes: Some(0),
            max_age: Some(DAY),
        })
        .await
        .unwrap();
    assert!(pruned.removed.is_empty(), "{pruned:?}");
    assert!(store.head(&sha).await.unwrap().is_some());
}

/// A store shared by several processes (servers on one bucket, a CLI run on a server's
/// data dir): one that finds an old object already stored makes it look just put, so
/// another's retention does not remove what a run has just stored.
#[tokio::test]
async fn an_old_object_put_again_by_another_process_is_kept_by_a_third() {
    let dir = tempfile::tempdir().unwrap();
    let content = "the same deck, made again".repeat(40);
    let sha = put(dir.path(), &content, 10 * DAY).await;
    let young = put(dir.path(), "put a minute ago", Duration::from_secs(60)).await;
    // A second process puts the same bytes: a dedup hit on an object 10 days old.
    let second = ArtifactStore::local(dir.path()).await.unwrap();
    assert_eq!(
        second.put_once(Bytes::from(content.clone())).await.unwrap(),
        sha
    );
    // A dedup hit on a young object leaves it as it was.
    let before = std::fs::metadata(dir.path().join("objects").join(&young[..2]).join(&young))
        .unwrap()
        .modified()
        .unwrap();
    second
        .put_once(Bytes::from_static(b"put a minute ago"))
        .await
        .unwrap();
    let after = std::fs::metadata(dir.path().join("objects").join(&young[..2]).join(&young))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(
        before, after,
        "an object younger than REFRESH_AFTER is not written again"
    );
    // A third process, which put nothing, prunes past a day: the refreshed object stays.
    let third = ArtifactStore::local(dir.path()).await.unwrap();
    let pruned = third
        .prune(Retention {
            max_bytes: None,
            max_age: Some(DAY),
        })
        .await
        .unwrap();
    assert!(pruned.removed.is_empty(), "{pruned:?}");
    assert_eq!(
        third.get(&sha).await.unwrap(),
        Bytes::from(content),
        "the object is whole after it was written again"
    );
}
