//! `switchyard bench-seed`: fills an embedded store with many generated apps in a few large
//! transactions, so benchmarks can start a router over 100,000 apps in seconds instead of
//! issuing 100,000 fsynced API writes. Run it before the router starts. With `--certs` it
//! also issues a certificate per app from a throw-away CA (EC P-256, 90 days), validated by
//! the same code as the admin API. With `--acme` the apps opt in to ACME and those
//! certificates are recorded as issued by the router's ACME issuer (renewal due in 60 days),
//! the state a fleet reaches once its certificates are issued.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Args;
use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{BasicConstraints, SubjectAlternativeName};
use openssl::x509::{X509Name, X509};
use serde_json::json;
use switchyard_model::{parse_app_spec, parse_certificate_spec, AcmeDomain, StoredCertificate};
use switchyard_store::EmbeddedStore;

const BATCH: usize = 10_000;

/// Options of `switchyard bench-seed`.
#[derive(Args)]
pub(crate) struct SeedArgs {
    /// Directory of the embedded store to fill.
    #[arg(long)]
    data_dir: PathBuf,
    /// Number of apps: app{i}, with domain app{i}.{suffix}, i from 0.
    #[arg(long)]
    apps: usize,
    /// Domain suffix of the generated apps.
    #[arg(long, default_value = "bench")]
    suffix: String,
    /// A backend of every app (repeatable).
    #[arg(long = "backend", required = true)]
    backends: Vec<String>,
    /// Also store a certificate for the first N apps' domains.
    #[arg(long, default_value_t = 0)]
    certs: usize,
    /// Write the CA (`ca.pem`) and the first N certificates and keys as PEM files here, for
    /// peers that read certificates from disk.
    #[arg(long, requires = "pem_files")]
    pem_dir: Option<PathBuf>,
    /// How many certificates to write to `--pem-dir`.
    #[arg(long, default_value_t = 0)]
    pem_files: usize,
    /// The apps opt in to ACME, and their stored certificates are recorded as its own.
    #[arg(long)]
    acme: bool,
}

/// Writes the apps and reports how many were stored.
pub(crate) fn run(args: SeedArgs) -> anyhow::Result<()> {
    let store = EmbeddedStore::open(&args.data_dir)
        .with_context(|| format!("cannot open the store in {}", args.data_dir.display()))?;
    let mut batch = Vec::with_capacity(BATCH);
    for i in 0..args.apps {
        let spec = json!({
            "domains": [format!("app{i}.{}", args.suffix)],
            "backends": args.backends,
            "tls": {"acme": args.acme},
        });
        batch.push(parse_app_spec(&format!("app{i}"), &spec).map_err(|e| anyhow::anyhow!("{e}"))?);
        if batch.len() == BATCH || i + 1 == args.apps {
            store.import_apps(&batch)?;
            batch.clear();
        }
    }
    if args.certs > 0 {
        seed_certs(&store, &args)?;
    }
    println!(
        "stored {} apps and {} certificates in {}",
        args.apps,
        args.certs,
        args.data_dir.display()
    );
    Ok(())
}

fn seed_certs(store: &EmbeddedStore, args: &SeedArgs) -> anyhow::Result<()> {
    let ca_key = ec_key()?;
    let ca = build_cert("Switchyard bench CA", &ca_key, None, &[])?;
    if let Some(dir) = &args.pem_dir {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("ca.pem"), ca.to_pem()?)?;
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64;
    let mut batch = Vec::with_capacity(BATCH);
    let mut acme_batch = Vec::new();
    for i in 0..args.certs {
        let domain = format!("app{i}.{}", args.suffix);
        let key = ec_key()?;
        let leaf = build_cert(&domain, &key, Some((&ca, &ca_key)), &[&domain])?;
        let cert_pem = String::from_utf8(leaf.to_pem()?)?;
        let key_pem = String::from_utf8(key.private_key_to_pem_pkcs8()?)?;
        if let Some(dir) = args.pem_dir.as_deref().filter(|_| i < args.pem_files) {
            write_pem_pair(dir, &domain, &cert_pem, &key_pem)?;
        }
        let spec = json!({"cert_pem": cert_pem, "key_pem": key_pem});
        let cert =
            parse_certificate_spec(&domain, &spec, now).map_err(|e| anyhow::anyhow!("{e}"))?;
        if args.acme {
            acme_batch.push(issued_by_acme(&cert, now));
        }
        batch.push(cert);
        if batch.len() == BATCH || i + 1 == args.certs {
            store.import_certs(&batch)?;
            store.import_acme_domains(&acme_batch)?;
            batch.clear();
            acme_batch.clear();
        }
    }
    Ok(())
}

/// The ACME state of a certificate the issuer ordered itself.
fn issued_by_acme(cert: &StoredCertificate, now: i64) -> AcmeDomain {
    let mut state = AcmeDomain::pending(&cert.info.domain, now);
    state.issued(
        cert.info.issuer.clone(),
        cert.info.sha256.clone(),
        cert.info.not_before,
        cert.info.not_after,
        now,
    );
    // The CA's renewal information was asked for at issue, as the issuer does in its rounds.
    state.ari_checked_unix = Some(now);
    state
}

fn write_pem_pair(dir: &Path, domain: &str, cert: &str, key: &str) -> anyhow::Result<()> {
    std::fs::write(dir.join(format!("{domain}.pem")), cert)?;
    std::fs::write(dir.join(format!("{domain}.key")), key)?;
    Ok(())
}

fn ec_key() -> anyhow::Result<PKey<Private>> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
    Ok(PKey::from_ec_key(EcKey::generate(&group)?)?)
}

/// A CA certificate (no `issuer`) or a leaf for `names` signed by `issuer`.
fn build_cert(
    common_name: &str,
    key: &PKey<Private>,
    issuer: Option<(&X509, &PKey<Private>)>,
    names: &[&str],
) -> anyhow::Result<X509> {
    let mut builder = X509::builder()?;
    builder.set_version(2)?;
    let mut serial = BigNum::new()?;
    serial.rand(64, MsbOption::MAYBE_ZERO, false)?;
    let serial = serial.to_asn1_integer()?;
    builder.set_serial_number(&serial)?;
    let mut name = X509Name::builder()?;
    name.append_entry_by_nid(Nid::COMMONNAME, common_name)?;
    let name = name.build();
    builder.set_subject_name(&name)?;
    builder.set_issuer_name(issuer.map_or(&*name, |(ca, _)| ca.subject_name()))?;
    builder.set_pubkey(key)?;
    // An hour of slack: a certificate valid from "now" is refused by a clock a second behind.
    let an_hour_ago = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64 - 3600;
    builder.set_not_before(&*Asn1Time::from_unix(an_hour_ago)?)?;
    builder.set_not_after(&*Asn1Time::days_from_now(90)?)?;
    match issuer {
        None => builder.append_extension(BasicConstraints::new().critical().ca().build()?)?,
        Some((ca, _)) => {
            let mut san = SubjectAlternativeName::new();
            for n in names {
                san.dns(n);
            }
            let san = san.build(&builder.x509v3_context(Some(ca), None))?;
            builder.append_extension(san)?;
        }
    }
    builder.sign(issuer.map_or(key, |(_, k)| k), MessageDigest::sha256())?;
    Ok(builder.build())
}
