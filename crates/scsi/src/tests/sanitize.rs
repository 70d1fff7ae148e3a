//! SANITIZE through the target: OVERWRITE and BLOCK ERASE wipe every block, the
//! CDB and parameter checks, the LU answering SANITIZE IN PROGRESS while a job
//! runs (and the job outliving its command), failure mode, the resume record.

use super::*;
use block::{FaultVolume, MemVolume};
use std::time::Duration;

const RSOC_ALL: [u8; 12] = [0xa3, 0x0c, 0x00, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0];

fn sanitize_cdb(sa: u8, param_len: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x48;
    c[1] = sa;
    c[7..9].copy_from_slice(&param_len.to_be_bytes());
    c
}

fn overwrite_params(count: u8, pattern: &[u8]) -> Vec<u8> {
    let mut p = vec![count, 0];
    p.extend_from_slice(&(pattern.len() as u16).to_be_bytes());
    p.extend_from_slice(pattern);
    p
}

/// The (opcode, service action) pairs REPORT SUPPORTED OPERATION CODES lists
/// for SANITIZE.
async fn sanitize_actions(t: &ScsiTarget, n: &ItNexus) -> Vec<u16> {
    let r = run(t, n, &RSOC_ALL, &[]).await;
    assert_eq!(r.status, status::GOOD);
    r.data_in[4..]
        .chunks(8)
        .filter(|d| d[0] == 0x48)
        .map(|d| u16::from_be_bytes([d[2], d[3]]))
        .collect()
}

async fn read_all(t: &ScsiTarget, n: &ItNexus) -> Vec<u8> {
    let mut out = Vec::new();
    for lba in (0..BLOCKS).step_by(128) {
        let r = run(t, n, &rw10(0x28, lba as u32, 128), &[]).await;
        assert_eq!(r.status, status::GOOD);
        out.extend_from_slice(&r.data_in);
    }
    out
}

async fn fill_lu(t: &ScsiTarget, n: &ItNexus, byte: u8) {
    for lba in (0..BLOCKS).step_by(128) {
        let r = run(t, n, &rw10(0x2a, lba as u32, 128), &vec![byte; 128 * BS]).await;
        assert_eq!(r.status, status::GOOD);
    }
}

#[tokio::test]
async fn overwrite_writes_the_pattern_over_every_block() {
    let t = target();
    let n = ready(&t, "01", 1).await;
    assert_eq!(sanitize_actions(&t, &n).await, vec![0x01, 0x02, 0x1f]);
    // VPD 0xB1: WABEREQ 01b, WACEREQ 00b
    let r = run(&t, &n, &[0x12, 0x01, 0xb1, 0, 0xff, 0], &[]).await;
    assert_eq!(r.data_in[7], 0x40);
    fill_lu(&t, &n, 0x61).await;
    let p = overwrite_params(1, &[0xaa, 0xbb, 0xcc]);
    let r = run(&t, &n, &sanitize_cdb(0x01, p.len() as u16), &p).await;
    assert_eq!(r.status, status::GOOD);
    let data = read_all(&t, &n).await;
    for block in data.chunks(BS) {
        let want: Vec<u8> = [0xaa, 0xbb, 0xcc]
            .iter()
            .cycle()
            .take(BS)
            .copied()
            .collect();
        assert_eq!(block, &want[..]);
    }
    // three passes, inverted between them: the last one is the pattern again
    let p = vec![0x80 | 3, 0, 0, 1, 0x0f];
    let r = run(&t, &n, &sanitize_cdb(0x01, 5), &p).await;
    assert_eq!(r.status, status::GOOD);
    assert!(read_all(&t, &n).await.iter().all(|&b| b == 0x0f));
    // two passes inverted: the last one inverted
    let p = vec![0x80 | 2, 0, 0, 1, 0x0f];
    let r = run(&t, &n, &sanitize_cdb(0x01, 5), &p).await;
    assert_eq!(r.status, status::GOOD);
    assert!(read_all(&t, &n).await.iter().all(|&b| b == 0xf0));
}

#[tokio::test]
async fn block_erase_deallocates_every_block() {
    let t = target();
    let n = ready(&t, "01", 1).await;
    fill_lu(&t, &n, 0x61).await;
    let r = run(&t, &n, &sanitize_cdb(0x02, 0), &[]).await;
    assert_eq!(r.status, status::GOOD);
    assert!(read_all(&t, &n).await.iter().all(|&b| b == 0));
    // GET LBA STATUS: one descriptor, the whole LU deallocated
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x12;
    c[10..14].copy_from_slice(&256u32.to_be_bytes());
    let r = run(&t, &n, &c, &[]).await;
    assert_eq!(r.status, status::GOOD);
    let blocks = u32::from_be_bytes([r.data_in[16], r.data_in[17], r.data_in[18], r.data_in[19]]);
    assert_eq!((blocks as u64, r.data_in[20] & 0x0f), (BLOCKS, 1));
}

#[tokio::test]
async fn block_erase_is_not_offered_on_a_thick_lu() {
    let vol = Arc::new(MemVolume::new_thick(BS as u32, BLOCKS));
    let t = target_with(vol);
    let n = ready(&t, "01", 1).await;
    assert_eq!(sanitize_actions(&t, &n).await, vec![0x01, 0x1f]);
    let r = run(&t, &n, &[0x12, 0x01, 0xb1, 0, 0xff, 0], &[]).await;
    assert_eq!(r.data_in[7], 0, "no WABEREQ without BLOCK ERASE");
    let r = run(&t, &n, &sanitize_cdb(0x02, 0), &[]).await;
    assert_eq!(sense_of(&r), (key::ILLEGAL_REQUEST, 0x24, 0));
}

#[tokio::test]
async fn bad_cdbs_and_parameter_lists_are_refused_before_anything_is_written() {
    let t = target();
    let n = ready(&t, "01", 1).await;
    fill_lu(&t, &n, 0x61).await;
    let good = overwrite_params(1, &[0xaa; BS]);
    let len = good.len() as u16;
    let mut bad_cdbs = vec![];
    for i in [2usize, 3, 4, 5, 6] {
        let mut c = sanitize_cdb(0x01, len);
        c[i] = i as u8;
        bad_cdbs.push((c, good.clone()));
    }
    let mut znr = sanitize_cdb(0x01, len);
    znr[1] |= 0x40;
    bad_cdbs.push((znr, good.clone()));
    // crypto erase, reserved and unknown service actions
    for sa in [0x00, 0x03, 0x04, 0x1e] {
        bad_cdbs.push((sanitize_cdb(sa, 0), vec![]));
    }
    // parameter list lengths
    for l in [0u16, 1, 2, 3, 4, BS as u16 + 5] {
        bad_cdbs.push((sanitize_cdb(0x01, l), vec![0; (l as usize).div_ceil(4) * 4]));
    }
    bad_cdbs.push((sanitize_cdb(0x02, 8), vec![0; 8]));
    bad_cdbs.push((sanitize_cdb(0x1f, 8), vec![0; 8]));
    // parameter lists: count 0, TEST set, pattern length 0 or longer than a block
    // or than the list
    let mut zero_count = good.clone();
    zero_count[0] = 0;
    let mut test = good.clone();
    test[0] |= 0x20;
    let mut no_pattern = good.clone();
    no_pattern[2..4].copy_from_slice(&0u16.to_be_bytes());
    let mut long_pattern = good.clone();
    long_pattern[2..4].copy_from_slice(&(BS as u16 + 4).to_be_bytes());
    for p in [zero_count, test, no_pattern, long_pattern] {
        bad_cdbs.push((sanitize_cdb(0x01, len), p));
    }
    for (c, p) in bad_cdbs {
        let r = run(&t, &n, &c, &p).await;
        let (k, asc, _) = sense_of(&r);
        assert!(
            k == key::ILLEGAL_REQUEST && (asc == 0x24 || asc == 0x26),
            "{c:02x?}: {:?}",
            sense_of(&r)
        );
    }
    assert!(read_all(&t, &n).await.iter().all(|&b| b == 0x61));
}

#[tokio::test]
async fn a_write_protected_lu_is_not_sanitized() {
    let mut cfg = lun_config();
    cfg.read_only = true;
    let t = ScsiTarget::new(TargetConfig::one_port_group(
        "iqn.2026-11.org.freesan:t1",
        1,
        vec![(0, cfg, Arc::new(MemVolume::new(BS as u32, BLOCKS)))],
    ))
    .unwrap();
    let n = ready(&t, "01", 1).await;
    let p = overwrite_params(1, &[0xaa]);
    let r = run(&t, &n, &sanitize_cdb(0x01, p.len() as u16), &p).await;
    assert_eq!(sense_of(&r), (key::DATA_PROTECT, 0x27, 0));
    let r = run(&t, &n, &sanitize_cdb(0x02, 0), &[]).await;
    assert_eq!(sense_of(&r), (key::DATA_PROTECT, 0x27, 0));
}

/// A target whose LU's overwrite is paced at 64 KiB a second (8 s for the LU),
/// with its state file in `dir`.
fn paced_target(vol: VolumeRef, dir: Option<&std::path::Path>) -> ScsiTarget {
    let mut cfg = lun_config();
    cfg.sanitize_rate_bytes_per_s = 64 << 10;
    cfg.state_file = dir.map(|d| d.join("lun0.pr.json"));
    ScsiTarget::new(TargetConfig::one_port_group(
        "iqn.2026-11.org.freesan:t1",
        1,
        vec![(0, cfg, vol)],
    ))
    .unwrap()
}

/// The sense of the first READ from `n` after the target started, once its
/// power-on unit attention (checked) has been taken.
async fn first_read_after_start(t: &ScsiTarget, n: &ItNexus) -> (u8, u8, u8) {
    let r = run(t, n, &[0, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x29, 0x00));
    sense_of(&run(t, n, &rw10(0x28, 0, 1), &[]).await)
}

#[tokio::test(start_paused = true)]
async fn while_a_sanitize_runs_only_inquiry_report_luns_and_request_sense_are_served() {
    let t = paced_target(Arc::new(MemVolume::new(BS as u32, BLOCKS)), None);
    let n = ready(&t, "01", 1).await;
    fill_lu(&t, &n, 0x61).await;
    let p = overwrite_params(1, &[0xaa]);
    let mut c = sanitize_cdb(0x01, p.len() as u16);
    // without IMMED, then the command is aborted: the job goes on
    let aborted = tokio::time::timeout(Duration::from_millis(10), run(&t, &n, &c, &p)).await;
    assert!(aborted.is_err(), "the overwrite is paced over 8 s");
    for cdb in [
        &[0u8, 0, 0, 0, 0, 0][..],              // TEST UNIT READY
        &rw10(0x28, 0, 1)[..],                  // READ
        &rw10(0x2a, 0, 1)[..],                  // WRITE
        &[0x1b, 0x01, 0, 0, 0x12, 0][..],       // START STOP UNIT
        &sanitize_cdb(0x02, 0)[..],             // another SANITIZE
        &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0][..], // SYNCHRONIZE CACHE
    ] {
        let data = if cdb[0] == 0x2a { vec![0; BS] } else { vec![] };
        let r = run(&t, &n, cdb, &data).await;
        assert_eq!(sense_of(&r), (key::NOT_READY, 0x04, 0x1b), "{cdb:02x?}");
    }
    let r = run(&t, &n, &[0x12, 0, 0, 0, 96, 0], &[]).await;
    assert_eq!(r.status, status::GOOD, "INQUIRY");
    let r = run(&t, &n, &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0], &[]).await;
    assert_eq!(r.status, status::GOOD, "REPORT LUNS");
    // a LU reset does not stop it either
    assert!(t.lun_reset(&n, 0).await);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let r = run(&t, &n, &[0x03, 0, 0, 0, 18, 0], &[]).await;
    assert_eq!(r.status, status::GOOD);
    let s = &r.data_in;
    assert_eq!(
        (s[2] & 0xf, s[12]),
        (key::UNIT_ATTENTION, 0x29),
        "the reset's UA first"
    );
    let r = run(&t, &n, &[0x03, 0, 0, 0, 18, 0], &[]).await;
    let s = &r.data_in;
    assert_eq!((s[2] & 0xf, s[12], s[13]), (key::NOT_READY, 0x04, 0x1b));
    assert_eq!(s[15] & 0x80, 0x80, "SKSV: a progress indication");
    let progress = u16::from_be_bytes([s[16], s[17]]);
    assert!(
        (0x4000..0xc000).contains(&progress),
        "about half done: {progress:#x}"
    );
    // the job ends by itself; then the blocks hold the pattern
    tokio::time::sleep(Duration::from_secs(5)).await;
    let r = run(&t, &n, &[0, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(r.status, status::GOOD);
    assert!(read_all(&t, &n).await.iter().all(|&b| b == 0xaa));
    // with IMMED the command answers at once
    c[1] |= 0x80;
    let r = run(&t, &n, &c, &p).await;
    assert_eq!(r.status, status::GOOD);
    let r = run(&t, &n, &[0, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(sense_of(&r), (key::NOT_READY, 0x04, 0x1b));
}

#[tokio::test]
async fn a_failed_sanitize_leaves_the_lu_in_failure_mode_until_it_is_left() {
    let fault = Arc::new(FaultVolume::new(Arc::new(MemVolume::new(
        BS as u32, BLOCKS,
    ))));
    let plan = fault.plan();
    let t = target_with(fault);
    let n = ready(&t, "01", 1).await;
    plan.lock().bad_write_blocks.push(512..513);
    let p = overwrite_params(1, &[0xaa]);
    let mut c = sanitize_cdb(0x01, p.len() as u16);
    let r = run(&t, &n, &c, &p).await;
    assert_eq!(sense_of(&r), (key::MEDIUM_ERROR, 0x31, 0x03));
    for cdb in [&[0u8, 0, 0, 0, 0, 0][..], &rw10(0x28, 0, 1)[..]] {
        let r = run(&t, &n, cdb, &[]).await;
        assert_eq!(sense_of(&r), (key::MEDIUM_ERROR, 0x31, 0x03), "{cdb:02x?}");
    }
    // without AUSE, EXIT FAILURE MODE may not leave it
    let r = run(&t, &n, &sanitize_cdb(0x1f, 0), &[]).await;
    assert_eq!(sense_of(&r), (key::ILLEGAL_REQUEST, 0x24, 0));
    // with AUSE it may
    c[1] |= 0x20;
    let r = run(&t, &n, &c, &p).await;
    assert_eq!(sense_of(&r), (key::MEDIUM_ERROR, 0x31, 0x03));
    let r = run(&t, &n, &sanitize_cdb(0x1f, 0), &[]).await;
    assert_eq!(r.status, status::GOOD);
    let r = run(&t, &n, &[0, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(r.status, status::GOOD);
    // and a sanitize that succeeds leaves it too
    let r = run(&t, &n, &c, &p).await;
    assert_eq!(sense_of(&r), (key::MEDIUM_ERROR, 0x31, 0x03));
    plan.lock().bad_write_blocks.clear();
    let r = run(&t, &n, &sanitize_cdb(0x02, 0), &[]).await;
    assert_eq!(r.status, status::GOOD);
    let r = run(&t, &n, &[0, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(r.status, status::GOOD);
}

#[tokio::test(start_paused = true)]
async fn a_sanitize_cut_short_by_a_stop_runs_again_at_the_next_start() {
    let dir = TempDir::new("resume");
    let vol: VolumeRef = Arc::new(MemVolume::new(BS as u32, BLOCKS));
    let t = paced_target(vol.clone(), Some(dir.path()));
    let n = ready(&t, "01", 1).await;
    fill_lu(&t, &n, 0x61).await;
    let p = overwrite_params(1, &[0xaa]);
    let mut c = sanitize_cdb(0x01, p.len() as u16);
    c[1] |= 0x80;
    let r = run(&t, &n, &c, &p).await;
    assert_eq!(r.status, status::GOOD);
    tokio::time::sleep(Duration::from_secs(2)).await;
    // the node stops: its target (and the job with the runtime's tasks) is gone;
    // the volume holds a part of the pattern
    drop(t);
    let t = paced_target(vol, Some(dir.path()));
    let n = nexus("01", 1);
    assert_eq!(
        first_read_after_start(&t, &n).await,
        (key::NOT_READY, 0x04, 0x1b),
        "resumed at start"
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(read_all(&t, &n).await.iter().all(|&b| b == 0xaa));
    assert!(
        !dir.path().join("lun0.sanitize.json").exists(),
        "the record is removed once the sanitize completed"
    );
    // a start without a record serves at once
    drop(t);
    let t = paced_target(
        Arc::new(MemVolume::new(BS as u32, BLOCKS)),
        Some(dir.path()),
    );
    let n = ready(&t, "01", 1).await;
    let r = run(&t, &n, &rw10(0x28, 0, 1), &[]).await;
    assert_eq!(r.status, status::GOOD);
}

#[tokio::test]
async fn an_unreadable_record_starts_the_lu_in_failure_mode() {
    let dir = TempDir::new("unreadable");
    std::fs::write(dir.path().join("lun0.sanitize.json"), b"{ torn").unwrap();
    let t = paced_target(
        Arc::new(MemVolume::new(BS as u32, BLOCKS)),
        Some(dir.path()),
    );
    let n = nexus("01", 1);
    assert_eq!(
        first_read_after_start(&t, &n).await,
        (key::MEDIUM_ERROR, 0x31, 0x03),
        "half-wiped blocks served"
    );
    // a sanitize that succeeds leaves it
    let r = run(&t, &n, &sanitize_cdb(0x02, 0), &[]).await;
    assert_eq!(r.status, status::GOOD);
    let r = run(&t, &n, &rw10(0x28, 0, 1), &[]).await;
    assert_eq!(r.status, status::GOOD);
    assert!(!dir.path().join("lun0.sanitize.json").exists());
}

#[tokio::test(start_paused = true)]
async fn a_copy_never_reads_or_writes_an_lu_being_sanitized() {
    let t = paced_target(Arc::new(MemVolume::new(BS as u32, BLOCKS)), None);
    let cfg1 = add_second_lun(&t);
    let n = ready(&t, "01", 1).await;
    let _ = t.execute(&n, cmd(1, &[0, 0, 0, 0, 0, 0], &[])).await;
    fill_lu(&t, &n, 0x61).await;
    let at1 = |cdb: Vec<u8>, data: Vec<u8>| t.execute(&n, cmd(1, &cdb, &data));
    assert_eq!(
        at1(rw10(0x2a, 0, 8).to_vec(), vec![0x62; 8 * BS])
            .await
            .status,
        0
    );
    let p = overwrite_params(1, &[0xaa]);
    let mut c = sanitize_cdb(0x01, p.len() as u16);
    c[1] |= 0x80; // IMMED
    assert_eq!(run(&t, &n, &c, &p).await.status, status::GOOD);
    // sent to LUN 1, from and onto LUN 0 while it is wiped
    let naa0 = lun_config().naa;
    for segs in [(0u16, 1u16, 8u16, 0u64, 0u64), (1, 0, 8, 0, 0)] {
        let p = xcopy_params(1, 0, &[naa0, cfg1.naa], &[segs]);
        let r = at1(xcopy_cdb(p.len()).to_vec(), p).await;
        assert_eq!(sense_of(&r), (key::COPY_ABORTED, 0x0d, 0x02), "{segs:?}");
    }
    let r = at1(rw10(0x28, 0, 8).to_vec(), vec![]).await;
    assert!(r.data_in.iter().all(|&b| b == 0x62), "LUN 1 was written");
    // once the sanitize has ended, LUN 0 holds the pattern only
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(run(&t, &n, &[0, 0, 0, 0, 0, 0], &[]).await.status, 0);
    assert!(read_all(&t, &n).await.iter().all(|&b| b == 0xaa));
}
