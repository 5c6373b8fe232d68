//! How every crate of Switchyard declares its Prometheus metrics: each crate's `metrics.rs`
//! lists its metrics once, in one [`declare_metrics!`], which makes them lazily registered
//! statics in the default registry and a `register_all()` that registers every one of them,
//! so a metric is exported (at zero) before its first use and no list is kept by hand.

/// The metric a registration made. A failed registration means the same name was
/// registered twice: a programming error caught by the first test that touches the metrics,
/// never a runtime condition.
#[allow(clippy::expect_used)]
pub fn registered<T>(result: prometheus::Result<T>) -> T {
    result.expect("metric names are unique")
}

/// Declares a crate's metrics: `[attributes] VIS static NAME: TYPE = INITIALISER;` each,
/// where the initialiser registers the metric (usually `registered(register_…!(…))`). Also
/// defines `pub(crate) fn register_all()`, which registers them all.
#[macro_export]
macro_rules! declare_metrics {
    ($( $(#[$attribute:meta])* $visibility:vis static $name:ident: $kind:ty = $initialiser:expr; )*) => {
        $(
            $(#[$attribute])*
            $visibility static $name: ::std::sync::LazyLock<$kind> =
                ::std::sync::LazyLock::new(|| $initialiser);
        )*

        /// Registers every metric declared here, so each is exported before its first use.
        pub(crate) fn register_all() {
            $( ::std::sync::LazyLock::force(&$name); )*
        }
    };
}
