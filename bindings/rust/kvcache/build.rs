//! Gives this crate's test, example and binary targets an rpath to the
//! libkvcache folder kvcache-sys found (`DEP_KVCACHE_LIB_DIR`), so they run
//! without LD_LIBRARY_PATH. Standard library only.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_KVCACHE_LIB_DIR");
    if let Some(dir) = std::env::var_os("DEP_KVCACHE_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.to_string_lossy());
    }
}
