//! The ACME issuer's records on both stores, the same contract: one lease holder at a time
//! with a fencing token that grows with each new holder, answers that expire, domain
//! states listed a page at a time.

use std::sync::Arc;
use std::time::Duration;

use switchyard_model::{AcmeChallenge, AcmeDomain, AcmeStatus};
use switchyard_store::{acme, AcmeRecord, EmbeddedStore, RedisStore, RedisTimeouts, Store};
use switchyard_test_support::RedisServer;

async fn the_contract_holds(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let ttl = Duration::from_millis(400);
    let first = store
        .acme_lease("a", ttl)
        .await
        .expect("lease")
        .expect("free");
    assert_eq!(
        store.acme_lease("b", ttl).await.expect("lease"),
        None,
        "held by a"
    );
    assert_eq!(
        store.acme_lease("a", ttl).await.expect("lease"),
        Some(first),
        "renewed, same token"
    );
    assert_eq!(
        store.acme_lease_holder().await.expect("holder"),
        Some(("a".to_string(), first))
    );
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    let second = store
        .acme_lease("b", ttl)
        .await
        .expect("lease")
        .expect("expired");
    assert!(
        second > first,
        "a new holder, a new fence: {second} > {first}"
    );
    store.acme_release("a").await.expect("release");
    assert_eq!(
        store
            .acme_lease_holder()
            .await
            .expect("holder")
            .map(|h| h.0),
        Some("b".to_string()),
        "only the holder gives it up"
    );
    store.acme_release("b").await.expect("release");
    assert_eq!(store.acme_lease_holder().await.expect("holder"), None);

    let answer = AcmeChallenge {
        domain: "shop.test".into(),
        key_authorization: "token.thumbprint".into(),
    };
    acme::put_challenge(store, "token", &answer)
        .await
        .expect("put");
    assert_eq!(
        acme::challenge(store, "token").await.expect("get"),
        Some(answer)
    );
    store
        .acme_put(
            AcmeRecord::Challenge("brief"),
            "{}".into(),
            Some(Duration::from_secs(1)),
        )
        .await
        .expect("put");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(
        store
            .acme_get(AcmeRecord::Challenge("brief"))
            .await
            .expect("get"),
        None
    );
    store
        .acme_delete(AcmeRecord::Challenge("token"))
        .await
        .expect("delete");
    assert_eq!(acme::challenge(store, "token").await.expect("get"), None);

    for name in ["c.test", "a.test", "b.test"] {
        acme::put_domain(store, &AcmeDomain::pending(name, 1))
            .await
            .expect("put");
    }
    let mut failed = AcmeDomain::pending("b.test", 1);
    failed.failed("refused".into(), 2);
    acme::put_domain(store, &failed).await.expect("put");
    let (page, next) = acme::domains(store, None, 2).await.expect("page");
    let names: Vec<_> = page.iter().map(|d| d.domain.as_str()).collect();
    assert_eq!(names, ["a.test", "b.test"]);
    assert_eq!(page[1].status, AcmeStatus::Failed);
    let (rest, end) = acme::domains(store, next.as_deref(), 2)
        .await
        .expect("page");
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].domain, "c.test");
    assert_eq!(end, None);
    store
        .acme_delete(AcmeRecord::Domain("b.test"))
        .await
        .expect("delete");
    let (all, _) = acme::domains(store, None, 10).await.expect("page");
    assert_eq!(all.len(), 2, "deleted from the listing too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_store_keeps_acme_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = EmbeddedStore::open(dir.path()).expect("store");
    the_contract_holds(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_store_keeps_acme_records() {
    let redis = RedisServer::start();
    let store = RedisStore::new(&redis.url(), RedisTimeouts::default()).expect("store");
    the_contract_holds(Arc::new(store)).await;
}
