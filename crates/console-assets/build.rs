//! Turns `console/dist/*` (made by `scripts/build-console`) into a static table of
//! `include_bytes!`; with no dist, an empty table (the console then serves a page
//! saying how to build it), so the binary still builds on a machine without node.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let dist = manifest.join("../../console/dist");
    println!("cargo:rerun-if-changed={}", dist.display());
    let mut files = Vec::new();
    if dist.is_dir() {
        collect(&dist, &dist, &mut files);
    }
    files.sort();
    let mut out = String::from("&[\n");
    for (rel, path) in &files {
        if rel.ends_with(".gz") {
            continue;
        }
        println!("cargo:rerun-if-changed={}", path.display());
        let gz = PathBuf::from(format!("{}.gz", path.display()));
        let gz_expr = if gz.is_file() {
            println!("cargo:rerun-if-changed={}", gz.display());
            format!("Some(include_bytes!({:?}))", gz.display().to_string())
        } else {
            "None".to_string()
        };
        let _ = writeln!(
            out,
            "    ({:?}, include_bytes!({:?}), {gz_expr}),",
            rel,
            path.display().to_string()
        );
    }
    out.push_str("]\n");
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("assets.rs");
    std::fs::write(dest, out).expect("writing assets.rs");
}

fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, PathBuf)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            println!("cargo:rerun-if-changed={}", p.display());
            collect(root, &p, files);
        } else if let Ok(rel) = p.strip_prefix(root) {
            let rel = rel.to_string_lossy().replace('\\', "/");
            files.push((rel, p.canonicalize().unwrap_or(p)));
        }
    }
}
