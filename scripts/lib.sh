# Shared by scripts/run and scripts/test: make sure a fresh Debian machine has what the
# build needs. Sourced, not executed.

# Installs Debian packages that are missing (one apt-get update, only when needed).
ensure_packages() {
  local missing=()
  for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing: ${missing[*]}" >&2
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

ensure_build_tools() {
  # libssl-dev: the router links the system OpenSSL (TLS, certificates, the ACME CSR).
  # libmodsecurity-dev and modsecurity-crs: the WAF (crates/waf) links libmodsecurity 3 and
  # loads the OWASP Core Rule Set from Debian's paths. libturbojpeg0-dev: thumbnails decode
  # and encode JPEG with libjpeg-turbo (crates/proxy, stage/thumbnail.rs).
  ensure_packages build-essential pkg-config libssl-dev ca-certificates \
    libmodsecurity-dev modsecurity-crs libturbojpeg0-dev
  if ! command -v cargo >/dev/null 2>&1; then
    [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
  fi
  if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo (Rust 1.83 or newer) is required; install it with rustup" >&2
    exit 1
  fi
  # Two cores here: more parallel rustc jobs only add memory pressure.
  export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
}

# aioquic, the HTTP/3 client of tests/http3.rs and bench/conformance/h3_requests.py (a QUIC
# stack not written here), from PyPI into a virtual environment of the build's own.
ensure_h3_client() {
  ensure_packages python3 python3-venv
  if ! target/h3-venv/bin/python3 -c 'import aioquic' 2>/dev/null; then
    python3 -m venv target/h3-venv
    target/h3-venv/bin/pip install --quiet 'aioquic==1.7.2'
  fi
}

# The example proxy-wasm filters (examples/filters, the proxy-wasm Rust SDK), built for
# wasm32-unknown-unknown: tests/filters.rs and crates/filters/tests run them in the router.
# rustup adds the target's standard library when it is missing.
# Where the target cannot be added (no rustup, or no way to its distribution server), the
# builds of the same sources committed in examples/filters/prebuilt stand in, said so.
ensure_example_filters() {
  local built=examples/filters/target/wasm32-unknown-unknown/release
  if [ ! -d "$(rustc --print sysroot)/lib/rustlib/wasm32-unknown-unknown" ]; then
    if ! command -v rustup >/dev/null 2>&1 || ! rustup target add wasm32-unknown-unknown; then
      echo "note: no wasm32-unknown-unknown target: the example filters of examples/filters/prebuilt are used" >&2
      mkdir -p "$built"
      cp examples/filters/prebuilt/*.wasm "$built/"
      return 0
    fi
  fi
  (cd examples/filters && cargo build --release --locked --quiet --target wasm32-unknown-unknown)
}

# promtool checks and unit-tests the alert rules (tests/deploy_kit.rs). Debian ships it
# only inside its prometheus package, whose installation would start a Prometheus server:
# the package is unpacked under target/ instead, nothing run.
ensure_promtool() {
  command -v promtool >/dev/null 2>&1 && return 0
  [ -x target/promtool/usr/bin/promtool ] && return 0
  ensure_packages dpkg
  local work
  work=$(mktemp -d)
  if ! (cd "$work" && apt-get download prometheus >/dev/null 2>&1); then
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    (cd "$work" && apt-get download prometheus >/dev/null)
  fi
  mkdir -p target/promtool
  dpkg-deb -x "$work"/prometheus_*.deb target/promtool
  rm -rf "$work"
}

# cargo-deb makes the Debian package (Cargo.toml's [package.metadata.deb]); dpkg-dev's
# dpkg-shlibdeps finds the libraries it depends on.
ensure_cargo_deb() {
  ensure_packages dpkg-dev
  cargo deb --version >/dev/null 2>&1 || cargo install --locked --quiet cargo-deb --version 3.8.0
}
