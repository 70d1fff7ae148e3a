//! `freesan bench` as a user runs it: against `freesan serve` over iSCSI (every
//! portal) and NBD, with JSON, CSV, charts and the last summary line; nbdinfo
//! reads the NBD export that `serve --nbd` offers.

use crate::common;
use common::*;
use std::process::Command;

fn bench(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_freesan"))
        .arg("bench")
        .args(args)
        .output()
        .expect("run freesan bench");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bench_over_iscsi_and_nbd_writes_reports_and_charts() {
    let dir = tempfile::tempdir().unwrap();
    let lun = format!("{}:256M", dir.path().join("lun0.img").display());
    let node = Node::start(
        &["127.0.0.1", "127.0.0.2"],
        &[
            "--target".into(),
            IQN.into(),
            "--lun".into(),
            lun,
            "--nbd".into(),
            "127.0.0.1:0".into(),
            "--data-dir".into(),
            dir.path().join("data").display().to_string(),
        ],
        &dir.path().join("serve.log"),
    );
    let json = dir.path().join("iscsi.json");
    let csv = dir.path().join("iscsi.csv");
    let chart = dir.path().join("chart");
    let url = node.url(0, 0);
    let (ok, out, err) = bench(&[
        "--target",
        &url,
        "--suite",
        "standard",
        "--only",
        "4k-randread,256k-seqwrite",
        "--threads",
        "2",
        "--qd",
        "4",
        "--secs",
        "0.5",
        "--ramp",
        "0",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
        "--chart",
        chart.to_str().unwrap(),
    ]);
    assert!(ok, "bench over iSCSI failed: {out}\n{err}");
    let last = out.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("summary: 4k-randread iops="),
        "last line: {last}"
    );
    assert!(last.contains("| 256k-seqwrite iops="), "last line: {last}");
    assert!(last.contains("errors=0"), "last line: {last}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert!(results.iter().all(|r| r["iops"].as_f64().unwrap() > 0.0));
    assert_eq!(std::fs::read_to_string(&csv).unwrap().lines().count(), 3);
    let png = std::fs::read(chart.with_extension("png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let svg = std::fs::read_to_string(chart.with_extension("svg")).unwrap();
    assert!(svg.contains("4k-randread") && svg.contains("256k-seqwrite"));

    // chart from saved reports
    let out2 = dir.path().join("two");
    let (ok, _, err) = bench(&[
        "chart",
        json.to_str().unwrap(),
        json.to_str().unwrap(),
        "--labels",
        "a,b",
        "--out",
        out2.to_str().unwrap(),
    ]);
    assert!(ok, "bench chart failed: {err}");
    assert!(out2.with_extension("png").exists());

    // NBD: the export of serve --nbd, with bench and with a real client
    let nbd = node
        .nbd
        .clone()
        .expect("serve --nbd printed no NBD address");
    let nbd_url = format!("nbd://{nbd}/lun0");
    let (ok, out, err) = bench(&[
        "--target",
        &nbd_url,
        "--bs",
        "8k",
        "--rw",
        "randrw",
        "--read-pct",
        "67",
        "--threads",
        "2",
        "--qd",
        "8",
        "--secs",
        "0.5",
        "--ramp",
        "0",
        "--verify",
        "--quiet",
    ]);
    assert!(ok, "bench over NBD failed: {out}\n{err}");
    let last = out.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("summary: 8k-randrw iops=") && last.contains("verify=ok"),
        "{last}"
    );
    if have("nbdinfo") {
        let (ok, out) = run("nbdinfo", &[&nbd_url]);
        assert!(ok, "nbdinfo failed: {out}");
        assert!(
            out.contains(&format!("{}", 256u64 << 20)),
            "size missing: {out}"
        );
    }
}
