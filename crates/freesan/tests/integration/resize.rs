//! Online resize: a file LUN grows while `freesan bench --verify` writes to it; an
//! initiator's next command gets CAPACITY DATA HAS CHANGED and READ CAPACITY shows
//! the new size; every acknowledged write of the run reads back; a second verified
//! run writes the whole grown LUN, new space included; shrinking is refused.

use crate::common;
use common::scsi::{capacity_bytes, command, condition};
use common::*;

const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lun_grows_while_verified_writes_run() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = one_file_lun_config(dir.path());
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let url = node.url(0, 0);

    // an initiator that knows the old size
    let addr = node.portals[0].parse().unwrap();
    let s = initiator::Session::login(
        addr,
        &initiator::LoginOptions::new("iqn.2026-11.test:resize", IQN),
    )
    .await
    .expect("login");
    for _ in 0..4 {
        if command(&s, &[0; 6], 0).await.status == 0 {
            break;
        }
    }
    assert_eq!(capacity_bytes(&s).await, 16 * MIB);

    let state = dir.path().join("verify.state");
    let mut bench = start_verified_writes(&url, &state, "16k", 2, 4);
    let (ok, out) = cli(
        &api,
        &[
            "lun", "resize", "--target", IQN, "--lun", "0", "--size", "32M",
        ],
    );
    assert!(ok && out.contains("grown"), "{out}");
    assert!(
        bench.wait().unwrap().success(),
        "verified writes failed during the resize"
    );
    assert_acknowledged_writes_intact(&url, &state, "across the resize");

    // the initiator is told, then sees the new size
    let r = command(&s, &[0; 6], 0).await;
    assert_eq!(
        condition(&r),
        Some((0x2a, 0x09)),
        "CAPACITY DATA HAS CHANGED"
    );
    assert_eq!(capacity_bytes(&s).await, 32 * MIB);
    assert_eq!(
        std::fs::metadata(dir.path().join("lun0.img"))
            .unwrap()
            .len(),
        32 * MIB
    );

    // a verified sequential run over the whole grown LUN, new space included
    let state2 = dir.path().join("verify2.state");
    let (ok, out) = freesan(&[
        "bench",
        "--target",
        &url,
        "--single-path",
        "--bs",
        "256k",
        "--rw",
        "write",
        "--threads",
        "1",
        "--qd",
        "4",
        "--secs",
        "2",
        "--ramp",
        "0",
        "--verify",
        "--quiet",
        "--verify-state",
        state2.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    assert_acknowledged_writes_intact(&url, &state2, "after the resize");
    let mut last = [0u8; 16];
    last[0] = 0x88;
    last[2..10].copy_from_slice(&(32 * MIB / 512 - 1).to_be_bytes());
    last[13] = 1;
    let r = command(&s, &last, 512).await;
    assert_eq!(r.status, 0);
    assert!(
        r.data_in.iter().any(|&b| b != 0),
        "the new space's last block was never written"
    );

    // growing past what the file's filesystem could ever hold is refused
    let (ok, out) = cli(
        &api,
        &[
            "lun", "resize", "--target", IQN, "--lun", "0", "--size", "1048576T",
        ],
    );
    assert!(!ok && out.contains("could never be held"), "{out}");
    assert_eq!(capacity_bytes(&s).await, 32 * MIB);

    // shrinking is refused and changes nothing
    let (ok, out) = cli(
        &api,
        &[
            "lun", "resize", "--target", IQN, "--lun", "0", "--size", "16M",
        ],
    );
    assert!(!ok && out.contains("shrinking"), "{out}");
    assert_eq!(capacity_bytes(&s).await, 32 * MIB);

    // forced, it is still refused while an initiator may see the LUN
    let shrink = |force: bool| {
        let mut args = vec![
            "lun", "resize", "--target", IQN, "--lun", "0", "--size", "16M",
        ];
        if force {
            args.push("--force");
        }
        cli(&api, &args)
    };
    let (ok, out) = shrink(true);
    assert!(!ok && out.contains("visible to initiators"), "{out}");
    // a host group that maps it to nobody: now it shrinks, and the file with it
    let (ok, out) = cli(
        &api,
        &[
            "host-group",
            "create",
            "--target",
            IQN,
            "--name",
            "nobody",
            "--initiator",
            "iqn.2026-11.test:someone-else",
        ],
    );
    assert!(ok, "{out}");
    let (ok, out) = shrink(false);
    assert!(!ok && out.contains("--force"), "not without --force: {out}");
    let (ok, out) = shrink(true);
    assert!(ok && out.contains("shrunk"), "{out}");
    assert_eq!(
        std::fs::metadata(dir.path().join("lun0.img"))
            .unwrap()
            .len(),
        16 * MIB
    );
}
