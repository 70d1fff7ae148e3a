//! `qemu-img map` over NBD on a real node shows the holes of a thin file LUN:
//! the node negotiates structured replies and `base:allocation`, so a 64 MiB
//! LUN with two written 1 MiB regions maps as data there and zero elsewhere
//! (without block status qemu reports everything as data). `qemu-img compare`
//! against a local raw file with the same content succeeds. Skips when
//! qemu-img or qemu-io is missing, fails instead under FREESAN_REQUIRE_TOOLS=1.

use crate::common;
use common::*;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;
/// The two written regions: (offset, pattern byte), 1 MiB each.
const REGIONS: [(u64, u8); 2] = [(8 * MIB, 0xab), (40 * MIB, 0xcd)];

/// A node with one 64 MiB thin file LUN and NBD on loopback.
fn node_config(dir: &Path) -> PathBuf {
    let s = format!(
        "data_dir = \"{d}/data\"\n[[portal]]\naddress = \"127.0.0.1:0\"\n\
         [nbd]\naddress = \"127.0.0.1:0\"\n\
         [[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npath = \"{d}/lun0.img\"\nsize = \"64M\"\n",
        d = dir.display()
    );
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

/// Runs `prog` (qemu-img or qemu-io) with `args`, at most 60 s.
fn qemu(prog: &str, args: &[String]) -> (bool, String) {
    let mut all = vec!["60".to_string(), prog.to_string()];
    all.extend_from_slice(args);
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let (ok, out) = run("timeout", &refs);
    eprintln!("$ {prog} {}\n{out}", args.join(" "));
    (ok, out)
}

fn image_opts(addr: &str) -> String {
    let (host, port) = addr.rsplit_once(':').unwrap();
    format!("driver=nbd,server.type=inet,server.host={host},server.port={port},export=lun0")
}

/// qemu-io writes the two regions through `target` (image options or a file).
fn write_regions(target: &[String]) {
    let mut a: Vec<String> = target.to_vec();
    for (off, p) in REGIONS {
        a.push("-c".into());
        a.push(format!("write -P {p} {off} {MIB}"));
    }
    let (ok, out) = qemu("qemu-io", &a);
    assert!(ok, "qemu-io write failed: {out}");
}

#[test]
fn qemu_img_map_shows_the_holes_of_a_thin_lun() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cfg = node_config(root);
    let mut node = start_config(root, &cfg);
    let addr = node.nbd.clone().expect("nbd address");
    let opts = image_opts(&addr);

    write_regions(&["--image-opts".into(), opts.clone()]);
    let reference = root.join("ref.img");
    let (ok, out) = qemu(
        "qemu-img",
        &[
            "create".into(),
            "-f".into(),
            "raw".into(),
            reference.display().to_string(),
            "64M".into(),
        ],
    );
    assert!(ok, "{out}");
    write_regions(&["-f".into(), "raw".into(), reference.display().to_string()]);

    let (ok, out) = qemu(
        "qemu-img",
        &[
            "map".into(),
            "--output=json".into(),
            "--image-opts".into(),
            opts.clone(),
        ],
    );
    assert!(ok, "qemu-img map failed: {out}");
    let json = &out[out.find('[').expect("a JSON list")..];
    let json = &json[..=json.rfind(']').unwrap()];
    let map: Vec<serde_json::Value> = serde_json::from_str(json).expect("map JSON");
    // Every byte of the LUN, in order, data exactly where written.
    let mut pos = 0u64;
    let mut data: Vec<(u64, u64)> = Vec::new();
    for e in &map {
        let start = e["start"].as_u64().unwrap();
        let len = e["length"].as_u64().unwrap();
        assert_eq!(start, pos, "map is contiguous: {map:?}");
        pos += len;
        if e["data"].as_bool().unwrap() {
            assert!(!e["zero"].as_bool().unwrap_or(false), "{e}");
            match data.last_mut() {
                Some(l) if l.0 + l.1 == start => l.1 += len,
                _ => data.push((start, len)),
            }
        } else {
            assert!(e["zero"].as_bool().unwrap(), "a hole reads as zero: {e}");
        }
    }
    assert_eq!(pos, 64 * MIB, "map covers the LUN");
    let want: Vec<(u64, u64)> = REGIONS.iter().map(|(o, _)| (*o, MIB)).collect();
    assert_eq!(data, want, "data only where written: {map:?}");

    let nbd_url = format!("nbd://{addr}/lun0");
    let (ok, out) = qemu(
        "qemu-img",
        &[
            "compare".into(),
            "-f".into(),
            "raw".into(),
            "-F".into(),
            "raw".into(),
            reference.display().to_string(),
            nbd_url,
        ],
    );
    assert!(ok, "qemu-img compare failed: {out}");
    assert!(node.terminate(), "clean stop");
}
