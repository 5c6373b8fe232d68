//! The change events on `switchyard:changes` as another router reads them: each write's
//! event, made by its Lua script on a real `redis-server`, decodes to the change it made with
//! the revision it made, empty domain lists included, and purges travel without one.

use std::time::Duration;

use serde_json::{json, Value};
use switchyard_model::{parse_app_spec, parse_certificate_spec, Change};
use switchyard_store::{RedisStore, RedisTimeouts, Store, CHANGES_CHANNEL};
use switchyard_test_support::pki::Ca;
use switchyard_test_support::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_publishes_its_change_and_revision_as_json() {
    let redis = RedisServer::start();
    let mut listener = redis.connection().expect("redis connection");
    listener
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let mut events = listener.as_pubsub();
    events.subscribe(CHANGES_CHANNEL).expect("subscribe");
    let mut next_event = move || -> Value {
        let payload: String = events
            .get_message()
            .expect("an event within 5 s")
            .get_payload()
            .expect("text");
        serde_json::from_str(&payload).unwrap_or_else(|e| panic!("{payload}: {e}"))
    };

    let store = RedisStore::new(&redis.url(), RedisTimeouts::default()).expect("store");
    let app = |domains: Value| {
        parse_app_spec(
            "shop",
            &json!({"domains": domains, "backends": ["127.0.0.1:9001"]}),
        )
        .expect("valid app")
    };
    store
        .put_app(app(json!(["shop.test", "www.shop.test"])))
        .await
        .expect("put");
    assert_eq!(
        next_event(),
        json!({"kind": "app", "name": "shop", "domains": ["shop.test", "www.shop.test"], "rev": 1})
    );
    // The domain it loses is named too, so routers drop its route.
    store.put_app(app(json!(["shop.test"]))).await.expect("put");
    assert_eq!(
        next_event(),
        json!({"kind": "app", "name": "shop", "domains": ["shop.test", "www.shop.test"], "rev": 2})
    );
    store.put_app(app(json!([]))).await.expect("put");
    assert_eq!(
        next_event(),
        json!({"kind": "app", "name": "shop", "domains": ["shop.test"], "rev": 3})
    );
    store.put_app(app(json!([]))).await.expect("put");
    assert_eq!(
        next_event(),
        json!({"kind": "app", "name": "shop", "rev": 4}),
        "no domains before or after: left out, never an empty object"
    );
    assert!(store.delete_app("shop").await.expect("delete"));
    assert_eq!(
        next_event(),
        json!({"kind": "app", "name": "shop", "rev": 5})
    );

    let issued = Ca::root("events test CA").issue(&["shop.test"], -1, 30);
    let cert = parse_certificate_spec(
        "shop.test",
        &json!({"cert_pem": issued.cert_pem, "key_pem": issued.key_pem}),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs() as i64,
    )
    .expect("valid certificate");
    store.put_cert(cert).await.expect("put cert");
    assert_eq!(
        next_event(),
        json!({"kind": "cert", "domain": "shop.test", "rev": 6})
    );
    assert!(store.delete_cert("shop.test").await.expect("delete cert"));
    assert_eq!(
        next_event(),
        json!({"kind": "cert", "domain": "shop.test", "rev": 7})
    );

    store
        .purge_cache("shop", "/news", true)
        .await
        .expect("purge");
    assert_eq!(
        next_event(),
        json!({"kind": "cache_purge", "app": "shop", "path": "/news", "prefix": true}),
        "nothing stored, so no revision"
    );

    store
        .tell_every_router(Change::WafReload {
            reload: u64::MAX - 1,
        })
        .await
        .expect("announce a reload");
    assert_eq!(
        next_event(),
        json!({"kind": "waf_reload", "reload": u64::MAX - 1}),
        "a reload's id travels whole, past the doubles' 53 bits"
    );
}
