//! SANITIZE through a real node, killed in the middle of it: a paced OVERWRITE
//! has wiped part of the LUN when the node gets SIGKILL. The next start must
//! run it again before any command sees the blocks (NOT READY, SANITIZE IN
//! PROGRESS), and once it ends every block holds the pattern and its record is
//! gone.

use crate::common;
use common::scsi::{self, command};
use common::*;
use std::time::{Duration, Instant};

const BS: usize = 512;
const SIZE_BYTES: usize = 16 << 20;

fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let mut s = config_head(dir, 0);
    s += &format!(
        "[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\npath = \"{}/lun0.img\"\nsize = \"16M\"\n\
         sanitize_rate_mib_s = 4\n",
        dir.display()
    );
    let path = dir.join("node.toml");
    std::fs::write(&path, s).unwrap();
    path
}

/// REQUEST SENSE's (key, asc, ascq) and progress (out of 65536) if any.
async fn request_sense(s: &initiator::Session) -> ((u8, u8, u8), Option<u16>) {
    let r = command(s, &[0x03, 0, 0, 0, 18, 0], 18).await;
    assert_eq!(r.status, 0);
    let d = &r.data_in;
    let progress = (d[15] & 0x80 != 0).then(|| u16::from_be_bytes([d[16], d[17]]));
    ((d[2] & 0x0f, d[12], d[13]), progress)
}

fn record_exists(dir: &std::path::Path) -> bool {
    let targets = dir.join("data").join("targets");
    std::fs::read_dir(targets)
        .map(|it| {
            it.flatten()
                .any(|e| e.path().join("lun0.sanitize.json").exists())
        })
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sanitize_interrupted_by_sigkill_runs_again_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut node = start_config(dir.path(), &cfg);
    let s = node.login("iqn.2026-11.test:sanitize").await;
    // the whole LU holds 0x61
    for lba in (0..(SIZE_BYTES / BS) as u32).step_by(2048) {
        let mut c = [0u8; 10];
        c[0] = 0x2a;
        c[2..6].copy_from_slice(&lba.to_be_bytes());
        c[7..9].copy_from_slice(&2048u16.to_be_bytes());
        let r = scsi::past_uas(&s, 0, &c, vec![0x61; 2048 * BS], 0).await;
        assert_eq!(r.status, 0, "{:?}", scsi::condition(&r));
    }
    let r = command(&s, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0).await;
    assert_eq!(r.status, 0);
    // OVERWRITE with 0xAA, IMMED: paced at 4 MiB/s, 4 s for the LU
    let params = vec![0x01, 0, 0, 1, 0xaa];
    let r = s
        .command(
            0,
            &[0x48, 0x81, 0, 0, 0, 0, 0, 0, 5, 0],
            bytes::Bytes::from(params),
            0,
        )
        .await
        .expect("command");
    assert_eq!(r.status, 0, "{:?}", scsi::condition(&r));
    // kill it once it has done a part of the job (a tenth or more), well before
    // the end
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (sense, progress) = request_sense(&s).await;
        assert_eq!(sense, (2, 0x04, 0x1b), "the sanitize is in progress");
        if progress.is_some_and(|p| p >= 6554) {
            assert!(
                progress.unwrap() < 52428,
                "too late to cut it: {progress:?}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "no progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(s);
    node.kill9();
    assert!(
        record_exists(dir.path()),
        "no record of the running sanitize"
    );
    let img = std::fs::read(dir.path().join("lun0.img")).unwrap();
    assert_eq!(img[0], 0xaa, "the start was wiped");
    assert_eq!(img[SIZE_BYTES - 1], 0x61, "the end was not, yet");

    let node = start_config(dir.path(), &cfg);
    let s = node.login("iqn.2026-11.test:sanitize").await;
    // the first command past the unit attentions (not past NOT READY, which
    // past_uas waits out): still (again) in progress
    let mut first = None;
    for _ in 0..10 {
        let r = command(&s, &[0, 0, 0, 0, 0, 0], 0).await;
        let ua = r.status == 2
            && r.sense
                .as_deref()
                .and_then(initiator::parse_sense)
                .map(|x| x.key)
                == Some(6);
        if !ua {
            first = Some(r);
            break;
        }
    }
    let r = first.expect("unit attentions without end");
    assert_eq!(scsi::condition(&r), Some((0x04, 0x1b)), "not resumed");
    let mut c = [0u8; 10];
    c[0] = 0x28;
    c[8] = 1;
    let r = command(&s, &c, BS as u32).await;
    assert_eq!(
        scsi::condition(&r),
        Some((0x04, 0x1b)),
        "a read reached the half-wiped blocks"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = command(&s, &[0, 0, 0, 0, 0, 0], 0).await;
        if r.status == 0 {
            break;
        }
        assert_eq!(scsi::condition(&r), Some((0x04, 0x1b)));
        assert!(
            Instant::now() < deadline,
            "the resumed sanitize never ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for lba in (0..(SIZE_BYTES / BS) as u32).step_by(2048) {
        let mut c = [0u8; 10];
        c[0] = 0x28;
        c[2..6].copy_from_slice(&lba.to_be_bytes());
        c[7..9].copy_from_slice(&2048u16.to_be_bytes());
        let r = command(&s, &c, (2048 * BS) as u32).await;
        assert_eq!(r.status, 0);
        assert!(r.data_in.iter().all(|&b| b == 0xaa), "LBA {lba}: not wiped");
    }
    assert!(
        !record_exists(dir.path()),
        "the record outlived the sanitize"
    );
    let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default();
    assert!(log.contains("a sanitize was running when the node stopped"));
}
