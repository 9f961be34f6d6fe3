//! Finds libkvcache for the linker, with the standard library only.
//!
//! 1. `KVC_LIB_DIR`: the folder holding libkvcache.so (a build tree's `src/`,
//!    or an install's libdir);
//! 2. otherwise `pkg-config --libs-only-L kvcache` (`PKG_CONFIG` names another
//!    pkg-config); no `-L` there means the library is in a default folder.
//!
//! The folder found is added to the link search path and as an rpath of this
//! crate's own test binaries, and is passed to dependents' build scripts as
//! `DEP_KVCACHE_LIB_DIR` (cargo does not forward link arguments), so that the
//! kvcache crate can add the same rpath to its tests.

use std::env;
use std::path::PathBuf;
use std::process::Command;

/// Where pkg-config says the library is: `Ok(None)` for a default folder.
fn pkg_config_lib_dir() -> Result<Option<PathBuf>, String> {
    let tool = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let output = Command::new(&tool)
        .args(["--libs-only-L", "kvcache"])
        .output()
        .map_err(|e| format!("cannot run {tool}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{tool} --libs-only-L kvcache failed: {}",
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text
        .split_whitespace()
        .find_map(|arg| arg.strip_prefix("-L"))
        .map(PathBuf::from))
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=KVC_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let dir = match env::var_os("KVC_LIB_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => Some(PathBuf::from(dir)),
        None => match pkg_config_lib_dir() {
            Ok(dir) => dir,
            Err(why) => {
                println!(
                    "cargo:warning=libkvcache not located ({why}); set KVC_LIB_DIR to the folder of libkvcache.so"
                );
                None
            }
        },
    };
    if let Some(dir) = dir {
        let dir = dir.canonicalize().unwrap_or(dir);
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        println!("cargo:lib_dir={}", dir.display());
    }
    println!("cargo:rustc-link-lib=dylib=kvcache");
}
