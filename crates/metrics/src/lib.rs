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

        /// What each metric declared here is, for the reference (`switchyard reference`).
        pub(crate) fn documented() -> Vec<$crate::MetricDoc> {
            let mut docs = Vec::new();
            $( docs.extend($crate::Documented::metric_docs(&*$name)); )*
            docs
        }
    };
}

/// One metric as the reference shows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MetricDoc {
    /// The exported name.
    pub name: String,
    /// `counter`, `gauge`, `histogram`, …
    pub kind: String,
    /// Its labels' names.
    pub labels: Vec<String>,
    /// The `# HELP` text.
    pub help: String,
}

/// A declared metric's description. Implemented for the metric types the crates declare
/// (a `[Histogram; N]` of a vector's series describes nothing: the vector does).
pub trait Documented {
    /// What the metric exports.
    fn metric_docs(&self) -> Vec<MetricDoc>;
}

impl<P: prometheus::core::Atomic> Documented for prometheus::core::GenericCounter<P> {
    fn metric_docs(&self) -> Vec<MetricDoc> {
        describe(self)
    }
}

impl<P: prometheus::core::Atomic> Documented for prometheus::core::GenericGauge<P> {
    fn metric_docs(&self) -> Vec<MetricDoc> {
        describe(self)
    }
}

impl Documented for prometheus::Histogram {
    fn metric_docs(&self) -> Vec<MetricDoc> {
        describe(self)
    }
}

impl<T: prometheus::core::MetricVecBuilder> Documented for prometheus::core::MetricVec<T> {
    fn metric_docs(&self) -> Vec<MetricDoc> {
        describe(self)
    }
}

/// The series of a vector found by index (its labels' values in a fixed order): the
/// vector itself documents them.
impl<const N: usize> Documented for [prometheus::Histogram; N] {
    fn metric_docs(&self) -> Vec<MetricDoc> {
        Vec::new()
    }
}

/// As for histograms' series by index.
impl<const N: usize> Documented for [prometheus::IntCounter; N] {
    fn metric_docs(&self) -> Vec<MetricDoc> {
        Vec::new()
    }
}

/// The metrics `collector` exports, described from its own declaration (its descriptors,
/// and the type of what it collects).
pub fn describe(collector: &dyn prometheus::core::Collector) -> Vec<MetricDoc> {
    let families = collector.collect();
    collector
        .desc()
        .into_iter()
        .map(|desc| {
            let kind = families
                .iter()
                .find(|family| family.get_name() == desc.fq_name)
                .map_or("untyped".to_string(), |family| {
                    format!("{:?}", family.get_field_type()).to_lowercase()
                });
            MetricDoc {
                name: desc.fq_name.clone(),
                kind,
                labels: desc.variable_labels.clone(),
                help: desc.help.clone(),
            }
        })
        .collect()
}

/// A gauge exported only once its value is known: absent from a scrape until the first
/// `set`, and again after `forget`. An alert on it then says nothing where nothing is known
/// (no certificate issued yet, no shared store), where a gauge at zero would page. Its
/// clones share the value and whether it is known, as a `prometheus::Gauge`'s share its
/// value: the registry holds one, the static another.
#[derive(Clone)]
pub struct KnownGauge {
    gauge: prometheus::Gauge,
    known: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl KnownGauge {
    /// A gauge named `name` with `help`, not known yet and not registered ([`known_gauge`]
    /// registers one).
    pub fn new(name: &str, help: &str) -> prometheus::Result<Self> {
        Ok(Self {
            gauge: prometheus::Gauge::new(name, help)?,
            known: std::sync::Arc::default(),
        })
    }

    /// The value, known from now on.
    pub fn set(&self, value: f64) {
        self.gauge.set(value);
        self.known.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Not known any more: left out of scrapes until the next `set`.
    pub fn forget(&self) {
        self.known
            .store(false, std::sync::atomic::Ordering::Release);
    }

    /// Whether a scrape shows it.
    pub fn is_known(&self) -> bool {
        self.known.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl prometheus::core::Collector for KnownGauge {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        if self.is_known() {
            self.gauge.collect()
        } else {
            Vec::new()
        }
    }
}

impl Documented for KnownGauge {
    fn metric_docs(&self) -> Vec<MetricDoc> {
        describe(&self.gauge)
    }
}

/// A [`KnownGauge`] registered in the default registry, for [`declare_metrics!`]'s statics.
pub fn known_gauge(name: &str, help: &str) -> prometheus::Result<KnownGauge> {
    let gauge = KnownGauge::new(name, help)?;
    prometheus::register(Box::new(gauge.clone()))?;
    Ok(gauge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_known_gauge_is_scraped_only_while_its_value_is_known() {
        let registry = prometheus::Registry::new();
        let gauge = KnownGauge::new("test_known", "a test").expect("gauge");
        registry
            .register(Box::new(gauge.clone()))
            .expect("registered");
        let scraped = |registry: &prometheus::Registry| {
            registry
                .gather()
                .iter()
                .map(|family| family.get_name().to_string())
                .collect::<Vec<_>>()
        };
        assert!(scraped(&registry).is_empty(), "exported before it is known");
        gauge.set(0.0);
        assert_eq!(scraped(&registry), ["test_known"]);
        gauge.forget();
        assert!(scraped(&registry).is_empty(), "exported once forgotten");
        let docs = gauge.metric_docs();
        assert_eq!(docs[0].kind, "gauge");
    }
}
