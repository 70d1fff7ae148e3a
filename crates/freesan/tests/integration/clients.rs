//! Real initiators against a real freesan process: libiscsi's iscsi-ls, iscsi-inq,
//! iscsi-readcapacity16, and qemu-img copying a 1 GiB image in and out.

use crate::common;
use common::*;

/// The designator blocks of VPD 0x83 (as iscsi-inq prints them) that name the
/// logical unit, as opposed to the port or target.
fn lun_designators(out: &str) -> Vec<String> {
    out.split("DEVICE DESIGNATOR")
        .filter(|d| d.contains("LOGICAL_UNIT"))
        .map(str::to_string)
        .collect()
}

#[test]
fn libiscsi_tools_see_the_lun_on_every_portal() {
    if !have("iscsi-ls") || !have("iscsi-inq") || !have("iscsi-readcapacity16") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lun = format!("{}:256M", dir.path().join("lun0.img").display());
    let node = Node::start(
        &["127.0.0.1", "127.0.0.2"],
        &[
            "--target".into(),
            IQN.into(),
            "--lun".into(),
            lun,
            "--data-dir".into(),
            dir.path().join("data").display().to_string(),
        ],
        &dir.path().join("serve.log"),
    );
    // discovery through the first portal lists the target on both portals
    let (ok, out) = run("iscsi-ls", &["-s", &format!("iscsi://{}", node.portals[0])]);
    assert!(ok, "iscsi-ls failed: {out}");
    assert!(out.contains(IQN), "target missing from discovery: {out}");
    for p in &node.portals {
        assert!(
            out.contains(p.as_str()),
            "portal {p} missing from SendTargets: {out}"
        );
    }
    assert!(out.contains("Lun:0"), "LUN 0 missing: {out}");

    // the same logical-unit designators (T10 vendor id + NAA) on both portals
    let mut ids = Vec::new();
    for i in 0..2 {
        let (ok, out) = run("iscsi-inq", &["-e", "1", "-c", "131", &node.url(i, 0)]);
        assert!(ok, "iscsi-inq VPD 0x83 failed: {out}");
        let lu = lun_designators(&out);
        assert!(
            lu.iter().any(|d| d.contains("(3) NAA")),
            "no NAA designator: {out}"
        );
        ids.push(lu);
    }
    assert_eq!(ids[0], ids[1], "LUN identity differs between portals");

    let (ok, out) = run("iscsi-inq", &[&node.url(1, 0)]);
    assert!(ok, "standard INQUIRY failed: {out}");
    assert!(out.contains("FREESAN"), "vendor missing: {out}");

    let (ok, out) = run("iscsi-readcapacity16", &[&node.url(0, 0)]);
    assert!(ok, "READ CAPACITY 16 failed: {out}");
    let blocks = 256u64 * 1024 * 1024 / 512;
    assert!(
        out.contains(&format!("Returned Logical Block Address:{}", blocks - 1))
            || out.contains(&format!("{}", blocks - 1)),
        "wrong capacity: {out}"
    );
}

#[test]
fn qemu_img_copies_a_gigabyte_in_and_out_unchanged() {
    if !have("qemu-img") {
        return;
    }
    let dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
    let size: u64 = 1 << 30;
    // a source image with distinct content in every MiB (and a hole)
    let src = dir.path().join("src.img");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&src).unwrap();
        let mut block = vec![0u8; 1 << 20];
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for mib in 0..(size >> 20) {
            if mib == 100 {
                block.fill(0);
            } else {
                for b in block.chunks_mut(8) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    b.copy_from_slice(&x.to_le_bytes());
                }
            }
            f.write_all(&block).unwrap();
        }
    }
    let node = start_file_lun(dir.path(), "1G", "serve.log");
    let url = node.url(0, 0);
    let (ok, out) = run(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            src.to_str().unwrap(),
            &url,
        ],
    );
    assert!(ok, "qemu-img convert into the LUN failed: {out}");
    let back = dir.path().join("back.img");
    let (ok, out) = run(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &url,
            back.to_str().unwrap(),
        ],
    );
    assert!(ok, "qemu-img convert out of the LUN failed: {out}");
    let (ok, out) = run("cmp", &[src.to_str().unwrap(), back.to_str().unwrap()]);
    assert!(ok, "bytes differ after the round trip: {out}");
}
