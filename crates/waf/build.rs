//! Links the system libmodsecurity (Debian `libmodsecurity-dev`, 3.0.9).
fn main() {
    println!("cargo:rustc-link-lib=dylib=modsecurity");
    println!("cargo:rerun-if-changed=build.rs");
}
