//! End-to-end tests of the command set through [`ScsiTarget::execute`] over memory,
//! fault-injecting and counting volumes.

use crate::sense::key;
use crate::*;
use async_trait::async_trait;
use block::{BlockResult, Extent, FaultVolume, Geometry, MemVolume, Volume};
use std::sync::atomic::{AtomicU64, Ordering};

const BS: usize = 512;
const BLOCKS: u64 = 1024;

fn lun_config() -> LunConfig {
    LunConfig {
        naa: [0x60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
        serial: "FS0001".into(),
        vendor: "FREESAN".into(),
        product: "VIRTUAL DISK".into(),
        revision: "0001".into(),
        read_only: false,
        state_file: None,
        physical_block_exponent: 0,
        sanitize_rate_bytes_per_s: 0,
    }
}

fn target_with(vol: VolumeRef) -> ScsiTarget {
    ScsiTarget::new(TargetConfig {
        name: "iqn.2026-11.org.freesan:t1".into(),
        ports: vec![
            TargetPort {
                relative_id: 1,
                group_id: 1,
                name: "iqn.2026-11.org.freesan:t1,t,0x0001".into(),
            },
            TargetPort {
                relative_id: 2,
                group_id: 2,
                name: "iqn.2026-11.org.freesan:t1,t,0x0002".into(),
            },
        ],
        port_groups: vec![
            PortGroup {
                id: 1,
                state: AluaState::ActiveOptimized,
                relative_port_ids: vec![1],
            },
            PortGroup {
                id: 2,
                state: AluaState::ActiveNonOptimized,
                relative_port_ids: vec![2],
            },
        ],
        luns: vec![(0, lun_config(), vol)],
    })
    .unwrap()
}

fn target() -> ScsiTarget {
    target_with(Arc::new(MemVolume::new(BS as u32, BLOCKS)))
}

fn nexus(isid: &str, port: u16) -> ItNexus {
    ItNexus {
        initiator_name: Arc::from("iqn.test"),
        initiator_port: Arc::from(format!("iqn.test,i,0x{isid}").as_str()),
        relative_port_id: port,
        chap_user: None,
    }
}

fn cmd(lun: u64, cdb: &[u8], data: &[u8]) -> Command {
    Command {
        cdb: Bytes::copy_from_slice(cdb),
        lun,
        data_out: Bytes::copy_from_slice(data),
        // an initiator that takes all the data a command has
        data_in_len_max: u32::MAX,
        attr: TaskAttr::Simple,
    }
}

async fn run(t: &ScsiTarget, n: &ItNexus, cdb: &[u8], data: &[u8]) -> Response {
    t.execute(n, cmd(0, cdb, data)).await
}

/// A nexus with its POWER ON unit attention already consumed.
async fn ready(t: &ScsiTarget, isid: &str, port: u16) -> ItNexus {
    let n = nexus(isid, port);
    let r = run(t, &n, &[0, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x29, 0x00));
    let r = run(t, &n, &[0, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(r.status, status::GOOD);
    n
}

/// [`ready`] for initiator `name` (ISID 1, port 1), with the POWER ON unit
/// attention of LUNs 0 and 1 consumed.
async fn ready_as(t: &ScsiTarget, name: &str) -> ItNexus {
    let n = ItNexus {
        initiator_name: Arc::from(name),
        initiator_port: Arc::from(format!("{name},i,0x1").as_str()),
        relative_port_id: 1,
        chap_user: None,
    };
    for lun in [0, 1] {
        let _ = t.execute(&n, cmd(lun, &[0; 6], &[])).await;
    }
    n
}

/// (key, asc, ascq) of a CHECK CONDITION, fixed or descriptor format.
fn sense_of(r: &Response) -> (u8, u8, u8) {
    assert_eq!(
        r.status,
        status::CHECK_CONDITION,
        "expected CHECK CONDITION"
    );
    let s = r.sense.as_ref().unwrap();
    match s[0] & 0x7f {
        0x72 => (s[1] & 0xf, s[2], s[3]),
        _ => (s[2] & 0xf, s[12], s[13]),
    }
}

fn info_of(r: &Response) -> u32 {
    let s = r.sense.as_ref().unwrap();
    assert_eq!(s[0], 0xf0, "fixed sense with VALID");
    u32::from_be_bytes([s[3], s[4], s[5], s[6]])
}

fn rw10(opcode: u8, lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = opcode;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn rw16(opcode: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

const ILLEGAL: u8 = key::ILLEGAL_REQUEST;

#[tokio::test]
async fn unit_attention_lifecycle_across_two_nexuses() {
    let t = target();
    let a = nexus("1", 1);
    let b = nexus("2", 1);
    // INQUIRY neither reports nor consumes the POWER ON UA.
    let r = run(&t, &a, &[0x12, 0, 0, 0, 96, 0], &[]).await;
    assert_eq!(r.status, status::GOOD);
    // REQUEST SENSE returns and consumes it.
    let r = run(&t, &a, &[0x03, 0, 0, 0, 18, 0], &[]).await;
    assert_eq!(r.status, status::GOOD);
    assert_eq!((r.data_in[2], r.data_in[12]), (key::UNIT_ATTENTION, 0x29));
    let r = run(&t, &a, &[0x03, 0, 0, 0, 18, 0], &[]).await;
    assert_eq!((r.data_in[2], r.data_in[12]), (key::NO_SENSE, 0));
    // b still has its own POWER ON.
    let r = run(&t, &b, &[0, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x29, 0));
    assert_eq!(run(&t, &b, &[0; 6], &[]).await.status, status::GOOD);
    // MODE SELECT from a raises MODE PARAMETERS CHANGED on b only.
    let mut ms = vec![0u8; 4];
    ms.extend_from_slice(&[0x0a, 10, 0x04, 0x10, 0, 0, 0, 0, 0xff, 0xff, 0, 0]);
    let r = run(&t, &a, &[0x15, 0x10, 0, 0, ms.len() as u8, 0], &ms).await;
    assert_eq!(r.status, status::GOOD);
    assert_eq!(run(&t, &a, &[0; 6], &[]).await.status, status::GOOD);
    let r = run(&t, &b, &[0; 6], &[]).await;
    // D_SENSE is now set: the UA comes in descriptor format.
    assert_eq!(r.sense.as_ref().unwrap()[0], 0x72);
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x2a, 0x01));
    // LUN reset: every nexus gets BUS DEVICE RESET; mode pages revert to fixed sense.
    assert!(t.lun_reset(&a, 0).await);
    assert!(!t.lun_reset(&a, 7).await);
    let r = run(&t, &a, &[0; 6], &[]).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x29, 0x03));
    assert_eq!(r.sense.as_ref().unwrap()[0], 0x70);
    // Nexus loss: the nexus starts over with POWER ON.
    t.nexus_lost(&a).await;
    let r = run(&t, &a, &[0; 6], &[]).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x29, 0x00));
}

#[tokio::test]
async fn missing_lun() {
    let t = target();
    let n = nexus("1", 1);
    let r = t.execute(&n, cmd(5, &[0x12, 0, 0, 0, 96, 0], &[])).await;
    assert_eq!(r.status, status::GOOD);
    assert_eq!(r.data_in[0], 0x7f);
    let r = t.execute(&n, cmd(5, &[0, 0, 0, 0, 0, 0], &[])).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x25, 0));
    let r = t.execute(&n, cmd(5, &[0x03, 0, 0, 0, 18, 0], &[])).await;
    assert_eq!(r.status, status::GOOD);
    assert_eq!((r.data_in[2], r.data_in[12]), (ILLEGAL, 0x25));
    let r = t
        .execute(&n, cmd(5, &[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]))
        .await;
    assert_eq!(r.status, status::GOOD);
    assert_eq!(&r.data_in[..4], &[0, 0, 0, 8]);
}

#[tokio::test]
async fn inquiry_standard_and_vpd() {
    let t = target();
    let n = ready(&t, "1", 2).await;
    let r = run(&t, &n, &[0x12, 0, 0, 1, 4, 0], &[]).await;
    assert_eq!(r.status, status::GOOD);
    let d = &r.data_in;
    assert_eq!(
        (d[0], d[2], d[3] & 0x1f, d[4] as usize),
        (0, 6, 0x12, d.len() - 5)
    );
    assert_eq!(d[5] & 0x30, 0x30, "TPGS: implicit and explicit");
    assert_eq!(&d[8..15], b"FREESAN");
    assert_eq!(r.transfer_len_bytes as usize, d.len());
    // Allocation length truncates.
    let r = run(&t, &n, &[0x12, 0, 0, 0, 36, 0], &[]).await;
    assert_eq!(r.data_in.len(), 36);
    // EVPD=0 with a page code, and CmdDt.
    let r = run(&t, &n, &[0x12, 0, 0x80, 0, 255, 0], &[]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x24, 0));
    let r = run(&t, &n, &[0x12, 2, 0, 0, 255, 0], &[]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x24, 0));
    // Supported pages, each one answers.
    let r = run(&t, &n, &[0x12, 1, 0, 0, 255, 0], &[]).await;
    let pages: Vec<u8> = r.data_in[4..].to_vec();
    assert_eq!(pages, vec![0, 0x80, 0x83, 0x8f, 0xb0, 0xb1, 0xb2]);
    for p in pages {
        let r = run(&t, &n, &[0x12, 1, p, 0x04, 0, 0], &[]).await;
        assert_eq!(r.status, status::GOOD, "page {p:#x}");
        assert_eq!(r.data_in[1], p);
        let len = u16::from_be_bytes([r.data_in[2], r.data_in[3]]) as usize;
        assert_eq!(len + 4, r.data_in.len(), "page {p:#x}");
    }
    let r = run(&t, &n, &[0x12, 1, 0x55, 0, 255, 0], &[]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x24, 0));
    // Device identification: NAA first, relative port 2, group 2.
    let r = run(&t, &n, &[0x12, 1, 0x83, 0, 255, 0], &[]).await;
    let d = &r.data_in[4..];
    assert_eq!((d[1] & 0xf, d[3]), (3, 16));
    assert_eq!(&d[4..20], &lun_config().naa);
    let mut off = 0;
    let mut rel = None;
    let mut tpg = None;
    while off + 4 <= d.len() {
        let (ty, len) = (d[off + 1] & 0x3f, d[off + 3] as usize);
        let v = &d[off + 4..off + 4 + len];
        match ty {
            0x14 => rel = Some(u16::from_be_bytes([v[2], v[3]])),
            0x15 => tpg = Some(u16::from_be_bytes([v[2], v[3]])),
            _ => {}
        }
        off += 4 + len;
    }
    assert_eq!((rel, tpg), (Some(2), Some(2)));
    // Block limits: max transfer = volume's max_io_blocks.
    let r = run(&t, &n, &[0x12, 1, 0xb0, 0, 255, 0], &[]).await;
    assert_eq!(r.data_in.len(), 64);
    let max = u32::from_be_bytes(r.data_in[8..12].try_into().unwrap());
    assert_eq!(max, (8 << 20) / BS as u32);
    // Provisioning: thin memory volume.
    let r = run(&t, &n, &[0x12, 1, 0xb2, 0, 255, 0], &[]).await;
    assert_eq!(r.data_in[5] & 0xe4, 0xe4);
    assert_eq!(r.data_in[6] & 7, 2);
}

/// The Block Limits page's MAXIMUM COMPARE AND WRITE LENGTH is what the LU
/// takes: no more than one transfer of its volume. (Before, 255 was
/// advertised whatever the volume took, and a COMPARE AND WRITE of 17
/// blocks on a volume of 16-block transfers was INVALID FIELD IN CDB.)
#[tokio::test]
async fn the_compare_and_write_length_advertised_is_the_one_taken() {
    let vol = Counting {
        max_io_blocks: 16,
        ..Counting::new(1024)
    };
    let t = target_with(Arc::new(vol));
    let n = ready(&t, "1", 1).await;
    let r = run(&t, &n, &[0x12, 1, 0xb0, 0, 255, 0], &[]).await;
    let most = r.data_in[5] as u32;
    assert_eq!(most, 16);
    let caw = |blocks: u32| {
        let mut c = [0u8; 16];
        c[0] = 0x89;
        c[13] = blocks as u8;
        c
    };
    let data = vec![0u8; 2 * most as usize * BS];
    let r = run(&t, &n, &caw(most), &data).await;
    assert_eq!(r.status, 0, "the advertised length was refused: {r:?}");
    let data = vec![0u8; 2 * (most as usize + 1) * BS];
    let r = run(&t, &n, &caw(most + 1), &data).await;
    assert_eq!(sense_of(&r).0, key::ILLEGAL_REQUEST);
}

/// A READ asking for more than its initiator can take reads only the
/// blocks that cover what it takes, and says how much the CDB asked for (the
/// transport reports the rest as a residual overflow).
#[tokio::test]
async fn a_read_reads_no_more_than_its_initiator_takes() {
    let t = target();
    let n = ready(&t, "1", 1).await;
    let data: Vec<u8> = (0..16 * BS).map(|i| (i % 251) as u8).collect();
    let w = run(&t, &n, &rw10(0x2a, 10, 16), &data).await;
    assert_eq!(w.status, status::GOOD);
    for (want, blocks) in [(BS + 1, 2), (BS, 1), (0, 0), (64 * BS, 16)] {
        let mut c = cmd(0, &rw10(0x28, 10, 16), &[]);
        c.data_in_len_max = want as u32;
        let r = t.execute(&n, c).await;
        assert_eq!(r.status, status::GOOD);
        assert_eq!(r.data_in.len(), blocks * BS, "takes {want}");
        assert_eq!(&r.data_in[..], &data[..blocks * BS]);
        assert_eq!(r.transfer_len_bytes as usize, 16 * BS, "asked for");
    }
}

#[tokio::test]
async fn read_write_roundtrip_and_errors() {
    let t = target();
    let n = ready(&t, "1", 1).await;
    let data: Vec<u8> = (0..4 * BS).map(|i| (i % 251) as u8).collect();
    for (w, r) in [
        (rw10(0x2a, 10, 4).to_vec(), rw10(0x28, 10, 4).to_vec()),
        (rw16(0x8a, 20, 4).to_vec(), rw16(0x88, 20, 4).to_vec()),
    ] {
        let resp = run(&t, &n, &w, &data).await;
        assert_eq!(resp.status, status::GOOD);
        assert_eq!(resp.transfer_len_bytes as usize, data.len());
        let resp = run(&t, &n, &r, &[]).await;
        assert_eq!(resp.status, status::GOOD);
        assert_eq!(&resp.data_in[..], &data[..]);
    }
    // READ(6)/WRITE(6), length 0 means 256 blocks.
    let r = run(&t, &n, &[0x08, 0, 0, 10, 0, 0], &[]).await;
    assert_eq!(r.data_in.len(), 256 * BS);
    let r = run(&t, &n, &[0x0a, 0, 0, 30, 1, 0], &data[..BS]).await;
    assert_eq!(r.status, status::GOOD);
    // READ(12)/WRITE(12).
    let mut w12 = [0u8; 12];
    w12[0] = 0xaa;
    w12[5] = 40;
    w12[9] = 1;
    assert_eq!(run(&t, &n, &w12, &data[..BS]).await.status, status::GOOD);
    w12[0] = 0xa8;
    assert_eq!(&run(&t, &n, &w12, &[]).await.data_in[..], &data[..BS]);
    // Zero blocks: GOOD at the end, LBA OUT OF RANGE past it.
    assert_eq!(
        run(&t, &n, &rw10(0x28, BLOCKS as u32, 0), &[]).await.status,
        0
    );
    let r = run(&t, &n, &rw10(0x28, BLOCKS as u32 + 1, 0), &[]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x21, 0));
    let r = run(&t, &n, &rw16(0x88, u64::MAX, 2), &[]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x21, 0));
    let r = run(&t, &n, &rw10(0x2a, BLOCKS as u32 - 1, 2), &data[..2 * BS]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x21, 0));
    // RDPROTECT / WRPROTECT.
    let mut c = rw10(0x28, 0, 1);
    c[1] = 0x20;
    assert_eq!(sense_of(&run(&t, &n, &c, &[]).await), (ILLEGAL, 0x24, 0));
    // Over the maximum transfer length.
    let r = run(&t, &n, &rw16(0x88, 0, 1_000_000), &[]).await;
    assert!(matches!(sense_of(&r), (ILLEGAL, 0x21 | 0x24, 0)));
    // Short Data-Out (residual overflow): the blocks that arrived are written, the
    // CDB's transfer length is reported so the transport sets the overflow.
    let r = run(&t, &n, &rw10(0x2a, 100, 2), &[0xee; BS]).await;
    assert_eq!(r.status, status::GOOD);
    assert_eq!(r.transfer_len_bytes as usize, 2 * BS);
    let r = run(&t, &n, &rw10(0x28, 100, 2), &[]).await;
    assert!(r.data_in[..BS].iter().all(|&b| b == 0xee));
    assert!(r.data_in[BS..].iter().all(|&b| b == 0));
    // No Data-Out at all: nothing written, still GOOD.
    let r = run(&t, &n, &rw10(0x2a, 101, 1), &[]).await;
    assert_eq!(
        (r.status, r.transfer_len_bytes as usize),
        (status::GOOD, BS)
    );
    let r = run(&t, &n, &rw10(0x28, 101, 1), &[]).await;
    assert!(r.data_in.iter().all(|&b| b == 0));
    let _ = run(&t, &n, &rw10(0x2a, 100, 2), &[0u8; 2 * BS]).await;
    // Long Data-Out: only what the CDB asks is written.
    let r = run(&t, &n, &rw10(0x2a, 100, 1), &[0xee; 3 * BS]).await;
    assert_eq!((r.status, r.transfer_len_bytes as usize), (0, BS));
    let r = run(&t, &n, &rw10(0x28, 100, 2), &[]).await;
    assert!(r.data_in[..BS].iter().all(|&b| b == 0xee));
    assert!(r.data_in[BS..].iter().all(|&b| b == 0));
    // NACA in CONTROL.
    let mut c = rw10(0x28, 0, 1);
    c[9] = 0x04;
    assert_eq!(sense_of(&run(&t, &n, &c, &[]).await), (ILLEGAL, 0x24, 0));
    // Unknown opcode and a short CDB.
    assert_eq!(
        sense_of(&run(&t, &n, &[0x04, 0, 0, 0, 0, 0], &[]).await),
        (ILLEGAL, 0x20, 0)
    );
    assert_eq!(sense_of(&run(&t, &n, &[0x28, 0, 0], &[]).await).0, ILLEGAL);
    assert_eq!(sense_of(&run(&t, &n, &[], &[]).await), (ILLEGAL, 0x20, 0));
}

#[tokio::test]
async fn capacity_and_report_luns() {
    let t = target();
    let n = ready(&t, "1", 1).await;
    let r = run(&t, &n, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(&r.data_in[..], &[0, 0, 3, 0xff, 0, 0, 2, 0]);
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x10;
    c[13] = 32;
    let r = run(&t, &n, &c, &[]).await;
    assert_eq!(
        u64::from_be_bytes(r.data_in[0..8].try_into().unwrap()),
        BLOCKS - 1
    );
    assert_eq!(r.data_in[14] & 0xc0, 0xc0, "LBPME and LBPRZ on a thin LU");
    let r = run(&t, &n, &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0], &[]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x24, 0));
    let r = run(&t, &n, &[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]).await;
    assert_eq!(r.data_in.len(), 16);
    let r = run(&t, &n, &[0xa0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]).await;
    assert_eq!(r.data_in.len(), 8);
    let r = run(&t, &n, &[0xa0, 0, 7, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x24, 0));
}

#[tokio::test]
async fn mode_sense_and_select() {
    let t = target();
    let a = ready(&t, "1", 1).await;
    // All pages, current; 4-byte allocation gives 4 bytes.
    let r = run(&t, &a, &[0x1a, 0, 0x3f, 0, 255, 0], &[]).await;
    assert_eq!(r.status, status::GOOD);
    assert_eq!(r.data_in[0] as usize, r.data_in.len() - 1);
    assert_eq!(r.data_in[3], 8, "block descriptor");
    let r = run(&t, &a, &[0x1a, 0, 0x3f, 0, 4, 0], &[]).await;
    assert_eq!(r.data_in.len(), 4);
    // Saved values are not supported.
    let r = run(&t, &a, &[0x1a, 0, 0xc8, 0, 255, 0], &[]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x39, 0));
    // Changeable caching page shows WCE.
    let r = run(&t, &a, &[0x1a, 0x08, 0x48, 0, 255, 0], &[]).await;
    assert_eq!(&r.data_in[4..6], &[0x08, 18]);
    assert_eq!(r.data_in[6], 0x04);
    // MODE SENSE(10) with LLBAA gives a 16-byte descriptor.
    let r = run(&t, &a, &[0x5a, 0x10, 0x0a, 0, 0, 0, 0, 1, 0, 0], &[]).await;
    assert_eq!((r.data_in[4] & 1, r.data_in[7]), (1, 16));
    // Unknown page.
    let r = run(&t, &a, &[0x1a, 0, 0x33, 0, 255, 0], &[]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x24, 0));
    // SWP makes the LU write protected.
    let mut ms = vec![0u8; 4];
    ms.extend_from_slice(&[0x0a, 10, 0, 0x10, 0x08, 0, 0, 0, 0xff, 0xff, 0, 0]);
    assert_eq!(run(&t, &a, &[0x15, 0x10, 0, 0, 16, 0], &ms).await.status, 0);
    let r = run(&t, &a, &rw10(0x2a, 0, 1), &[0u8; BS]).await;
    assert_eq!(sense_of(&r), (key::DATA_PROTECT, 0x27, 0));
    let r = run(&t, &a, &[0x1a, 0, 0x0a, 0, 255, 0], &[]).await;
    assert_eq!(r.data_in[2] & 0x80, 0x80, "WP in the header");
    // Changing a non-changeable field (QErr) is refused.
    ms[4 + 3] = 0x12;
    let r = run(&t, &a, &[0x15, 0x10, 0, 0, 16, 0], &ms).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x26, 0));
    // SP=1 is refused; short parameter data too.
    let r = run(&t, &a, &[0x15, 0x11, 0, 0, 16, 0], &ms).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x24, 0));
    let r = run(&t, &a, &[0x15, 0x10, 0, 0, 16, 0], &ms[..8]).await;
    assert_eq!(sense_of(&r).0, ILLEGAL);
}

/// A volume over memory (with a volatile cache) that counts what reaches it:
/// writes with and without FUA, flushes, and writes in flight (the most at
/// once). With `yield_once` each write yields once before it lands, so it
/// waits as a disk's would; a write at or past `hang_from` never finishes, and
/// `entered` tells the test one started.
struct Counting {
    inner: MemVolume,
    fua_writes: AtomicU64,
    plain_writes: AtomicU64,
    flushes: AtomicU64,
    in_flight: AtomicU64,
    in_flight_max: AtomicU64,
    yield_once: bool,
    hang_from: u64,
    entered: tokio::sync::Notify,
    /// The most blocks one transfer may carry (the volume's `max_io_blocks`).
    max_io_blocks: u32,
}

impl Counting {
    fn new(blocks: u64) -> Counting {
        Counting {
            inner: MemVolume::new(BS as u32, blocks),
            fua_writes: AtomicU64::new(0),
            plain_writes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            in_flight_max: AtomicU64::new(0),
            yield_once: false,
            hang_from: u64::MAX,
            entered: tokio::sync::Notify::new(),
            max_io_blocks: u32::MAX,
        }
    }
}

#[async_trait]
impl Volume for Counting {
    fn geometry(&self) -> Geometry {
        let g = self.inner.geometry();
        Geometry {
            volatile_cache: true,
            max_io_blocks: g.max_io_blocks.min(self.max_io_blocks),
            ..g
        }
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        if fua {
            self.fua_writes.fetch_add(1, Ordering::Relaxed);
        } else {
            self.plain_writes.fetch_add(1, Ordering::Relaxed);
        }
        let n = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.in_flight_max.fetch_max(n, Ordering::SeqCst);
        if lba >= self.hang_from {
            self.entered.notify_one();
            std::future::pending::<()>().await;
        }
        if self.yield_once {
            tokio::task::yield_now().await;
        }
        let r = self.inner.write(lba, data, fua).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        r
    }
    async fn flush(&self) -> BlockResult<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.inner.discard(lba, blocks).await
    }
    async fn block_status(&self, lba: u64, blocks: u64) -> BlockResult<Vec<Extent>> {
        self.inner.block_status(lba, blocks).await
    }
}

#[tokio::test]
async fn wce_off_makes_writes_fua_and_sync_cache_flushes() {
    let vol = Arc::new(Counting::new(BLOCKS));
    let t = target_with(vol.clone());
    let n = ready(&t, "1", 1).await;
    assert_eq!(t.write_cache_enabled(0), Some(true));
    run(&t, &n, &rw10(0x2a, 0, 1), &[1u8; BS]).await;
    let mut fua = rw10(0x2a, 0, 1);
    fua[1] = 0x08;
    run(&t, &n, &fua, &[1u8; BS]).await;
    assert_eq!(vol.plain_writes.load(Ordering::Relaxed), 1);
    assert_eq!(vol.fua_writes.load(Ordering::Relaxed), 1);
    // SYNCHRONIZE CACHE flushes; out of range is refused.
    assert_eq!(run(&t, &n, &rw10(0x35, 0, 0), &[]).await.status, 0);
    assert_eq!(vol.flushes.load(Ordering::Relaxed), 1);
    let r = run(&t, &n, &rw16(0x91, BLOCKS, 1), &[]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x21, 0));
    // WCE=0 through MODE SELECT(10).
    let mut ms = vec![0u8; 8];
    let mut page = [0u8; 20];
    page[0] = 0x08;
    page[1] = 18;
    ms.extend_from_slice(&page);
    let r = run(&t, &n, &[0x55, 0x10, 0, 0, 0, 0, 0, 0, 28, 0], &ms).await;
    assert_eq!(r.status, status::GOOD);
    assert_eq!(t.write_cache_enabled(0), Some(false));
    run(&t, &n, &rw10(0x2a, 0, 1), &[2u8; BS]).await;
    run(&t, &n, &rw16(0x8a, 1, 1), &[2u8; BS]).await;
    assert_eq!(vol.plain_writes.load(Ordering::Relaxed), 1);
    assert_eq!(vol.fua_writes.load(Ordering::Relaxed), 3);
}

#[tokio::test]
async fn compare_and_write_and_miscompare_offset() {
    let t = target();
    let n = ready(&t, "1", 1).await;
    run(&t, &n, &rw10(0x2a, 5, 2), &[b'A'; 2 * BS]).await;
    let mut caw = [0u8; 16];
    caw[0] = 0x89;
    caw[9] = 5;
    caw[13] = 2;
    let mut data = vec![b'A'; 2 * BS];
    data.extend_from_slice(&[b'B'; 2 * BS]);
    let r = run(&t, &n, &caw, &data).await;
    assert_eq!(r.status, status::GOOD);
    assert!(run(&t, &n, &rw10(0x28, 5, 2), &[])
        .await
        .data_in
        .iter()
        .all(|&b| b == b'B'));
    // Miscompare at byte 700: nothing written, INFORMATION = 700.
    let mut data = vec![b'B'; 2 * BS];
    data[700] = b'x';
    data.extend_from_slice(&[b'C'; 2 * BS]);
    let r = run(&t, &n, &caw, &data).await;
    assert_eq!(sense_of(&r), (key::MISCOMPARE, 0x1d, 0));
    assert_eq!(info_of(&r), 700);
    assert!(run(&t, &n, &rw10(0x28, 5, 2), &[])
        .await
        .data_in
        .iter()
        .all(|&b| b == b'B'));
    // Data-Out of the wrong size either way.
    let r = run(&t, &n, &caw, &data[..3 * BS]).await;
    assert_eq!(sense_of(&r).0, ILLEGAL);
    let mut big = data.clone();
    big.extend_from_slice(&[0; BS]);
    assert_eq!(sense_of(&run(&t, &n, &caw, &big).await).0, ILLEGAL);
    // Beyond the end.
    caw[2..10].copy_from_slice(&(BLOCKS - 1).to_be_bytes());
    assert_eq!(
        sense_of(&run(&t, &n, &caw, &data).await),
        (ILLEGAL, 0x21, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compare_and_write_is_atomic_against_writers() {
    let t = Arc::new(target());
    let n = ready(&t, "1", 1).await;
    // Block 0 holds a counter; CAW increments it; plain writers hammer block 0 with
    // the value they read, which CAW's exclusion must never interleave with.
    run(&t, &n, &rw10(0x2a, 0, 1), &[0u8; BS]).await;
    let mut tasks = Vec::new();
    for w in 0..4u8 {
        let t = t.clone();
        let n = n.clone();
        tasks.push(tokio::spawn(async move {
            let mut ok = 0u32;
            for _ in 0..50 {
                let cur = run(&t, &n, &rw10(0x28, 0, 1), &[]).await.data_in;
                let v = u32::from_be_bytes(cur[..4].try_into().unwrap());
                let mut data = cur.to_vec();
                let mut next = cur.to_vec();
                next[..4].copy_from_slice(&(v + 1).to_be_bytes());
                next[4 + w as usize] = next[4 + w as usize].wrapping_add(1);
                data.extend_from_slice(&next);
                let mut caw = [0u8; 16];
                caw[0] = 0x89;
                caw[13] = 1;
                let r = run(&t, &n, &caw, &data).await;
                if r.status == status::GOOD {
                    ok += 1;
                } else {
                    assert_eq!(sense_of(&r).0, key::MISCOMPARE);
                }
                // a plain write elsewhere in the same LU
                run(&t, &n, &rw10(0x2a, 1 + w as u32, 1), &[w; BS]).await;
            }
            ok
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    let cur = run(&t, &n, &rw10(0x28, 0, 1), &[]).await.data_in;
    assert_eq!(u32::from_be_bytes(cur[..4].try_into().unwrap()), total);
    let per_writer: u32 = (0..4).map(|w| cur[4 + w] as u32).sum();
    assert_eq!(per_writer, total);
}

#[tokio::test]
async fn verify_write_verify_orwrite_prefetch() {
    let t = target();
    let n = ready(&t, "1", 1).await;
    let data = vec![7u8; 2 * BS];
    let mut wv = rw10(0x2e, 50, 2);
    wv[1] = 0x02;
    assert_eq!(run(&t, &n, &wv, &data).await.status, 0);
    let mut v = rw10(0x2f, 50, 2);
    v[1] = 0x02; // BYTCHK=1
    assert_eq!(run(&t, &n, &v, &data).await.status, 0);
    let mut bad = data.clone();
    bad[BS + 3] = 0;
    let r = run(&t, &n, &v, &bad).await;
    assert_eq!(sense_of(&r), (key::MISCOMPARE, 0x1d, 0));
    assert_eq!(info_of(&r) as usize, BS + 3);
    // BYTCHK=0 only reads; BYTCHK=3 compares one block against each.
    assert_eq!(run(&t, &n, &rw10(0x2f, 50, 2), &[]).await.status, 0);
    v[1] = 0x06;
    assert_eq!(run(&t, &n, &v, &data[..BS]).await.status, 0);
    v[1] = 0x04;
    assert_eq!(sense_of(&run(&t, &n, &v, &[]).await), (ILLEGAL, 0x24, 0));
    let mut v16 = rw16(0x8f, BLOCKS, 1);
    v16[1] = 0x02;
    assert_eq!(
        sense_of(&run(&t, &n, &v16, &[0; BS]).await),
        (ILLEGAL, 0x21, 0)
    );
    // ORWRITE.
    run(&t, &n, &rw10(0x2a, 60, 1), &[0x0f; BS]).await;
    assert_eq!(run(&t, &n, &rw16(0x8b, 60, 1), &[0xf0; BS]).await.status, 0);
    let r = run(&t, &n, &rw10(0x28, 60, 1), &[]).await;
    assert!(r.data_in.iter().all(|&b| b == 0xff));
    assert_eq!(run(&t, &n, &rw16(0x8b, 0, 0), &[]).await.status, 0);
    // PRE-FETCH.
    assert_eq!(run(&t, &n, &rw10(0x34, 0, 10), &[]).await.status, 0);
    let r = run(&t, &n, &rw16(0x90, BLOCKS, 1), &[]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x21, 0));
}

#[tokio::test]
async fn write_same_length_is_bounded_by_the_advertised_maximum() {
    // A volume larger than MAXIMUM WRITE SAME LENGTH (65535 blocks).
    let blocks = 70_000u64;
    let t = target_with(Arc::new(MemVolume::new(BS as u32, blocks)));
    let n = ready(&t, "1", 1).await;
    let vpd = [0x12, 0x01, 0xb0, 0, 64, 0];
    let r = run(&t, &n, &vpd, &[]).await;
    let advertised = u64::from_be_bytes(r.data_in[36..44].try_into().unwrap());
    assert_eq!(advertised, 0xffff);
    // Exactly the maximum runs; one block more is an invalid field, nothing written.
    let mut ws16 = rw16(0x93, 0, 0xffff);
    assert_eq!(run(&t, &n, &ws16, &[0x77; BS]).await.status, status::GOOD);
    let r = run(&t, &n, &rw10(0x28, 0xfffe, 2), &[]).await;
    assert!(r.data_in[..BS].iter().all(|&b| b == 0x77));
    assert!(r.data_in[BS..].iter().all(|&b| b == 0));
    ws16 = rw16(0x93, 0, 0x1_0000);
    assert_eq!(
        sense_of(&run(&t, &n, &ws16, &[0x55; BS]).await),
        (ILLEGAL, 0x24, 0)
    );
    let r = run(&t, &n, &rw10(0x28, 0, 1), &[]).await;
    assert!(r.data_in.iter().all(|&b| b == 0x77));
    // A zero length means "to the end of the medium", within the same maximum.
    ws16 = rw16(0x93, blocks - 0x1_0000, 0);
    assert_eq!(
        sense_of(&run(&t, &n, &ws16, &[0x66; BS]).await),
        (ILLEGAL, 0x24, 0)
    );
    ws16 = rw16(0x93, blocks - 0xffff, 0);
    assert_eq!(run(&t, &n, &ws16, &[0x66; BS]).await.status, status::GOOD);
    let r = run(&t, &n, &rw10(0x28, (blocks - 1) as u32, 1), &[]).await;
    assert!(r.data_in.iter().all(|&b| b == 0x66));
}

#[tokio::test]
async fn write_same_unmap_and_lba_status() {
    let t = target();
    let n = ready(&t, "1", 1).await;
    // WRITE SAME(10) of a pattern.
    let r = run(&t, &n, &rw10(0x41, 0, 200), &[0x5a; BS]).await;
    assert_eq!(r.status, status::GOOD);
    let r = run(&t, &n, &rw10(0x28, 0, 200), &[]).await;
    assert!(r.data_in.iter().all(|&b| b == 0x5a));
    // Wrong Data-Out sizes, ANCHOR, beyond the end.
    assert_eq!(
        sense_of(&run(&t, &n, &rw10(0x41, 0, 1), &[0; BS / 2]).await).0,
        ILLEGAL
    );
    assert_eq!(
        sense_of(&run(&t, &n, &rw10(0x41, 0, 1), &[0; 2 * BS]).await).0,
        ILLEGAL
    );
    let mut ws = rw10(0x41, 0, 1);
    ws[1] = 0x10;
    assert_eq!(
        sense_of(&run(&t, &n, &ws, &[0; BS]).await),
        (ILLEGAL, 0x24, 0)
    );
    let r = run(&t, &n, &rw16(0x93, BLOCKS + 1, 0), &[0; BS]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x21, 0));
    // WRITE SAME(16) UNMAP of zeroes deallocates; GET LBA STATUS shows it.
    let mut ws16 = rw16(0x93, 0, 128);
    ws16[1] = 0x08;
    assert_eq!(run(&t, &n, &ws16, &[0; BS]).await.status, 0);
    let mut gls = [0u8; 16];
    gls[0] = 0x9e;
    gls[1] = 0x12;
    gls[13] = 64;
    let r = run(&t, &n, &gls, &[]).await;
    assert_eq!(r.status, status::GOOD);
    assert_eq!(u64::from_be_bytes(r.data_in[8..16].try_into().unwrap()), 0);
    assert_eq!(r.data_in[20], 1, "deallocated");
    gls[2..10].copy_from_slice(&128u64.to_be_bytes());
    let r = run(&t, &n, &gls, &[]).await;
    assert_eq!(r.data_in[20], 0, "mapped");
    gls[2..10].copy_from_slice(&BLOCKS.to_be_bytes());
    assert_eq!(sense_of(&run(&t, &n, &gls, &[]).await), (ILLEGAL, 0x21, 0));
    // NDOB writes zeroes without Data-Out.
    let mut ndob = rw16(0x93, 128, 8);
    ndob[1] = 0x01;
    assert_eq!(run(&t, &n, &ndob, &[]).await.status, 0);
    // UNMAP: two descriptors, then the checks.
    let mut p = vec![0u8; 8];
    p[3] = 32;
    for (lba, nb) in [(128u64, 64u32), (300, 4)] {
        p.extend_from_slice(&lba.to_be_bytes());
        p.extend_from_slice(&nb.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
    }
    p[1] = (p.len() - 2) as u8;
    let unmap = [0x42, 0, 0, 0, 0, 0, 0, 0, p.len() as u8, 0];
    assert_eq!(run(&t, &n, &unmap, &p).await.status, 0);
    let r = run(&t, &n, &rw10(0x28, 128, 64), &[]).await;
    assert!(r.data_in.iter().all(|&b| b == 0));
    let mut anchor = unmap;
    anchor[1] = 1;
    assert_eq!(
        sense_of(&run(&t, &n, &anchor, &p).await),
        (ILLEGAL, 0x24, 0)
    );
    let mut oob = p.clone();
    oob[8..16].copy_from_slice(&BLOCKS.to_be_bytes());
    assert_eq!(
        sense_of(&run(&t, &n, &unmap, &oob).await),
        (ILLEGAL, 0x21, 0)
    );
    assert_eq!(
        sense_of(&run(&t, &n, &[0x42, 0, 0, 0, 0, 0, 0, 0, 4, 0], &p).await),
        (ILLEGAL, 0x1a, 0)
    );
    assert_eq!(
        run(&t, &n, &[0x42, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[])
            .await
            .status,
        0
    );
}

#[tokio::test]
async fn report_opcodes_tmfs_and_port_groups() {
    let t = target();
    let n = ready(&t, "1", 1).await;
    let r = run(&t, &n, &[0xa3, 0x0c, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0], &[]).await;
    assert_eq!(r.status, status::GOOD);
    let len = u32::from_be_bytes(r.data_in[..4].try_into().unwrap()) as usize;
    assert_eq!(len + 4, r.data_in.len());
    let descs: Vec<&[u8]> = r.data_in[4..].chunks(8).collect();
    assert!(descs.iter().any(|d| d[0] == 0x89));
    // Every listed command answers the one-command form.
    for d in descs {
        let servactv = d[5] & 1 != 0;
        let mut c = [
            0xa3,
            0x0c,
            if servactv { 2 } else { 1 },
            d[0],
            d[2],
            d[3],
            0,
            0,
            1,
            0,
            0,
            0,
        ];
        let r = run(&t, &n, &c, &[]).await;
        assert_eq!(r.status, status::GOOD, "opcode {:#x}", d[0]);
        assert_eq!((r.data_in[1] & 7, r.data_in[4]), (3, d[0]));
        c[2] = if servactv { 1 } else { 2 };
        assert_eq!(sense_of(&run(&t, &n, &c, &[]).await), (ILLEGAL, 0x24, 0));
    }
    // RCTD adds 12-byte timeouts descriptors.
    let r = run(
        &t,
        &n,
        &[0xa3, 0x0c, 0x80, 0, 0, 0, 0, 0, 0x10, 0, 0, 0],
        &[],
    )
    .await;
    assert_eq!(r.data_in[4 + 5] & 2, 2);
    assert_eq!((r.data_in.len() - 4) % 20, 0);
    // TMFs.
    let r = run(&t, &n, &[0xa3, 0x0d, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0], &[]).await;
    assert_eq!(r.data_in[0] & 0x08, 0x08);
    // RTPG: two groups, length-only header then extended.
    let r = run(&t, &n, &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]).await;
    assert_eq!(r.data_in.len(), 4 + 2 * 12);
    assert_eq!(r.data_in[4] & 0x0f, 0);
    assert_eq!(r.data_in[16] & 0x0f, 1);
    let r = run(&t, &n, &[0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]).await;
    assert_eq!((r.data_in.len(), r.data_in[4]), (8 + 2 * 12, 0x10));
    let r = run(&t, &n, &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0], &[]).await;
    assert_eq!(u32::from_be_bytes(r.data_in[..4].try_into().unwrap()), 24);
}

#[tokio::test]
async fn alua_standby_and_state_change_ua() {
    let t = target();
    let n1 = ready(&t, "1", 1).await;
    let n2 = ready(&t, "1", 2).await;
    assert!(t.set_port_group_state(2, AluaState::Standby));
    assert!(!t.set_port_group_state(42, AluaState::Standby));
    // Both nexuses see ASYMMETRIC ACCESS STATE CHANGED once.
    for n in [&n1, &n2] {
        let r = run(&t, n, &rw10(0x28, 0, 1), &[]).await;
        assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x2a, 0x06));
    }
    assert_eq!(run(&t, &n1, &rw10(0x28, 0, 1), &[]).await.status, 0);
    let r = run(&t, &n2, &rw10(0x28, 0, 1), &[]).await;
    assert_eq!(sense_of(&r), (key::NOT_READY, 0x04, 0x0b));
    assert_eq!(run(&t, &n2, &[0x12, 0, 0, 0, 36, 0], &[]).await.status, 0);
    let r = run(&t, &n2, &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]).await;
    assert_eq!(r.data_in[16] & 0x0f, 2);
    assert_eq!(t.port_groups()[1].state, AluaState::Standby);
    t.set_port_group_state(2, AluaState::Unavailable);
    run(&t, &n2, &[0x03, 0, 0, 0, 18, 0], &[]).await; // consume the UA
    let r = run(&t, &n2, &[0x1a, 0, 0x3f, 0, 255, 0], &[]).await;
    assert_eq!(sense_of(&r), (key::NOT_READY, 0x04, 0x0c));
}

#[tokio::test]
async fn volume_errors_map_to_sense() {
    let mem: VolumeRef = Arc::new(MemVolume::new(BS as u32, BLOCKS));
    let fault = Arc::new(FaultVolume::new(mem));
    let plan = fault.plan();
    let t = target_with(fault);
    let n = ready(&t, "1", 1).await;
    plan.lock().bad_read_blocks.push(10..12);
    let r = run(&t, &n, &rw10(0x28, 8, 4), &[]).await;
    assert_eq!(sense_of(&r), (key::MEDIUM_ERROR, 0x11, 0));
    assert_eq!(info_of(&r), 10);
    plan.lock().bad_write_blocks.push(20..21);
    let r = run(&t, &n, &rw10(0x2a, 20, 1), &[1; BS]).await;
    assert_eq!(sense_of(&r), (key::MEDIUM_ERROR, 0x0c, 0));
    plan.lock().dead = true;
    let r = run(&t, &n, &rw10(0x28, 0, 1), &[]).await;
    assert_eq!(sense_of(&r), (key::HARDWARE_ERROR, 0x44, 0));
    let r = run(&t, &n, &rw10(0x35, 0, 0), &[]).await;
    assert_eq!(sense_of(&r), (key::HARDWARE_ERROR, 0x44, 0));
}

#[tokio::test]
async fn start_stop_and_prevent_allow() {
    let t = target();
    let a = ready(&t, "1", 1).await;
    let b = ready(&t, "2", 1).await;
    // Stop: media access answers NOT READY, INQUIRY still works; start again.
    assert_eq!(run(&t, &a, &[0x1b, 0, 0, 0, 0, 0], &[]).await.status, 0);
    let r = run(&t, &b, &rw10(0x28, 0, 1), &[]).await;
    assert_eq!(sense_of(&r), (key::NOT_READY, 0x04, 0x02));
    assert_eq!(sense_of(&run(&t, &b, &[0; 6], &[]).await).0, key::NOT_READY);
    assert_eq!(run(&t, &b, &[0x12, 0, 0, 0, 36, 0], &[]).await.status, 0);
    assert_eq!(run(&t, &a, &[0x1b, 0, 0, 0, 1, 0], &[]).await.status, 0);
    assert_eq!(run(&t, &b, &[0; 6], &[]).await.status, 0);
    // PREVENT from a blocks LOEJ from b until a allows or goes away.
    assert_eq!(run(&t, &a, &[0x1e, 0, 0, 0, 1, 0], &[]).await.status, 0);
    let r = run(&t, &b, &[0x1b, 0, 0, 0, 0x02, 0], &[]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x53, 0x02));
    t.nexus_lost(&a).await;
    assert_eq!(run(&t, &b, &[0x1b, 0, 0, 0, 0x03, 0], &[]).await.status, 0);
}

#[tokio::test]
async fn capacity_change_raises_ua() {
    struct Growing {
        inner: MemVolume,
        blocks: AtomicU64,
    }
    #[async_trait]
    impl Volume for Growing {
        fn geometry(&self) -> Geometry {
            Geometry {
                block_count: self.blocks.load(Ordering::Relaxed),
                ..self.inner.geometry()
            }
        }
        async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
            self.inner.read(lba, blocks).await
        }
        async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
            self.inner.write(lba, data, fua).await
        }
        async fn flush(&self) -> BlockResult<()> {
            Ok(())
        }
        async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
            self.inner.discard(lba, blocks).await
        }
    }
    let vol = Arc::new(Growing {
        inner: MemVolume::new(BS as u32, 2 * BLOCKS),
        blocks: AtomicU64::new(BLOCKS),
    });
    let t = target_with(vol.clone());
    let n = ready(&t, "1", 1).await;
    vol.blocks.store(2 * BLOCKS, Ordering::Relaxed);
    let r = run(&t, &n, &[0; 6], &[]).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x2a, 0x09));
    assert_eq!(run(&t, &n, &[0; 6], &[]).await.status, 0);
}

/// A forced shrink waits for the writes in flight: one that passed its range
/// check before the shrink ends (answered GOOD), then the volume shrinks, and
/// no write lands past the new end. Before (review of 2026-12-06) the volume
/// shrank under it (on a file, the write then extended it again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shrink_waits_for_the_writes_in_flight() {
    let held = Arc::new(block::HoldVolume::new(Arc::new(MemVolume::new(
        BS as u32, BLOCKS,
    ))));
    held.writes.hold();
    let t = Arc::new(target_with(held.clone()));
    let n = ready(&t, "1", 1).await;
    let last = (BLOCKS - 8) as u32;
    let write = {
        let (t, n) = (t.clone(), n.clone());
        tokio::spawn(async move {
            let cdb = [
                0x2a,
                0,
                (last >> 24) as u8,
                (last >> 16) as u8,
                (last >> 8) as u8,
                last as u8,
                0,
                0,
                8,
                0,
            ];
            run(&t, &n, &cdb, &vec![7u8; 8 * BS]).await
        })
    };
    held.writes.arrivals(1).await;
    let shrink = {
        let t = t.clone();
        tokio::spawn(async move { t.shrink_lun(0, BLOCKS / 2).await })
    };
    held.writes.open();
    // shrunk first, the write would have met the smaller volume
    let w = write.await.unwrap();
    assert_eq!(
        w.status,
        0,
        "shrunk under a write in flight: {:?}",
        sense_of(&w)
    );
    shrink.await.unwrap().unwrap();
    assert_eq!(held.geometry().block_count, BLOCKS / 2);
}

#[tokio::test]
async fn read_only_lun_refuses_writes() {
    let mut cfg = lun_config();
    cfg.read_only = true;
    let t = ScsiTarget::new(TargetConfig {
        name: "iqn.t".into(),
        ports: vec![],
        port_groups: vec![],
        luns: vec![(0, cfg, Arc::new(MemVolume::new(BS as u32, BLOCKS)))],
    })
    .unwrap();
    let n = ready(&t, "1", 1).await;
    for c in [
        rw10(0x2a, 0, 1).to_vec(),
        rw16(0x8a, 0, 1).to_vec(),
        rw10(0x41, 0, 1).to_vec(),
    ] {
        let r = run(&t, &n, &c, &[0; BS]).await;
        assert_eq!(sense_of(&r), (key::DATA_PROTECT, 0x27, 0));
    }
    assert_eq!(run(&t, &n, &rw10(0x28, 0, 1), &[]).await.status, 0);
}

#[test]
fn bad_configurations_are_refused() {
    let vol: VolumeRef = Arc::new(MemVolume::new(BS as u32, BLOCKS));
    let r = ScsiTarget::new(TargetConfig {
        name: "iqn.t".into(),
        ports: vec![],
        port_groups: vec![],
        luns: vec![(0, lun_config(), vol.clone()), (0, lun_config(), vol)],
    });
    assert!(matches!(r, Err(ScsiError::Config(_))));
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
        /// Arbitrary CDBs and Data-Out never panic and always give a sane answer.
        #[test]
        fn random_cdbs_never_panic(
            opcode in prop::sample::select(vec![
                0x00u8, 0x03, 0x08, 0x0a, 0x12, 0x15, 0x16, 0x17, 0x1a, 0x1b, 0x1e, 0x25, 0x28,
                0x2a, 0x2e, 0x2f, 0x34, 0x35, 0x41, 0x42, 0x55, 0x56, 0x57, 0x5a, 0x5e, 0x5f,
                0x88, 0x89, 0x8a, 0x8b, 0x8e, 0x8f, 0x90, 0x91, 0x93, 0x9e, 0xa0, 0xa3, 0xa4, 0xa8,
                0xaa, 0xae, 0xaf, 0x7f, 0xff, 0x04, 0x83, 0x84,
            ]),
            rest in prop::collection::vec(any::<u8>(), 0..20),
            data in prop::collection::vec(any::<u8>(), 0..2048),
            lun in 0u64..2,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let t = ScsiTarget::new(TargetConfig {
                name: "iqn.t".into(),
                ports: vec![],
                port_groups: vec![],
                luns: vec![(0, lun_config(), Arc::new(MemVolume::new(512, 64)))],
            }).unwrap();
            let n = nexus("1", 1);
            let mut cdb = vec![opcode];
            cdb.extend_from_slice(&rest);
            rt.block_on(async {
                for _ in 0..2 {
                    let r = t.execute(&n, Command {
                        cdb: Bytes::from(cdb.clone()),
                        lun,
                        data_out: Bytes::from(data.clone()),
                        data_in_len_max: 4096,
                        attr: TaskAttr::Simple,
                    }).await;
                    prop_assert!(matches!(r.status, 0x00 | 0x02 | 0x18));
                    prop_assert_eq!(r.status == 0x02, r.sense.is_some());
                }
                Ok(())
            })?;
        }
    }
}

#[tokio::test]
async fn luns_added_and_removed_while_serving() {
    let t = target();
    let n = ready(&t, "1", 1).await;
    let report = [0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    // LUN 3 does not exist yet
    let r = t.execute(&n, cmd(3, &[0, 0, 0, 0, 0, 0], &[])).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x25, 0));
    let vol3: VolumeRef = Arc::new(MemVolume::new(BS as u32, 64));
    t.add_lun(3, lun_config(), vol3.clone(), None).unwrap();
    assert!(
        t.add_lun(3, lun_config(), vol3, None).is_err(),
        "a LUN twice"
    );
    assert_eq!(t.lun_ids(), vec![0, 3]);
    // the nexus of LUN 0 is told the inventory changed, then sees both LUNs
    let r = run(&t, &n, &[0, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x3f, 0x0e));
    let r = run(&t, &n, &report, &[]).await;
    assert_eq!(&r.data_in[..4], &[0, 0, 0, 16]);
    assert_eq!(r.data_in[8 + 8 + 1], 3);
    // the new LUN serves I/O (after its own POWER ON attention)
    let r = t.execute(&n, cmd(3, &[0, 0, 0, 0, 0, 0], &[])).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x29, 0));
    let data = vec![0x5a; BS];
    let r = t.execute(&n, cmd(3, &rw10(0x2a, 63, 1), &data)).await;
    assert_eq!(r.status, status::GOOD);
    let r = t.execute(&n, cmd(3, &rw10(0x28, 63, 1), &[])).await;
    assert_eq!(&r.data_in[..], &data[..]);
    // removed: gone from the inventory, commands to it are refused
    assert!(t.remove_lun(3).await.is_some());
    assert!(t.remove_lun(3).await.is_none());
    let r = t.execute(&n, cmd(3, &rw10(0x28, 63, 1), &[])).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x25, 0));
    let r = run(&t, &n, &[0, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x3f, 0x0e));
    let r = run(&t, &n, &report, &[]).await;
    assert_eq!(&r.data_in[..4], &[0, 0, 0, 8]);
}

#[tokio::test]
async fn alua_state_per_logical_unit() {
    let t = target();
    let n2 = ready(&t, "1", 2).await;
    t.add_lun(
        1,
        lun_config(),
        Arc::new(MemVolume::new(BS as u32, 64)),
        None,
    )
    .unwrap();
    let at = |lun: u64, cdb: &[u8]| t.execute(&n2, cmd(lun, cdb, &[]));
    // LUN 0's nexus learns about LUN 1; LUN 1 starts with POWER ON
    assert_eq!(sense_of(&at(0, &rw10(0x28, 0, 1)).await).1, 0x3f);
    assert_eq!(sense_of(&at(1, &rw10(0x28, 0, 1)).await).1, 0x29);
    // group 2 goes standby for LUN 1 only
    assert!(t.set_lun_port_group_state(1, 2, AluaState::Standby));
    assert!(!t.set_lun_port_group_state(1, 42, AluaState::Standby));
    assert!(!t.set_lun_port_group_state(9, 2, AluaState::Standby));
    assert_eq!(
        at(0, &rw10(0x28, 0, 1)).await.status,
        0,
        "LUN 0 keeps serving"
    );
    let r = at(1, &rw10(0x28, 0, 1)).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x2a, 0x06));
    let r = at(1, &rw10(0x28, 0, 1)).await;
    assert_eq!(sense_of(&r), (key::NOT_READY, 0x04, 0x0b));
    // each LU reports its own states
    let rtpg = [0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    assert_eq!(at(1, &rtpg).await.data_in[16] & 0x0f, 2);
    assert_eq!(at(0, &rtpg).await.data_in[16] & 0x0f, 1);
    assert_eq!(t.lun_port_groups(1).unwrap()[1].state, AluaState::Standby);
    assert_eq!(t.port_groups()[1].state, AluaState::ActiveNonOptimized);
    // the same state again raises no new attention
    assert!(t.set_lun_port_group_state(1, 2, AluaState::Standby));
    let r = at(1, &rw10(0x28, 0, 1)).await;
    assert_eq!(sense_of(&r), (key::NOT_READY, 0x04, 0x0b));
    // a target-wide change reaches every LU
    assert!(t.set_port_group_state(2, AluaState::ActiveOptimized));
    assert_eq!(sense_of(&at(1, &rw10(0x28, 0, 1)).await).1, 0x2a);
    assert_eq!(at(1, &rw10(0x28, 0, 1)).await.status, 0);
}

/// An EXTENDED COPY (LID1) parameter list: one identification CSCD per NAA, then
/// block-to-block segments (src index, dst index, blocks, src lba, dst lba).
fn xcopy_params(
    list_id: u8,
    usage: u8,
    naas: &[[u8; 16]],
    segs: &[(u16, u16, u16, u64, u64)],
) -> Vec<u8> {
    let mut c = Vec::new();
    for naa in naas {
        let mut d = [0u8; 32];
        d[0] = 0xe4;
        d[4] = 0x01;
        d[5] = 0x03;
        d[7] = 16;
        d[8..24].copy_from_slice(naa);
        d[30] = (BS >> 8) as u8;
        c.extend_from_slice(&d);
    }
    let mut s = Vec::new();
    for &(src, dst, blocks, src_lba, dst_lba) in segs {
        let mut d = [0u8; 28];
        d[0] = 0x02;
        d[3] = 24;
        d[4..6].copy_from_slice(&src.to_be_bytes());
        d[6..8].copy_from_slice(&dst.to_be_bytes());
        d[10..12].copy_from_slice(&blocks.to_be_bytes());
        d[12..20].copy_from_slice(&src_lba.to_be_bytes());
        d[20..28].copy_from_slice(&dst_lba.to_be_bytes());
        s.extend_from_slice(&d);
    }
    let mut p = vec![0u8; 16];
    p[0] = list_id;
    p[1] = usage << 3;
    p[2..4].copy_from_slice(&(c.len() as u16).to_be_bytes());
    p[8..12].copy_from_slice(&(s.len() as u32).to_be_bytes());
    p.extend_from_slice(&c);
    p.extend_from_slice(&s);
    p
}

fn xcopy_cdb(len: usize) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x83;
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}

fn copy_status_cdb(list_id: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x84;
    c[2] = list_id;
    c[13] = 255;
    c
}

/// Adds a second memory LUN (1) of its own NAA to `t`; returns its configuration.
fn add_second_lun(t: &ScsiTarget) -> LunConfig {
    let mut cfg1 = lun_config();
    cfg1.naa[15] = 0xee;
    t.add_lun(
        1,
        cfg1.clone(),
        Arc::new(MemVolume::new(BS as u32, BLOCKS)),
        None,
    )
    .unwrap();
    cfg1
}

/// The test target with a second memory LUN (1) of its own NAA; returns that
/// LUN's configuration too.
fn target_with_two_luns() -> (ScsiTarget, LunConfig) {
    let t = target();
    let cfg1 = add_second_lun(&t);
    (t, cfg1)
}

/// A copy goes one chunk at a time while the destination completes writes at
/// once, and keeps `CHUNKS_IN_FLIGHT` writes in flight once they wait; either
/// way every block arrives.
#[tokio::test]
async fn a_copy_keeps_several_writes_in_flight_only_when_they_wait() {
    const BIG: u64 = 8 * 2048; // 8 MiB: eight chunks
    for wait in [false, true] {
        let t = target_with(Arc::new(MemVolume::new(BS as u32, BIG)));
        let dst = Arc::new(Counting {
            yield_once: wait,
            ..Counting::new(BIG)
        });
        let mut cfg1 = lun_config();
        cfg1.naa[15] = 0xee;
        t.add_lun(1, cfg1.clone(), dst.clone(), None).unwrap();
        let n = ready(&t, "1", 1).await;
        let _ = t.execute(&n, cmd(1, &[0; 6], &[])).await;
        let pattern: Vec<u8> = (0..BIG as usize * BS)
            .map(|i| (i / BS) as u8 ^ 0x3c)
            .collect();
        let w = t
            .execute(&n, cmd(0, &rw16(0x8a, 0, BIG as u32), &pattern))
            .await;
        assert_eq!(w.status, 0);
        let p = xcopy_params(
            1,
            0,
            &[lun_config().naa, cfg1.naa],
            &[(0, 1, BIG as u16, 0, 0)],
        );
        let r = run(&t, &n, &xcopy_cdb(p.len()), &p).await;
        assert_eq!(r.status, status::GOOD, "{r:?}");
        let r = t.execute(&n, cmd(1, &rw16(0x88, 0, BIG as u32), &[])).await;
        assert!(
            r.data_in[..] == pattern[..],
            "wait {wait}: the copy differs"
        );
        let max = dst.in_flight_max.load(Ordering::SeqCst);
        let want = if wait {
            crate::copy::CHUNKS_IN_FLIGHT as u64
        } else {
            1
        };
        assert_eq!(max, want, "wait {wait}: most writes in flight");
    }
}

/// A target whose LUN 0 holds every write (until `held.writes.open()`), a
/// second LUN, and two initiators ready: "iqn.test" and "iqn.second".
async fn held_copy_target() -> (
    Arc<block::HoldVolume>,
    Arc<ScsiTarget>,
    LunConfig,
    ItNexus,
    ItNexus,
) {
    let held = Arc::new(block::HoldVolume::new(Arc::new(MemVolume::new(
        BS as u32, BLOCKS,
    ))));
    held.writes.hold();
    let t = target_with(held.clone());
    let cfg1 = add_second_lun(&t);
    let t = Arc::new(t);
    let n = ready(&t, "1", 1).await;
    let m = ready_as(&t, "iqn.second").await;
    (held, t, cfg1, n, m)
}

/// A copy waiting for one of the target's copy slots already holds its list
/// identifier: the same identifier sent again meanwhile is OPERATION IN
/// PROGRESS at once, not a second copy queued behind the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_id_waiting_for_a_copy_slot_is_in_progress() {
    let (held, t, cfg1, n, m) = held_copy_target().await;
    let naa0 = lun_config().naa;
    // every slot taken by a copy onto LUN 0, each stopped at its first write
    // (half of them by each initiator: one holds at most half)
    let running: Vec<_> = (0..crate::copy::CONCURRENT_MAX)
        .map(|i| {
            let who = if i % 2 == 0 { &n } else { &m };
            let (t, n) = (t.clone(), who.clone());
            let p = xcopy_params(
                i as u8,
                0,
                &[cfg1.naa, naa0],
                &[(0, 1, 8, 0, u64::from(i) * 8)],
            );
            tokio::spawn(async move { t.execute(&n, cmd(0, &xcopy_cdb(p.len()), &p)).await })
        })
        .collect();
    held.writes
        .arrivals(usize::from(crate::copy::CONCURRENT_MAX))
        .await;
    // one more waits for a slot, under list 100
    let p = xcopy_params(100, 0, &[cfg1.naa, naa0], &[(0, 1, 8, 0, 200)]);
    let mut waiting = Box::pin(t.execute(&n, cmd(0, &xcopy_cdb(p.len()), &p)));
    assert!(
        block::poll_now(&mut waiting).is_none(),
        "it waits for a slot"
    );
    // list 100 again: answered at once
    let mut again = Box::pin(t.execute(&n, cmd(0, &xcopy_cdb(p.len()), &p)));
    let r = block::poll_now(&mut again).expect("answered without waiting for a slot");
    assert_eq!(sense_of(&r), (ILLEGAL, 0x00, 0x16));
    held.writes.open();
    for r in running {
        assert_eq!(r.await.unwrap().status, status::GOOD);
    }
    assert_eq!(waiting.await.status, status::GOOD);
}

/// One initiator runs at most half of a target's copies at once: with its
/// share running, its next copy waits while another initiator's starts at
/// once. (Before, one host's copies could hold every slot, and the others'
/// waited behind them until their hosts gave up and copied through
/// themselves.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_initiator_runs_at_most_half_the_copies() {
    let (held, t, cfg1, n, m) = held_copy_target().await;
    let naa0 = lun_config().naa;
    let share = crate::copy::CONCURRENT_PER_INITIATOR_MAX;
    assert!(share < crate::copy::CONCURRENT_MAX);
    let copy = |who: &ItNexus, list: u8, at: u64| {
        let (t, who) = (t.clone(), who.clone());
        let p = xcopy_params(list, 0, &[cfg1.naa, naa0], &[(0, 1, 8, 0, at)]);
        tokio::spawn(async move { t.execute(&who, cmd(0, &xcopy_cdb(p.len()), &p)).await })
    };
    let mut running: Vec<_> = (0..share)
        .map(|i| copy(&n, i as u8, u64::from(i) * 8))
        .collect();
    held.writes.arrivals(usize::from(share)).await;
    // n's next waits for its share, though the target has free slots
    let p = xcopy_params(50, 0, &[cfg1.naa, naa0], &[(0, 1, 8, 0, 400)]);
    let mut waiting = Box::pin(t.execute(&n, cmd(0, &xcopy_cdb(p.len()), &p)));
    assert!(
        block::poll_now(&mut waiting).is_none(),
        "n's extra copy waits"
    );
    // m's copy starts at once: it reaches its first write
    running.push(copy(&m, 60, 600));
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        held.writes.arrivals(usize::from(share) + 1),
    )
    .await
    .expect("another initiator's copy waited behind the first one's share");
    assert!(
        block::poll_now(&mut waiting).is_none(),
        "n's extra copy still waits"
    );
    held.writes.open();
    for r in running {
        assert_eq!(r.await.unwrap().status, status::GOOD);
    }
    assert_eq!(waiting.await.status, status::GOOD);
}

/// An aborted EXTENDED COPY's writes under way end before the transport may
/// answer the abort: the copy's in-flight token lives until they have, and
/// they land (a disk, cache or replica does not take back what it was handed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_copy_holds_its_in_flight_token_until_its_writes_end() {
    let mem = Arc::new(MemVolume::new(BS as u32, BLOCKS));
    let held = Arc::new(block::HoldVolume::new(mem.clone()));
    let t = target_with(held.clone());
    let cfg1 = add_second_lun(&t);
    let t = Arc::new(t);
    let n = ready(&t, "1", 1).await;
    let _ = t.execute(&n, cmd(1, &[0; 6], &[])).await;
    let data: Vec<u8> = (0..8 * BS).map(|i| (i % 251) as u8).collect();
    let w = t.execute(&n, cmd(1, &rw10(0x2a, 0, 8), &data)).await;
    assert_eq!(w.status, status::GOOD);
    held.writes.hold();
    let token: crate::InFlight = Arc::new(());
    let weak = Arc::downgrade(&token);
    let p = xcopy_params(1, 0, &[cfg1.naa, lun_config().naa], &[(0, 1, 8, 0, 16)]);
    let copy = {
        let (t, n) = (t.clone(), n.clone());
        tokio::spawn(crate::in_flight(token, async move {
            t.execute(&n, cmd(0, &xcopy_cdb(p.len()), &p)).await
        }))
    };
    held.writes.arrivals(1).await;
    copy.abort();
    assert!(copy.await.unwrap_err().is_cancelled());
    assert!(
        weak.upgrade().is_some(),
        "the abort could be answered while the copy's write was under way"
    );
    held.writes.open();
    // the token goes once the write has ended (bounded)
    for _ in 0..500 {
        if weak.upgrade().is_none() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(weak.upgrade().is_none(), "the copy's write never ended");
    assert_eq!(mem.read(16, 8).await.unwrap()[..], data[..]);
}

#[tokio::test]
async fn extended_copy_between_luns_and_within_one() {
    let (t, cfg1) = target_with_two_luns();
    let n = ready(&t, "1", 1).await;
    // LUN 1 reports REPORTED LUNS DATA HAS CHANGED to this nexus only if it knew it;
    // clear whatever it has.
    let _ = t.execute(&n, cmd(1, &[0, 0, 0, 0, 0, 0], &[])).await;
    let naa0 = lun_config().naa;
    // No copy yet: COPY STATUS of list 5 is an invalid field.
    let r = run(&t, &n, &copy_status_cdb(5), &[]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x24, 0));
    // A pattern on LUN 0, copied to LUN 1 (held status, list 5).
    let pattern: Vec<u8> = (0..100 * BS).map(|i| (i / BS) as u8 ^ 0x5a).collect();
    assert_eq!(run(&t, &n, &rw10(0x2a, 10, 100), &pattern).await.status, 0);
    let p = xcopy_params(5, 0, &[naa0, cfg1.naa], &[(0, 1, 100, 10, 500)]);
    let r = run(&t, &n, &xcopy_cdb(p.len()), &p).await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
    let r = t.execute(&n, cmd(1, &rw10(0x28, 500, 100), &[])).await;
    assert_eq!(&r.data_in[..], &pattern[..]);
    let r = run(&t, &n, &copy_status_cdb(5), &[]).await;
    assert_eq!(r.status, status::GOOD);
    assert_eq!(r.data_in[4], 0x01, "completed without errors");
    assert_eq!(u16::from_be_bytes([r.data_in[5], r.data_in[6]]), 1);
    assert_eq!(r.data_in[7], 0, "bytes");
    assert_eq!(
        u32::from_be_bytes(r.data_in[8..12].try_into().unwrap()),
        (100 * BS) as u32
    );
    // Overlapping forward copy on one LU behaves as memmove.
    let p = xcopy_params(6, 2, &[naa0], &[(0, 0, 100, 10, 60)]);
    assert_eq!(run(&t, &n, &xcopy_cdb(p.len()), &p).await.status, 0);
    let r = run(&t, &n, &rw10(0x28, 60, 100), &[]).await;
    assert_eq!(&r.data_in[..], &pattern[..]);
    // LIST ID USAGE 10b: nothing held.
    assert_eq!(
        sense_of(&run(&t, &n, &copy_status_cdb(6), &[]).await).1,
        0x24
    );
    // An index with no CSCD, an unknown NAA, beyond the end: COPY ABORTED.
    let mut unknown = naa0;
    unknown[15] = 0x77;
    for p in [
        xcopy_params(7, 0, &[naa0], &[(0, 1, 1, 0, 0)]),
        xcopy_params(7, 0, &[unknown], &[(0, 0, 1, 0, 1)]),
        xcopy_params(7, 0, &[naa0], &[(0, 0, 2, 0, BLOCKS - 1)]),
    ] {
        let r = run(&t, &n, &xcopy_cdb(p.len()), &p).await;
        assert_eq!(sense_of(&r).0, key::COPY_ABORTED, "{r:?}");
        let r = run(&t, &n, &copy_status_cdb(7), &[]).await;
        assert_eq!(r.data_in[4], 0x02, "completed with errors");
    }
    // A segment past its LU fails the copy before any segment is written
    // (review of 2026-12-06: the segments before it were written first).
    let before = run(&t, &n, &rw10(0x28, 300, 1), &[]).await.data_in;
    let p = xcopy_params(
        9,
        0,
        &[naa0],
        &[(0, 0, 1, 10, 300), (0, 0, 2, 0, BLOCKS - 1)],
    );
    let r = run(&t, &n, &xcopy_cdb(p.len()), &p).await;
    assert_eq!(sense_of(&r).0, key::COPY_ABORTED, "{r:?}");
    let after = run(&t, &n, &rw10(0x28, 300, 1), &[]).await.data_in;
    assert_eq!(after, before, "the first segment was written");
    // The destination's write protection and reservations apply to the copy.
    let r = run(&t, &n, &rw10(0x28, 200, 1), &[]).await;
    let before = r.data_in.clone();
    let mut other = ready(&t, "2", 1).await;
    other.initiator_name = Arc::from("iqn.other");
    let reserve = [0x16, 0, 0, 0, 0, 0];
    assert_eq!(t.execute(&other, cmd(0, &reserve, &[])).await.status, 0);
    let p = xcopy_params(8, 0, &[naa0], &[(0, 0, 1, 10, 200)]);
    let r = run(&t, &n, &xcopy_cdb(p.len()), &p).await;
    assert_eq!(r.status, status::RESERVATION_CONFLICT);
    assert_eq!(
        run(&t, &other, &rw10(0x28, 200, 1), &[]).await.data_in,
        before
    );
    // Operating parameters: the limits the parser enforces.
    let mut op = copy_status_cdb(0);
    op[1] = 0x03;
    let r = run(&t, &other, &op, &[]).await;
    assert_eq!(r.status, status::GOOD);
    assert_eq!(u16::from_be_bytes([r.data_in[8], r.data_in[9]]), 8);
    assert_eq!(u16::from_be_bytes([r.data_in[10], r.data_in[11]]), 16);
    assert_eq!(&r.data_in[43..46], &[2, 0x02, 0xe4]);
}

#[tokio::test]
async fn host_groups_decide_which_luns_an_initiator_sees() {
    let (t, cfg1) = target_with_two_luns();
    let named = |name: &str, chap: Option<&str>| ItNexus {
        initiator_name: Arc::from(name),
        initiator_port: Arc::from(format!("{name},i,0x1").as_str()),
        relative_port_id: 1,
        chap_user: chap.map(Arc::from),
    };
    let (a, b, stranger) = (
        named("iqn.a", None),
        named("iqn.b", Some("bob")),
        named("iqn.c", None),
    );
    let report = |r: Response| -> Vec<u64> {
        r.data_in[8..]
            .chunks(8)
            .map(|c| u16::from_be_bytes([c[0], c[1]]) as u64 & 0x3fff)
            .collect()
    };
    let report_luns = [0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    // No groups: everyone sees both LUNs.
    assert_eq!(
        report(t.execute(&stranger, cmd(0, &report_luns, &[])).await),
        vec![0, 1]
    );
    t.set_host_groups(vec![
        HostGroup {
            name: "a".into(),
            initiators: vec!["iqn.a".into()],
            chap_users: vec![],
            luns: vec![(0, 0)],
        },
        HostGroup {
            name: "b".into(),
            initiators: vec![],
            chap_users: vec!["bob".into()],
            luns: vec![(0, 1)],
        },
    ])
    .unwrap();
    assert_eq!(
        report(t.execute(&a, cmd(0, &report_luns, &[])).await),
        vec![0]
    );
    assert_eq!(
        report(t.execute(&b, cmd(0, &report_luns, &[])).await),
        vec![0]
    );
    assert!(report(t.execute(&stranger, cmd(0, &report_luns, &[])).await).is_empty());
    // LUN 0 of each group is a different LU: writes through one do not show in the other.
    for n in [&a, &b] {
        // Unit attentions (REPORTED LUNS DATA HAS CHANGED ...) first.
        let mut tur = 0;
        while t.execute(n, cmd(0, &[0; 6], &[])).await.status != 0 {
            tur += 1;
            assert!(tur < 8, "TEST UNIT READY keeps failing");
        }
    }
    assert_eq!(
        t.execute(&a, cmd(0, &rw10(0x2a, 5, 1), &[0xaa; BS]))
            .await
            .status,
        0
    );
    assert_eq!(
        t.execute(&b, cmd(0, &rw10(0x2a, 5, 1), &[0xbb; BS]))
            .await
            .status,
        0
    );
    let r = t.execute(&a, cmd(0, &rw10(0x28, 5, 1), &[])).await;
    assert!(r.data_in.iter().all(|&x| x == 0xaa));
    let r = t.execute(&stranger, cmd(1, &rw10(0x28, 5, 1), &[])).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x25, 0));
    // A LUN outside the group is not there, for reads, resets and copies alike.
    let r = t.execute(&a, cmd(1, &rw10(0x28, 5, 1), &[])).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x25, 0));
    assert!(!t.lun_reset(&a, 1).await);
    let p = xcopy_params(1, 2, &[cfg1.naa, lun_config().naa], &[(0, 1, 1, 5, 6)]);
    let r = t.execute(&a, cmd(0, &xcopy_cdb(p.len()), &p)).await;
    assert_eq!(sense_of(&r).0, key::COPY_ABORTED);
    let r = t.execute(&a, cmd(0, &rw10(0x28, 6, 1), &[])).await;
    assert!(
        r.data_in.iter().all(|&x| x == 0),
        "nothing was copied from LUN 1"
    );
    // Contradicting groups are refused and the old ones stay.
    let dup = HostGroup {
        name: "x".into(),
        initiators: vec!["iqn.a".into()],
        chap_users: vec![],
        luns: vec![],
    };
    assert!(t.set_host_groups(vec![dup.clone(), dup]).is_err());
    assert_eq!(t.host_groups().len(), 2);
}

#[tokio::test]
async fn read_defect_data_reports_empty_lists() {
    let t = target();
    let n = ready(&t, "1", 1).await;
    // (10): grown list, format 101b (physical sector), 4-byte header.
    let r = run(&t, &n, &[0x37, 0, 0x0d, 0, 0, 0, 0, 0, 32, 0], &[]).await;
    assert_eq!(r.status, status::GOOD);
    assert_eq!(&r.data_in[..], &[0, 0x0d, 0, 0]);
    // (12): both lists, 8-byte header, truncated to the allocation length.
    let r = run(&t, &n, &[0xb7, 0x18, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0], &[]).await;
    assert_eq!(&r.data_in[..], &[0, 0x18, 0, 0]);
}

/// POPULATE TOKEN (0x10) or WRITE USING TOKEN (0x11) with this list id.
fn token_cdb(sa: u8, list_id: u32, len: usize) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x83;
    c[1] = sa;
    c[6..10].copy_from_slice(&list_id.to_be_bytes());
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}

fn rrti_cdb(list_id: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x84;
    c[1] = 0x07;
    c[2..6].copy_from_slice(&list_id.to_be_bytes());
    c[10..14].copy_from_slice(&4096u32.to_be_bytes());
    c
}

fn range_descriptors(ranges: &[(u64, u32)]) -> Vec<u8> {
    let mut v = Vec::new();
    for &(lba, blocks) in ranges {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&lba.to_be_bytes());
        d[8..12].copy_from_slice(&blocks.to_be_bytes());
        v.extend_from_slice(&d);
    }
    v
}

/// A POPULATE TOKEN parameter list (RTV and ROD type when `rod_type` is given).
fn populate_params(timeout_s: u32, rod_type: Option<u32>, ranges: &[(u64, u32)]) -> Vec<u8> {
    let r = range_descriptors(ranges);
    let mut p = vec![0u8; 16];
    p[0..2].copy_from_slice(&((14 + r.len()) as u16).to_be_bytes());
    if let Some(t) = rod_type {
        p[2] = 0x02; // RTV
        p[8..12].copy_from_slice(&t.to_be_bytes());
    }
    p[4..8].copy_from_slice(&timeout_s.to_be_bytes());
    p[14..16].copy_from_slice(&(r.len() as u16).to_be_bytes());
    p.extend_from_slice(&r);
    p
}

/// A WRITE USING TOKEN parameter list.
fn wut_params(del_tkn: bool, offset: u64, token: &[u8], ranges: &[(u64, u32)]) -> Vec<u8> {
    let r = range_descriptors(ranges);
    let mut p = vec![0u8; 536];
    p[0..2].copy_from_slice(&((534 + r.len()) as u16).to_be_bytes());
    p[2] = u8::from(del_tkn) << 1; // DEL_TKN
    p[8..16].copy_from_slice(&offset.to_be_bytes());
    p[16..528].copy_from_slice(token);
    p[534..536].copy_from_slice(&(r.len() as u16).to_be_bytes());
    p.extend_from_slice(&r);
    p
}

/// The block device zero ROD token.
fn zero_token() -> Vec<u8> {
    let mut t = vec![0u8; 512];
    t[0..4].copy_from_slice(&0xffff_0001u32.to_be_bytes());
    t[6..8].copy_from_slice(&0x01f8u16.to_be_bytes());
    t
}

/// Every block of LUN `lun` in `lbas` starts with its own LBA (then 0xa5 bytes).
async fn stamp(t: &ScsiTarget, n: &ItNexus, lun: u64, lbas: std::ops::Range<u32>) {
    let mut data = Vec::new();
    for lba in lbas.clone() {
        let mut b = vec![0xa5u8; BS];
        b[..4].copy_from_slice(&lba.to_be_bytes());
        data.extend_from_slice(&b);
    }
    let c = rw10(0x2a, lbas.start, (lbas.end - lbas.start) as u16);
    assert_eq!(t.execute(n, cmd(lun, &c, &data)).await.status, 0);
}

/// The LBA each block of LUN `lun` in `lba..lba+blocks` was stamped with.
async fn stamps(t: &ScsiTarget, n: &ItNexus, lun: u64, lba: u32, blocks: u16) -> Vec<u32> {
    let r = t.execute(n, cmd(lun, &rw10(0x28, lba, blocks), &[])).await;
    assert_eq!(r.status, 0);
    r.data_in
        .chunks(BS)
        .map(|b| u32::from_be_bytes(b[..4].try_into().unwrap()))
        .collect()
}

/// POPULATE TOKEN on `lun` then RECEIVE ROD TOKEN INFORMATION: the token.
async fn populate(
    t: &ScsiTarget,
    n: &ItNexus,
    lun: u64,
    list_id: u32,
    timeout_s: u32,
    ranges: &[(u64, u32)],
) -> Vec<u8> {
    let p = populate_params(timeout_s, None, ranges);
    let r = t
        .execute(n, cmd(lun, &token_cdb(0x10, list_id, p.len()), &p))
        .await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
    let r = t.execute(n, cmd(lun, &rrti_cdb(list_id), &[])).await;
    assert_eq!(r.status, status::GOOD);
    let d = &r.data_in;
    assert_eq!(d[4], 0x10, "response to POPULATE TOKEN");
    assert_eq!(d[5], 0x01, "completed without errors");
    assert_eq!(d[15], 0xf1, "counted in blocks");
    let blocks: u64 = ranges.iter().map(|&(_, b)| u64::from(b)).sum();
    assert_eq!(u64::from_be_bytes(d[16..24].try_into().unwrap()), blocks);
    assert_eq!(
        u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize,
        d.len() - 4
    );
    let at = 32 + d[13] as usize;
    assert_eq!(u32::from_be_bytes(d[at..at + 4].try_into().unwrap()), 514);
    let token = d[at + 6..at + 6 + 512].to_vec();
    assert_eq!(
        &token[0..4],
        &0x0001_0000u32.to_be_bytes(),
        "access upon reference"
    );
    assert_eq!(&token[6..8], &0x01f8u16.to_be_bytes());
    token
}

/// WRITE USING TOKEN on `lun`.
async fn write_using(
    t: &ScsiTarget,
    n: &ItNexus,
    lun: u64,
    list_id: u32,
    offset: u64,
    token: &[u8],
    ranges: &[(u64, u32)],
) -> Response {
    let p = wut_params(false, offset, token, ranges);
    t.execute(n, cmd(lun, &token_cdb(0x11, list_id, p.len()), &p))
        .await
}

/// (COPY OPERATION STATUS, TRANSFER COUNT) of list `list_id` through `lun`.
async fn rrti(t: &ScsiTarget, n: &ItNexus, lun: u64, list_id: u32) -> (u8, u64) {
    let r = t.execute(n, cmd(lun, &rrti_cdb(list_id), &[])).await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
    (
        r.data_in[5],
        u64::from_be_bytes(r.data_in[16..24].try_into().unwrap()),
    )
}

/// The two-LUN target and a nexus with both LUNs' unit attentions consumed.
async fn odx_target() -> (ScsiTarget, ItNexus) {
    let (t, _) = target_with_two_luns();
    let n = ready(&t, "1", 1).await;
    let _ = t.execute(&n, cmd(1, &[0; 6], &[])).await;
    (t, n)
}

/// A copy's held status belongs to its I_T nexus: one initiator port
/// reaching the target through two target ports is two nexuses (open-iscsi
/// gives one interface's sessions one ISID). Before (review of 2026-12-06),
/// the other path's logout dropped this path's statuses (its unread token
/// with them), and a list id in use on one path was "in progress" on the
/// other.
#[tokio::test]
async fn a_copys_status_belongs_to_its_nexus_not_to_its_initiator_port() {
    let (t, a) = odx_target().await;
    let b = ready(&t, "1", 2).await;
    populate(&t, &a, 0, 9, 0, &[(0, 8)]).await;
    // the other path knows nothing of list 9
    let r = t.execute(&b, cmd(0, &rrti_cdb(9), &[])).await;
    assert_eq!(r.status, status::CHECK_CONDITION, "{r:?}");
    // and its logout leaves this path's status
    t.nexus_lost(&b).await;
    assert_eq!(rrti(&t, &a, 0, 9).await.0, 0x01);
}

#[tokio::test]
async fn odx_copies_token_data_between_luns() {
    let (t, n) = odx_target().await;
    stamp(&t, &n, 0, 0..300).await;
    // A token for two separate ranges of LUN 0: token blocks 0..50 are LBAs 10..60,
    // 50..100 are LBAs 200..250.
    let token = populate(&t, &n, 0, 1, 0, &[(10, 50), (200, 50)]).await;
    let src_of = |i: u32| if i < 50 { 10 + i } else { 150 + i };
    // The whole token to LUN 1.
    let r = write_using(&t, &n, 1, 2, 0, &token, &[(500, 100)]).await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
    let want: Vec<u32> = (0..100).map(src_of).collect();
    assert_eq!(stamps(&t, &n, 1, 500, 100).await, want);
    let r = t.execute(&n, cmd(1, &rrti_cdb(2), &[])).await;
    assert_eq!(r.data_in[4], 0x11, "response to WRITE USING TOKEN");
    assert_eq!(r.data_in[12], 0, "GOOD");
    assert_eq!(rrti(&t, &n, 1, 2).await, (0x01, 100));
    // Bytes identical, not just the stamps.
    let a = t.execute(&n, cmd(0, &rw10(0x28, 10, 50), &[])).await;
    let b = t.execute(&n, cmd(1, &rw10(0x28, 500, 50), &[])).await;
    assert_eq!(a.data_in, b.data_in);
    // An offset into the token, into several ranges (crossing the token's range
    // boundary at token block 50).
    let r = write_using(&t, &n, 1, 3, 45, &token, &[(700, 3), (710, 4)]).await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
    assert_eq!(stamps(&t, &n, 1, 700, 3).await, vec![55, 56, 57]);
    assert_eq!(stamps(&t, &n, 1, 710, 4).await, vec![58, 59, 200, 201]);
    assert_eq!(rrti(&t, &n, 1, 3).await, (0x01, 7));
    // Access upon reference: a write to the source after POPULATE TOKEN shows.
    stamp(&t, &n, 0, 200..201).await;
    let mut b = vec![0u8; BS];
    b[..4].copy_from_slice(&9999u32.to_be_bytes());
    assert_eq!(run(&t, &n, &rw10(0x2a, 200, 1), &b).await.status, 0);
    assert_eq!(
        write_using(&t, &n, 1, 4, 50, &token, &[(800, 1)])
            .await
            .status,
        0
    );
    assert_eq!(stamps(&t, &n, 1, 800, 1).await, vec![9999]);
    // More asked for than the token holds: what it holds is written, GOOD, and the
    // status says "completed with residual data".
    let r = write_using(&t, &n, 1, 5, 90, &token, &[(900, 20)]).await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
    assert_eq!(rrti(&t, &n, 1, 5).await, (0x04, 10));
    // An offset at or past the token's end: INVALID FIELD IN PARAMETER LIST.
    let r = write_using(&t, &n, 1, 6, 100, &token, &[(900, 1)]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x26, 0));
    assert_eq!(rrti(&t, &n, 1, 6).await.0, 0x02);
    // Within one LU too (token of LUN 0 written to LUN 0).
    assert_eq!(
        write_using(&t, &n, 0, 7, 0, &token, &[(600, 5)])
            .await
            .status,
        0
    );
    assert_eq!(stamps(&t, &n, 0, 600, 5).await, vec![10, 11, 12, 13, 14]);
    // ... but not when one piece of the copy would read what another wrote:
    // token blocks 50.. (LBAs 60..) would be read after LBAs 35..85 were
    // written. Refused (like overlapping destination ranges), nothing written.
    let adjacent = populate(&t, &n, 0, 8, 0, &[(10, 50), (60, 50)]).await;
    let before = stamps(&t, &n, 0, 35, 100).await;
    let r = write_using(&t, &n, 0, 9, 0, &adjacent, &[(35, 100)]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x26, 0));
    assert_eq!(stamps(&t, &n, 0, 35, 100).await, before);
    // Another nexus (another host) may use the token too.
    let other = ready(&t, "2", 1).await;
    let _ = t.execute(&other, cmd(1, &[0; 6], &[])).await;
    assert_eq!(
        write_using(&t, &other, 1, 1, 1, &token, &[(950, 1)])
            .await
            .status,
        0
    );
    assert_eq!(stamps(&t, &n, 1, 950, 1).await, vec![11]);
    // RECEIVE ROD TOKEN INFORMATION of an unknown list: INVALID FIELD IN CDB.
    let r = t.execute(&n, cmd(1, &rrti_cdb(77), &[])).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x24, 0));
}

#[tokio::test]
async fn odx_zero_token_writes_zeroes() {
    let (t, n) = odx_target().await;
    stamp(&t, &n, 1, 100..140).await;
    let r = write_using(&t, &n, 1, 1, 0, &zero_token(), &[(100, 10), (120, 5)]).await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
    let r = t.execute(&n, cmd(1, &rw10(0x28, 100, 40), &[])).await;
    for (i, b) in r.data_in.chunks(BS).enumerate() {
        let zero = i < 10 || (20..25).contains(&i);
        assert_eq!(b.iter().all(|&x| x == 0), zero, "block {}", 100 + i);
    }
    assert_eq!(rrti(&t, &n, 1, 1).await, (0x01, 15));
}

#[tokio::test]
async fn odx_refuses_bad_tokens_with_the_right_sense() {
    let (t, n) = odx_target().await;
    let clock = Arc::new(crate::odx::ManualClock::default());
    t.copies().tokens.set_clock(clock.clone());
    let token = populate(&t, &n, 0, 1, 0, &[(0, 8)]).await;
    let dst = [(100u64, 8u32)];
    // Tampered anywhere (nonce, bytes represented, creator): TOKEN CORRUPT.
    for at in [140, 63, 30] {
        let mut bad = token.clone();
        bad[at] ^= 0x01;
        let r = write_using(&t, &n, 1, 2, 0, &bad, &dst).await;
        assert_eq!(sense_of(&r), (ILLEGAL, 0x23, 0x05), "byte {at}");
    }
    // Another identifier (a forged token): TOKEN UNKNOWN.
    let mut forged = token.clone();
    forged[15] ^= 0x80;
    let r = write_using(&t, &n, 1, 2, 0, &forged, &dst).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x23, 0x04));
    // A ROD type we do not take (point in time), a wrong token length.
    let mut pit = token.clone();
    pit[0..4].copy_from_slice(&0x0080_0000u32.to_be_bytes());
    let r = write_using(&t, &n, 1, 2, 0, &pit, &dst).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x23, 0x01));
    let mut short = token.clone();
    short[7] = 0x10;
    let r = write_using(&t, &n, 1, 2, 0, &short, &dst).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x23, 0x0a));
    // Nothing was written by any of them.
    let r = t.execute(&n, cmd(1, &rw10(0x28, 100, 8), &[])).await;
    assert!(r.data_in.iter().all(|&x| x == 0));
    // The failed command's status is held: completed with errors, and its sense.
    let r = t.execute(&n, cmd(1, &rrti_cdb(2), &[])).await;
    assert_eq!(r.data_in[5], 0x02);
    assert_eq!(r.data_in[12], status::CHECK_CONDITION);
    let sense_len = r.data_in[14] as usize;
    assert_eq!((r.data_in[32 + 12], r.data_in[32 + 13]), (0x23, 0x0a));
    assert!(sense_len >= 18);
    // Inactivity: used within its timeout it lives on; unused for longer it expires.
    let token = populate(&t, &n, 0, 3, 10, &[(0, 8)]).await;
    clock.advance(std::time::Duration::from_secs(9));
    assert_eq!(write_using(&t, &n, 1, 4, 0, &token, &dst).await.status, 0);
    clock.advance(std::time::Duration::from_secs(9));
    assert_eq!(write_using(&t, &n, 1, 4, 0, &token, &dst).await.status, 0);
    clock.advance(std::time::Duration::from_secs(11));
    for _ in 0..2 {
        let r = write_using(&t, &n, 1, 4, 0, &token, &dst).await;
        assert_eq!(sense_of(&r), (ILLEGAL, 0x23, 0x07));
    }
    // However often it is used, a token lives an hour at most.
    let token = populate(&t, &n, 0, 11, 600, &[(0, 8)]).await;
    for _ in 0..6 {
        clock.advance(std::time::Duration::from_secs(590));
        assert_eq!(write_using(&t, &n, 1, 4, 0, &token, &dst).await.status, 0);
    }
    clock.advance(std::time::Duration::from_secs(590));
    let r = write_using(&t, &n, 1, 4, 0, &token, &dst).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x23, 0x07));
    // DEL_TKN: the token is gone after the write that deleted it.
    let token = populate(&t, &n, 0, 5, 0, &[(0, 8)]).await;
    let p = wut_params(true, 0, &token, &dst);
    let r = t
        .execute(&n, cmd(1, &token_cdb(0x11, 6, p.len()), &p))
        .await;
    assert_eq!(r.status, status::GOOD);
    let r = write_using(&t, &n, 1, 6, 0, &token, &dst).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x23, 0x09));
    // A token of an LU that is removed: TOKEN REVOKED.
    let token = populate(&t, &n, 1, 7, 0, &[(0, 8)]).await;
    assert!(t.remove_lun(1).await.is_some());
    let _ = run(&t, &n, &[0; 6], &[]).await; // REPORTED LUNS DATA HAS CHANGED
    let r = write_using(&t, &n, 0, 8, 0, &token, &[(100, 8)]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x23, 0x06));
    // A logical unit reset of the source revokes its tokens too.
    let _ = run(&t, &n, &[0; 6], &[]).await;
    let token = populate(&t, &n, 0, 9, 0, &[(0, 8)]).await;
    assert!(t.lun_reset(&n, 0).await);
    let _ = run(&t, &n, &[0; 6], &[]).await;
    let r = write_using(&t, &n, 0, 10, 0, &token, &[(100, 8)]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x23, 0x06));
}

#[tokio::test]
async fn odx_token_of_a_shrunk_lu_is_revoked() {
    struct Resizable {
        inner: MemVolume,
        blocks: AtomicU64,
    }
    #[async_trait]
    impl Volume for Resizable {
        fn geometry(&self) -> Geometry {
            Geometry {
                block_count: self.blocks.load(Ordering::Relaxed),
                ..self.inner.geometry()
            }
        }
        async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
            self.inner.read(lba, blocks).await
        }
        async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
            self.inner.write(lba, data, fua).await
        }
        async fn flush(&self) -> BlockResult<()> {
            Ok(())
        }
        async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
            self.inner.discard(lba, blocks).await
        }
    }
    let vol = Arc::new(Resizable {
        inner: MemVolume::new(BS as u32, BLOCKS),
        blocks: AtomicU64::new(BLOCKS),
    });
    let t = target_with(vol.clone());
    let n = ready(&t, "1", 1).await;
    let token = populate(&t, &n, 0, 1, 0, &[(0, 8)]).await;
    // Growing keeps the token.
    vol.blocks.store(BLOCKS + 8, Ordering::Relaxed);
    let _ = run(&t, &n, &[0; 6], &[]).await; // CAPACITY DATA HAS CHANGED
    assert_eq!(
        write_using(&t, &n, 0, 2, 0, &token, &[(100, 8)])
            .await
            .status,
        0
    );
    // Shrinking, even outside the token's ranges, revokes it.
    vol.blocks.store(BLOCKS - 1, Ordering::Relaxed);
    let _ = run(&t, &n, &[0; 6], &[]).await; // CAPACITY DATA HAS CHANGED
    let r = write_using(&t, &n, 0, 2, 0, &token, &[(100, 8)]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x23, 0x06));
}

#[tokio::test]
async fn odx_bounds_are_enforced_and_advertised() {
    let (t, n) = odx_target().await;
    let clock = Arc::new(crate::odx::ManualClock::default());
    t.copies().tokens.set_clock(clock.clone());
    // Too many ranges: TOO MANY SEGMENT DESCRIPTORS.
    let many: Vec<(u64, u32)> = (0..65).map(|i| (i, 1)).collect();
    let p = populate_params(0, None, &many);
    let r = run(&t, &n, &token_cdb(0x10, 1, p.len()), &p).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x26, 0x08));
    let p = wut_params(false, 0, &zero_token(), &many);
    let r = t
        .execute(&n, cmd(1, &token_cdb(0x11, 1, p.len()), &p))
        .await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x26, 0x08));
    // Beyond the LU: LOGICAL BLOCK ADDRESS OUT OF RANGE.
    let p = populate_params(0, None, &[(BLOCKS - 1, 2)]);
    let r = run(&t, &n, &token_cdb(0x10, 1, p.len()), &p).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x21, 0));
    let r = write_using(&t, &n, 1, 1, 0, &zero_token(), &[(BLOCKS, 1)]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x21, 0));
    // Overlapping destination ranges.
    let r = write_using(&t, &n, 1, 1, 0, &zero_token(), &[(0, 4), (3, 1)]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x26, 0));
    // An inactivity timeout above the maximum, a point-in-time ROD type.
    let p = populate_params(601, None, &[(0, 1)]);
    let r = run(&t, &n, &token_cdb(0x10, 1, p.len()), &p).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x26, 0));
    let p = populate_params(0, Some(0x0080_0000), &[(0, 1)]);
    let r = run(&t, &n, &token_cdb(0x10, 1, p.len()), &p).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x26, 0));
    // Asking for access upon reference explicitly is fine.
    let p = populate_params(0, Some(0x0001_0000), &[(0, 1)]);
    assert_eq!(
        run(&t, &n, &token_cdb(0x10, 1, p.len()), &p).await.status,
        0
    );
    // More than the maximum token transfer size (256 MiB), on a large LU.
    t.add_lun(
        2,
        LunConfig {
            naa: [0x61; 16],
            ..lun_config()
        },
        Arc::new(MemVolume::new(BS as u32, 1 << 21)),
        None,
    )
    .unwrap();
    let _ = t.execute(&n, cmd(2, &[0; 6], &[])).await;
    let _ = run(&t, &n, &[0; 6], &[]).await; // REPORTED LUNS DATA HAS CHANGED
    let p = populate_params(0, None, &[(0, 1 << 19), (1 << 19, 1)]);
    let r = t
        .execute(&n, cmd(2, &token_cdb(0x10, 1, p.len()), &p))
        .await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x26, 0));
    // Live tokens: 64 an initiator, 128 a target; the next is refused until
    // some expire (the one above, with the default 60 s timeout, does not).
    let other = ready_as(&t, "iqn.other").await;
    let third = ready_as(&t, "iqn.third").await;
    let p = populate_params(5, None, &[(0, 1)]);
    for (who, upto) in [(&n, 64), (&other, 128)] {
        while t.copies().tokens.live() < upto {
            assert_eq!(
                run(&t, who, &token_cdb(0x10, 2, p.len()), &p).await.status,
                0
            );
        }
        let r = run(&t, who, &token_cdb(0x10, 2, p.len()), &p).await;
        assert_eq!(sense_of(&r), (ILLEGAL, 0x55, 0x0d), "past its share");
    }
    // a third initiator, under its fair share, takes a token of those holding
    // the most (see the next test), here n's 60 s one (the least recently used)
    let r = run(&t, &third, &token_cdb(0x10, 2, p.len()), &p).await;
    assert_eq!(r.status, 0, "{r:?}");
    assert_eq!(t.copies().tokens.live(), 128);
    clock.advance(std::time::Duration::from_secs(6));
    assert_eq!(
        run(&t, &n, &token_cdb(0x10, 2, p.len()), &p).await.status,
        0
    );
    assert_eq!(t.copies().tokens.live(), 1);
    // VPD 0x8F: the Block Device ROD Token Limits descriptor comes first.
    let r = run(&t, &n, &[0x12, 1, 0x8f, 0x10, 0, 0], &[]).await;
    assert_eq!(r.status, 0);
    let v = &r.data_in;
    assert_eq!(&v[4..8], &[0, 0, 0, 0x20]);
    assert_eq!(
        u16::from_be_bytes([v[14], v[15]]),
        64,
        "maximum range descriptors"
    );
    assert_eq!(u32::from_be_bytes(v[16..20].try_into().unwrap()), 600);
    assert_eq!(u32::from_be_bytes(v[20..24].try_into().unwrap()), 60);
    assert_eq!(
        u64::from_be_bytes(v[24..32].try_into().unwrap()),
        (256 << 20) / BS as u64
    );
    // Every descriptor is walked; ROD types and the commands are listed.
    let mut at = 4;
    let mut kinds = Vec::new();
    while at + 4 <= v.len() {
        let kind = u16::from_be_bytes([v[at], v[at + 1]]);
        let len = u16::from_be_bytes([v[at + 2], v[at + 3]]) as usize;
        kinds.push(kind);
        if kind == 0x0108 {
            assert_eq!(u16::from_be_bytes([v[at + 6], v[at + 7]]), 16);
            let types = &v[at + 8..at + 8 + 16];
            assert_eq!(&types[0..5], &[0, 1, 0, 0, 0x03]);
            assert_eq!(&types[8..13], &[0xff, 0xff, 0, 1, 0x02]);
        }
        if kind == 0x0001 {
            assert_eq!(&v[at + 5..at + 10], &[0x83, 3, 0x00, 0x10, 0x11]);
        }
        at += 4 + len;
    }
    assert_eq!(at, v.len());
    assert_eq!(
        kinds,
        vec![0x0000, 0x0001, 0x0004, 0x0008, 0x8001, 0x0106, 0x0108]
    );
    // REPORT SUPPORTED OPERATION CODES knows the three commands.
    for (opcode, sa) in [(0x83u8, 0x10u8), (0x83, 0x11), (0x84, 0x07)] {
        let c = [0xa3, 0x0c, 0x02, opcode, 0, sa, 0, 0, 1, 0, 0, 0];
        let r = run(&t, &n, &c, &[]).await;
        assert_eq!(r.data_in[1] & 0x07, 0x03, "{opcode:#x}/{sa:#x}");
    }
}

/// An initiator at its share of the registry reclaims its own least recently
/// written-with token for a new one (TOKEN CANCELLED when it comes back),
/// never one not yet written with.
#[tokio::test]
async fn odx_a_full_registry_reclaims_a_token_already_written_with() {
    let (t, n) = odx_target().await;
    let clock = Arc::new(crate::odx::ManualClock::default());
    t.copies().tokens.set_clock(clock.clone());
    stamp(&t, &n, 0, 0..8).await;
    let first = populate(&t, &n, 0, 1, 0, &[(0, 8)]).await;
    let second = populate(&t, &n, 0, 2, 0, &[(0, 8)]).await;
    while t.copies().tokens.live() < crate::odx::TOKENS_PER_INITIATOR_MAX {
        let p = populate_params(0, None, &[(0, 1)]);
        assert_eq!(
            run(&t, &n, &token_cdb(0x10, 3, p.len()), &p).await.status,
            0
        );
    }
    // none written with yet: the next is refused
    let p = populate_params(0, None, &[(0, 1)]);
    let r = run(&t, &n, &token_cdb(0x10, 3, p.len()), &p).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x55, 0x0d));
    // both written with, the first longer ago: a new token takes its place
    let w = write_using(&t, &n, 1, 4, 0, &first, &[(100, 8)]).await;
    assert_eq!(w.status, 0, "{w:?}");
    clock.advance(std::time::Duration::from_secs(1));
    let w = write_using(&t, &n, 1, 4, 0, &second, &[(200, 8)]).await;
    assert_eq!(w.status, 0, "{w:?}");
    let r = run(&t, &n, &token_cdb(0x10, 3, p.len()), &p).await;
    assert_eq!(r.status, 0, "{r:?}");
    assert_eq!(
        t.copies().tokens.live(),
        crate::odx::TOKENS_PER_INITIATOR_MAX
    );
    let r = write_using(&t, &n, 1, 4, 0, &first, &[(300, 8)]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x23, 0x08), "the reclaimed token");
    let r = write_using(&t, &n, 1, 4, 0, &second, &[(300, 8)]).await;
    assert_eq!(r.status, 0, "the more recently used one is kept: {r:?}");
    // and the copies landed
    assert_eq!(
        stamps(&t, &n, 1, 300, 8).await,
        (0..8).collect::<Vec<u32>>()
    );
}

/// One initiator cannot take every ROD token of a target: at its share
/// (half) it is refused while others still get theirs, and it never cancels
/// another's token. With the registry full, the token a newcomer gets is
/// reclaimed from the initiator holding the most, even when another's is
/// older. (Before, one host could fill the registry and cancel the others'.)
#[tokio::test]
async fn odx_one_initiator_cannot_take_every_token() {
    use crate::odx::{TOKENS_MAX, TOKENS_PER_INITIATOR_MAX};
    let (t, n) = odx_target().await;
    let clock = Arc::new(crate::odx::ManualClock::default());
    t.copies().tokens.set_clock(clock.clone());
    let (b, c, d) = (
        ready_as(&t, "iqn.b").await,
        ready_as(&t, "iqn.c").await,
        ready_as(&t, "iqn.d").await,
    );
    stamp(&t, &n, 0, 0..8).await;
    // b's token, written with first (the oldest use of all)
    let theirs = populate(&t, &b, 0, 1, 0, &[(0, 8)]).await;
    assert_eq!(
        write_using(&t, &b, 1, 2, 0, &theirs, &[(100, 8)])
            .await
            .status,
        0
    );
    clock.advance(std::time::Duration::from_secs(1));
    // n: its share, one of them written with (later)
    let mine = populate(&t, &n, 0, 1, 0, &[(0, 8)]).await;
    assert_eq!(
        write_using(&t, &n, 1, 2, 0, &mine, &[(200, 8)])
            .await
            .status,
        0
    );
    let p = populate_params(0, None, &[(0, 1)]);
    while t.copies().tokens.live() < 1 + TOKENS_PER_INITIATOR_MAX {
        assert_eq!(
            run(&t, &n, &token_cdb(0x10, 3, p.len()), &p).await.status,
            0
        );
    }
    // n at its share reclaims its own written one, not b's older one
    assert_eq!(
        run(&t, &n, &token_cdb(0x10, 3, p.len()), &p).await.status,
        0
    );
    let r = write_using(&t, &n, 1, 4, 0, &mine, &[(300, 8)]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x23, 0x08), "n's own token went");
    assert_eq!(
        write_using(&t, &b, 1, 4, 0, &theirs, &[(300, 8)])
            .await
            .status,
        0
    );
    // and with nothing of its own written with, n is refused
    let r = run(&t, &n, &token_cdb(0x10, 3, p.len()), &p).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x55, 0x0d));
    // b and c fill the registry: n holds the most (64, none written),
    // b 63 (one written, the oldest), c 1
    let mine = populate(&t, &c, 0, 5, 0, &[(0, 8)]).await;
    while t.copies().tokens.live() < TOKENS_MAX {
        assert_eq!(
            run(&t, &b, &token_cdb(0x10, 3, p.len()), &p).await.status,
            0
        );
    }
    // d gets one: n has none to give, so b's written one goes
    assert_eq!(
        run(&t, &d, &token_cdb(0x10, 3, p.len()), &p).await.status,
        0
    );
    let r = write_using(&t, &b, 1, 6, 0, &theirs, &[(400, 8)]).await;
    assert_eq!(
        sense_of(&r),
        (ILLEGAL, 0x23, 0x08),
        "b's written token went"
    );
    assert_eq!(
        write_using(&t, &c, 1, 6, 0, &mine, &[(500, 8)])
            .await
            .status,
        0
    );
}

/// Two initiators holding every token, none written with yet, do not starve a
/// third: under its fair share (a third of the registry) it takes the least
/// recently used token of the one holding the most, up to that share.
/// (Before, it was refused for their whole inactivity time.)
#[tokio::test]
async fn odx_two_initiators_holding_every_token_unwritten_do_not_starve_a_third() {
    use crate::odx::{TOKENS_MAX, TOKENS_PER_INITIATOR_MAX};
    let (t, n) = odx_target().await;
    let clock = Arc::new(crate::odx::ManualClock::default());
    t.copies().tokens.set_clock(clock.clone());
    let (b, c) = (ready_as(&t, "iqn.b").await, ready_as(&t, "iqn.c").await);
    stamp(&t, &n, 0, 0..8).await;
    // each token a millisecond younger than the one before
    async fn one_more(t: &ScsiTarget, who: &ItNexus, clock: &crate::odx::ManualClock) -> Response {
        clock.advance(std::time::Duration::from_millis(1));
        let p = populate_params(0, None, &[(0, 1)]);
        run(t, who, &token_cdb(0x10, 3, p.len()), &p).await
    }
    let first_of_n = populate(&t, &n, 0, 1, 0, &[(0, 8)]).await;
    while t.copies().tokens.live() < TOKENS_PER_INITIATOR_MAX - 1 {
        assert_eq!(one_more(&t, &n, &clock).await.status, 0);
    }
    clock.advance(std::time::Duration::from_millis(1));
    let last_of_n = populate(&t, &n, 0, 4, 0, &[(0, 8)]).await;
    clock.advance(std::time::Duration::from_millis(1));
    let first_of_b = populate(&t, &b, 0, 5, 0, &[(0, 8)]).await;
    while t.copies().tokens.live() < TOKENS_MAX - 1 {
        assert_eq!(one_more(&t, &b, &clock).await.status, 0);
    }
    clock.advance(std::time::Duration::from_millis(1));
    let last_of_b = populate(&t, &b, 0, 6, 0, &[(0, 8)]).await;
    assert_eq!(t.copies().tokens.live(), TOKENS_MAX);
    // c gets tokens up to its fair share
    for i in 0..TOKENS_MAX / 3 {
        let r = one_more(&t, &c, &clock).await;
        assert_eq!(r.status, 0, "c's token {i}: {r:?}");
    }
    assert_eq!(t.copies().tokens.live(), TOKENS_MAX);
    let r = one_more(&t, &c, &clock).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x55, 0x0d), "c at its fair share");
    // taken from n and b in turn (the one holding the most, then the least
    // recently used): n's first, then b's first, ...
    let r = write_using(&t, &n, 1, 2, 0, &first_of_n, &[(100, 8)]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x23, 0x08), "n's first token went");
    let r = write_using(&t, &b, 1, 2, 0, &first_of_b, &[(100, 8)]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x23, 0x08), "b's first token went");
    // ... and the ones they made last are still theirs to use
    for (who, token) in [(&n, &last_of_n), (&b, &last_of_b)] {
        let r = write_using(&t, who, 1, 2, 0, token, &[(200, 8)]).await;
        assert_eq!(r.status, 0, "{r:?}");
    }
}

#[tokio::test]
async fn odx_honours_write_protection_reservations_and_masking() {
    let (t, n) = odx_target().await;
    let mut ro = lun_config();
    ro.naa[15] = 0x42;
    ro.read_only = true;
    t.add_lun(2, ro, Arc::new(MemVolume::new(BS as u32, BLOCKS)), None)
        .unwrap();
    let _ = t.execute(&n, cmd(2, &[0; 6], &[])).await;
    let _ = run(&t, &n, &[0; 6], &[]).await;
    let _ = t.execute(&n, cmd(1, &[0; 6], &[])).await;
    stamp(&t, &n, 0, 0..8).await;
    let token = populate(&t, &n, 0, 1, 0, &[(0, 8)]).await;
    // A read-only LU refuses WRITE USING TOKEN (it may still be a source).
    let r = write_using(&t, &n, 2, 2, 0, &token, &[(0, 8)]).await;
    assert_eq!(sense_of(&r), (key::DATA_PROTECT, 0x27, 0));
    let r = write_using(&t, &n, 2, 2, 0, &zero_token(), &[(0, 8)]).await;
    assert_eq!(sense_of(&r), (key::DATA_PROTECT, 0x27, 0));
    let p = populate_params(0, None, &[(0, 8)]);
    let r = t
        .execute(&n, cmd(2, &token_cdb(0x10, 3, p.len()), &p))
        .await;
    assert_eq!(r.status, status::GOOD);
    // Another initiator reserves LUN 1 (RESERVE(6)): writing it through a token
    // conflicts, and so does using a token whose source it reserved.
    let mut other = ready(&t, "2", 1).await;
    other.initiator_name = Arc::from("iqn.other");
    let _ = t.execute(&other, cmd(1, &[0; 6], &[])).await;
    assert_eq!(
        t.execute(&other, cmd(1, &[0x16, 0, 0, 0, 0, 0], &[]))
            .await
            .status,
        0
    );
    let r = write_using(&t, &n, 1, 4, 0, &token, &[(0, 8)]).await;
    assert_eq!(r.status, status::RESERVATION_CONFLICT);
    let token1 = {
        let p = populate_params(0, None, &[(0, 8)]);
        let r = t
            .execute(&other, cmd(1, &token_cdb(0x10, 5, p.len()), &p))
            .await;
        assert_eq!(r.status, status::GOOD);
        let r = t.execute(&other, cmd(1, &rrti_cdb(5), &[])).await;
        r.data_in[32 + 6..32 + 6 + 512].to_vec()
    };
    let r = write_using(&t, &n, 0, 6, 0, &token1, &[(100, 8)]).await;
    assert_eq!(r.status, status::RESERVATION_CONFLICT);
    // ... and POPULATE TOKEN on the reserved LU conflicts for others.
    let p = populate_params(0, None, &[(0, 8)]);
    let r = t
        .execute(&n, cmd(1, &token_cdb(0x10, 7, p.len()), &p))
        .await;
    assert_eq!(r.status, status::RESERVATION_CONFLICT);
    // Released, it works; the token went through the reserving nexus's RRTI only.
    let r = t.execute(&n, cmd(1, &rrti_cdb(5), &[])).await;
    assert_eq!(r.status, status::RESERVATION_CONFLICT);
    assert_eq!(
        t.execute(&other, cmd(1, &[0x17, 0, 0, 0, 0, 0], &[]))
            .await
            .status,
        0
    );
    let r = t.execute(&n, cmd(1, &rrti_cdb(5), &[])).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x24, 0), "held per I_T nexus");
    assert_eq!(
        write_using(&t, &n, 1, 8, 0, &token, &[(0, 8)]).await.status,
        0
    );
    // Masking: an initiator that does not see LUN 0 cannot use its token.
    t.set_host_groups(vec![initiators_group("one", &["iqn.other"], &[(1, 1)])])
        .unwrap();
    while t.execute(&other, cmd(1, &[0; 6], &[])).await.status != 0 {}
    let r = write_using(&t, &other, 1, 9, 0, &token, &[(200, 8)]).await;
    assert_eq!(sense_of(&r), (key::COPY_ABORTED, 0x0d, 0x02));
    let r = t.execute(&other, cmd(1, &rw10(0x28, 200, 8), &[])).await;
    assert!(r.data_in.iter().all(|&x| x == 0), "nothing was copied");
}

#[tokio::test]
async fn odx_aborted_write_using_token_stops_between_chunks() {
    const BIG: u64 = 8192;
    let t = Arc::new(target_with(Arc::new(MemVolume::new(BS as u32, BIG))));
    let gated = Arc::new(Counting {
        hang_from: 600,
        ..Counting::new(BIG)
    });
    let mut cfg1 = lun_config();
    cfg1.naa[15] = 0xee;
    t.add_lun(1, cfg1, gated.clone(), None).unwrap();
    let n = ready(&t, "1", 1).await;
    let _ = t.execute(&n, cmd(1, &[0; 6], &[])).await;
    stamp(&t, &n, 0, 0..16).await;
    let token = populate(&t, &n, 0, 1, 0, &[(0, 4096)]).await;
    // One chunk is 1 MiB (2048 blocks): the first lands at 500, the second (at
    // 2548) waits at the gate, and the command is aborted there.
    let task = {
        let (t, n) = (t.clone(), n.clone());
        tokio::spawn(async move { write_using(&t, &n, 1, 2, 0, &token, &[(500, 4096)]).await })
    };
    let entered = gated.entered.notified();
    entered.await;
    // While it waits, RECEIVE ROD TOKEN INFORMATION reports it in progress.
    let r = t.execute(&n, cmd(1, &rrti_cdb(2), &[])).await;
    assert_eq!(r.data_in[5], 0x10, "in progress");
    assert_eq!(
        u64::from_be_bytes(r.data_in[16..24].try_into().unwrap()),
        2048
    );
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert_eq!(
        stamps(&t, &n, 1, 500, 16).await,
        (0..16).collect::<Vec<u32>>()
    );
    let r = t.execute(&n, cmd(1, &rrti_cdb(2), &[])).await;
    assert_eq!(r.data_in[5], 0x02, "completed with errors");
    assert_eq!(r.data_in[12], status::TASK_ABORTED);
    assert_eq!(
        u64::from_be_bytes(r.data_in[16..24].try_into().unwrap()),
        2048,
        "the chunk written before the abort"
    );
    // The copy slot was given back: another WRITE USING TOKEN runs.
    assert_eq!(
        write_using(&t, &n, 1, 3, 0, &zero_token(), &[(0, 8)])
            .await
            .status,
        0
    );
}

/// SET TARGET PORT GROUPS (MAINTENANCE OUT / 0x0a) with a parameter list of `len`
/// bytes.
fn stpg_cdb(len: u32) -> [u8; 12] {
    let mut c = [0xa4, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[6..10].copy_from_slice(&len.to_be_bytes());
    c
}

/// A SET TARGET PORT GROUPS parameter list: (state code, group) per descriptor.
fn stpg_list(descs: &[(u8, u16)]) -> Vec<u8> {
    let mut p = vec![0u8; 4];
    for &(state, group) in descs {
        p.extend_from_slice(&[state, 0]);
        p.extend_from_slice(&group.to_be_bytes());
    }
    p
}

/// Each group's descriptor from REPORT TARGET PORT GROUPS: (group id, state
/// code, status code, relative port ids).
async fn rtpg(t: &ScsiTarget, n: &ItNexus) -> Vec<(u16, u8, u8, Vec<u16>)> {
    let r = run(t, n, &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]).await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
    let d = &r.data_in;
    let mut out = Vec::new();
    let mut off = 4;
    while off + 8 <= d.len() {
        let count = d[off + 7] as usize;
        let ports = (0..count)
            .map(|i| {
                let p = off + 8 + 4 * i;
                u16::from_be_bytes([d[p + 2], d[p + 3]])
            })
            .collect();
        out.push((
            u16::from_be_bytes([d[off + 2], d[off + 3]]),
            d[off] & 0x0f,
            d[off + 5],
            ports,
        ));
        off += 8 + 4 * count;
    }
    out
}

/// (state code, status code) per group id from REPORT TARGET PORT GROUPS.
async fn rtpg_states(t: &ScsiTarget, n: &ItNexus) -> Vec<(u16, u8, u8)> {
    let groups = rtpg(t, n).await;
    groups.into_iter().map(|(g, s, st, _)| (g, s, st)).collect()
}

#[tokio::test]
async fn set_target_port_groups_changes_rtpg_and_raises_ua_for_the_others() {
    let t = target();
    let n1 = ready(&t, "1", 1).await;
    let other_port = ready(&t, "1", 2).await;
    let other_initiator = ready(&t, "2", 1).await;
    // TPGS = 11b
    let r = run(&t, &n1, &[0x12, 0, 0, 0, 36, 0], &[]).await;
    assert_eq!(r.data_in[5] & 0x30, 0x30);
    // REPORT SUPPORTED OPERATION CODES lists it (one-command form, with SA)
    let r = run(
        &t,
        &n1,
        &[0xa3, 0x0c, 2, 0xa4, 0, 0x0a, 0, 0, 1, 0, 0, 0],
        &[],
    )
    .await;
    assert_eq!((r.status, r.data_in[1] & 7), (status::GOOD, 3));
    assert_eq!(&r.data_in[4..6], &[0xa4, 0x1f]);
    assert_eq!(rtpg_states(&t, &n1).await, vec![(1, 0, 0), (2, 1, 0)]);
    // group 2 -> standby, group 1 -> active/non-optimized
    let p = stpg_list(&[(2, 2), (1, 1)]);
    let r = run(&t, &n1, &stpg_cdb(p.len() as u32), &p).await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
    assert_eq!(rtpg_states(&t, &n1).await, vec![(1, 1, 1), (2, 2, 1)]);
    assert_eq!(
        t.lun_explicit_alua(0).unwrap(),
        vec![(1, AluaState::ActiveNonOptimized), (2, AluaState::Standby)]
    );
    // the sender gets no unit attention, every other I_T nexus one
    assert_eq!(run(&t, &n1, &[0; 6], &[]).await.status, status::GOOD);
    for n in [&other_port, &other_initiator] {
        let r = run(&t, n, &[0; 6], &[]).await;
        assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x2a, 0x06));
    }
    assert_eq!(
        run(&t, &other_initiator, &[0; 6], &[]).await.status,
        status::GOOD
    );
    // the standby port refuses I/O but accepts SET TARGET PORT GROUPS: it brings
    // its own group back
    let r = run(&t, &other_port, &rw10(0x28, 0, 1), &[]).await;
    assert_eq!(sense_of(&r), (key::NOT_READY, 0x04, 0x0b));
    let p = stpg_list(&[(0, 2)]);
    let r = run(&t, &other_port, &stpg_cdb(p.len() as u32), &p).await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
    // n1 learns of that change
    let r = run(&t, &n1, &[0; 6], &[]).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x2a, 0x06));
    // back to the configured (implicit) active/non-optimized: the worse of the two
    assert_eq!(rtpg_states(&t, &n1).await, vec![(1, 1, 1), (2, 1, 1)]);
    assert_eq!(run(&t, &other_port, &rw10(0x28, 0, 1), &[]).await.status, 0);
    // an implicit change reports status 02h
    assert!(t.set_lun_port_group_state(0, 2, AluaState::Unavailable));
    let r = run(&t, &other_port, &[0; 6], &[]).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x2a, 0x06));
    assert_eq!(
        rtpg_states(&t, &other_port).await,
        vec![(1, 1, 1), (2, 3, 2)]
    );
    // an Unavailable port accepts it too; the implicit state still wins
    let p = stpg_list(&[(0, 2)]);
    let r = run(&t, &other_port, &stpg_cdb(p.len() as u32), &p).await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
    assert_eq!(rtpg_states(&t, &other_port).await[1], (2, 3, 2));
}

#[tokio::test]
async fn bad_set_target_port_groups_parameter_lists_are_refused_whole() {
    let t = target();
    let n = ready(&t, "1", 1).await;
    let other = ready(&t, "2", 1).await;
    // zero length: GOOD, nothing changes, no unit attention
    assert_eq!(run(&t, &n, &stpg_cdb(0), &[]).await.status, status::GOOD);
    // a truncated descriptor
    let p = stpg_list(&[(2, 2)]);
    let r = run(&t, &n, &stpg_cdb(6), &p).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x1a, 0x00));
    // unknown group, after a good descriptor: nothing applied
    let p = stpg_list(&[(2, 2), (2, 9)]);
    let r = run(&t, &n, &stpg_cdb(p.len() as u32), &p).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x26, 0x00));
    // transitioning, offline, logical block dependent
    for st in [0x0f, 0x0e, 0x04] {
        let p = stpg_list(&[(st, 1)]);
        let r = run(&t, &n, &stpg_cdb(p.len() as u32), &p).await;
        assert_eq!(sense_of(&r), (ILLEGAL, 0x26, 0x00), "state {st:#x}");
    }
    // another MAINTENANCE OUT service action
    let mut c = stpg_cdb(8);
    c[1] = 0x06;
    assert_eq!(sense_of(&run(&t, &n, &c, &p).await), (ILLEGAL, 0x24, 0x00));
    assert_eq!(rtpg_states(&t, &n).await, vec![(1, 0, 0), (2, 1, 0)]);
    assert!(t.lun_explicit_alua(0).unwrap().is_empty());
    assert_eq!(run(&t, &other, &[0; 6], &[]).await.status, status::GOOD);
}

#[tokio::test]
async fn explicit_alua_states_survive_a_restart() {
    let dir = crate::pr::tests::temp_dir("alua");
    let cfg = || {
        let mut c = lun_config();
        c.state_file = Some(dir.join("lun0.pr.json"));
        c
    };
    let build = || {
        let vol: VolumeRef = Arc::new(MemVolume::new(BS as u32, 64));
        let mut tc = TargetConfig {
            name: "iqn.t".into(),
            ports: Vec::new(),
            port_groups: Vec::new(),
            luns: vec![(0, cfg(), vol)],
        };
        let template = target();
        tc.ports = template.config().ports.clone();
        tc.port_groups = template.config().port_groups.clone();
        ScsiTarget::new(tc).unwrap()
    };
    let t = build();
    let n = ready(&t, "1", 1).await;
    let p = stpg_list(&[(3, 2)]);
    assert_eq!(run(&t, &n, &stpg_cdb(8), &p).await.status, status::GOOD);
    assert!(dir.join("lun0.alua.json").exists());
    drop(t);
    // restarted: the state is back, reported and enforced
    let t = build();
    assert_eq!(
        t.lun_explicit_alua(0).unwrap(),
        vec![(2, AluaState::Unavailable)]
    );
    let n = ready(&t, "1", 1).await;
    assert_eq!(rtpg_states(&t, &n).await[1].1, 3);
    let n2 = nexus("1", 2);
    let r = run(&t, &n2, &rw10(0x28, 0, 1), &[]).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x29, 0x00));
    let r = run(&t, &n2, &rw10(0x28, 0, 1), &[]).await;
    assert_eq!(sense_of(&r), (key::NOT_READY, 0x04, 0x0c));
    // a LUN added at run time with the same state file loads it too
    t.add_lun(1, cfg(), Arc::new(MemVolume::new(BS as u32, 64)), None)
        .unwrap();
    assert_eq!(
        t.lun_explicit_alua(1).unwrap(),
        vec![(2, AluaState::Unavailable)]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
/// A folder of its own under the system's temporary folder, removed on drop.
pub(super) struct TempDir(std::path::PathBuf);

impl TempDir {
    /// A folder of its own: unique per call, since tests running at once in
    /// one process may use the same tag.
    pub(super) fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("scsi-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub(super) fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

mod atomic;
mod copy_resume;
mod sanitize;
mod thin;

/// (group id, relative port ids) from REPORT TARGET PORT GROUPS.
async fn rtpg_ports(t: &ScsiTarget, n: &ItNexus) -> Vec<(u16, Vec<u16>)> {
    let groups = rtpg(t, n).await;
    groups.into_iter().map(|(g, _, _, p)| (g, p)).collect()
}

/// The target port group designator (type 5h) of the device identification
/// page as seen through `n`, if the page names one.
async fn vpd83_group(t: &ScsiTarget, n: &ItNexus) -> Option<u16> {
    let r = run(t, n, &[0x12, 1, 0x83, 1, 0, 0], &[]).await;
    assert_eq!(r.status, status::GOOD, "{r:?}");
    let d = &r.data_in;
    let mut off = 4;
    while off + 4 <= d.len() {
        let len = d[off + 3] as usize;
        if d[off + 1] & 0x0f == 0x05 {
            return Some(u16::from_be_bytes([d[off + 6], d[off + 7]]));
        }
        off += 4 + len;
    }
    None
}

#[tokio::test]
async fn ports_added_and_removed_at_run_time_join_and_leave_their_groups() {
    let t = target();
    let port = |relative_id: u16, group_id: u16| TargetPort {
        relative_id,
        group_id,
        name: format!("iqn.2026-11.org.freesan:t1,t,0x{relative_id:04x}"),
    };
    let n1 = ready(&t, "1", 1).await;
    assert_eq!(rtpg_ports(&t, &n1).await, vec![(1, vec![1]), (2, vec![2])]);
    // a port in a group the target does not have, or an id twice: refused,
    // nothing changes
    assert!(t.set_ports(vec![port(1, 1), port(3, 9)]).is_err());
    assert!(t.set_ports(vec![port(1, 1), port(1, 2)]).is_err());
    assert_eq!(t.ports().len(), 2);
    assert_eq!(rtpg_ports(&t, &n1).await, vec![(1, vec![1]), (2, vec![2])]);
    // port 3 joins group 1, port 2 leaves
    t.set_ports(vec![port(1, 1), port(3, 1)]).unwrap();
    assert_eq!(
        rtpg_ports(&t, &n1).await,
        vec![(1, vec![1, 3]), (2, vec![])]
    );
    let n3 = ready(&t, "3", 3).await;
    assert_eq!(vpd83_group(&t, &n3).await, Some(1));
    // the new port follows its group's state: group 1 to standby
    assert!(t.set_lun_port_group_state(0, 1, AluaState::Standby));
    let r = run(&t, &n3, &rw10(0x28, 0, 1), &[]).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x2a, 0x06));
    let r = run(&t, &n3, &rw10(0x28, 0, 1), &[]).await;
    assert_eq!(sense_of(&r), (key::NOT_READY, 0x04, 0x0b));
    assert!(t.set_lun_port_group_state(0, 1, AluaState::ActiveOptimized));
    // the removed port no longer names a group in VPD 83h
    let n2 = nexus("2", 2);
    assert_eq!(vpd83_group(&t, &n2).await, None);
    // a LU added later has the new ports
    t.add_lun(
        5,
        lun_config(),
        Arc::new(MemVolume::new(BS as u32, BLOCKS)),
        None,
    )
    .unwrap();
    assert_eq!(
        t.lun_port_groups(5).unwrap()[0].relative_port_ids,
        vec![1, 3]
    );
    // setting the same ports again is no change
    t.set_ports(vec![port(1, 1), port(3, 1)]).unwrap();
    assert_eq!(
        t.ports().iter().map(|p| p.relative_id).collect::<Vec<_>>(),
        [1, 3]
    );
}

/// READ CAPACITY(16) reports the LU's logical blocks per physical block ("512e").
#[tokio::test]
async fn read_capacity_16_reports_the_physical_block_exponent() {
    let rc16 = [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
    let t = target();
    let n = ready(&t, "01", 1).await;
    let r = run(&t, &n, &rc16, &[]).await;
    assert_eq!(r.data_in[13] & 0x0f, 0);
    let mut c = lun_config();
    c.physical_block_exponent = 3;
    let t = ScsiTarget::new(TargetConfig {
        name: "iqn.2026-11.org.freesan:t1".into(),
        ports: vec![TargetPort {
            relative_id: 1,
            group_id: 1,
            name: "iqn.2026-11.org.freesan:t1,t,0x0001".into(),
        }],
        port_groups: vec![],
        luns: vec![(0, c, Arc::new(MemVolume::new(BS as u32, BLOCKS)))],
    })
    .unwrap();
    let n = ready(&t, "01", 1).await;
    let r = run(&t, &n, &rc16, &[]).await;
    assert_eq!(r.status, status::GOOD);
    assert_eq!(r.data_in[13] & 0x0f, 3);
}

/// PERSISTENT RESERVE OUT: `sa` service action, `kind` reservation type, the
/// parameter list's key and service action key.
fn pr_out_cmd(sa: u8, kind: u8, key: u64, sa_key: u64) -> ([u8; 10], Vec<u8>) {
    let mut c = [0u8; 10];
    c[0] = 0x5f;
    c[1] = sa;
    c[2] = kind;
    c[8] = 24;
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    (c, p)
}

/// A copy sent to one LU writing another is no task of that other LU, so a
/// PREEMPT AND ABORT there does not abort it: it must stop at its next batch,
/// and the PREEMPT AND ABORT answer only once the batch under way has ended.
/// Before, the copy went on writing over the fence (its reservation checked
/// once, at the start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_stops_once_its_initiator_is_preempted_on_the_destination() {
    let (t, held) = copy_target();
    let x = ready(&t, "1", 1).await;
    let mut y = nexus("2", 1);
    y.initiator_name = Arc::from("iqn.fence");
    for n in [&x, &y] {
        for lun in [0, 1] {
            let _ = t.execute(n, cmd(lun, &[0; 6], &[])).await;
        }
    }
    let pattern: Vec<u8> = (0..BIG as usize * BS).map(|i| (i / BS) as u8 | 1).collect();
    for (i, piece) in pattern.chunks(2048 * BS).enumerate() {
        let lba = i as u64 * 2048;
        let w = t.execute(&x, cmd(0, &rw16(0x8a, lba, 2048), piece)).await;
        assert_eq!(w.status, status::GOOD);
    }
    // X holds WRITE EXCLUSIVE on LUN 1, Y is registered there
    let pr = |n: &ItNexus, (c, p): ([u8; 10], Vec<u8>)| {
        let (t, n) = (t.clone(), n.clone());
        async move { t.execute(&n, cmd(1, &c, &p)).await }
    };
    assert_eq!(pr(&x, pr_out_cmd(0, 0, 0, 0xaa)).await.status, status::GOOD);
    assert_eq!(pr(&x, pr_out_cmd(1, 1, 0xaa, 0)).await.status, status::GOOD);
    assert_eq!(pr(&y, pr_out_cmd(0, 0, 0, 0xbb)).await.status, status::GOOD);
    // X copies LUN 0 onto LUN 1 (a command to LUN 0); its first write waits
    let copy = copy_held_at_its_first_write(&t, &x, &held).await;
    // Y fences X off LUN 1
    let fence = tokio::spawn(pr(&y, pr_out_cmd(5, 1, 0xbb, 0xaa)));
    held.writes.open();
    assert_eq!(fence.await.unwrap().status, status::GOOD);
    let r = copy.await.unwrap();
    assert_ne!(
        r.status,
        status::GOOD,
        "the copy went on writing LUN 1 after its initiator was preempted there"
    );
    // the last chunk was never written
    let tail = t.execute(&y, cmd(1, &rw16(0x88, BIG - 8, 8), &[])).await;
    assert_eq!(tail.status, status::GOOD);
    assert!(
        tail.data_in.iter().all(|&b| b == 0),
        "the copy reached the end"
    );
}

/// Removing an LU returns only once the writes already running on it have
/// ended (and then flushes): a write acknowledged after the removal answered
/// would land on a volume given back (a disk returned to the free ones).
/// Before (review of 2026-12-06), it flushed and returned at once.
#[tokio::test]
async fn removing_an_lu_waits_for_its_writes_in_flight() {
    let held = Arc::new(block::HoldVolume::new(Arc::new(MemVolume::new(
        BS as u32, BLOCKS,
    ))));
    let t = Arc::new(target_with(held.clone()));
    let n = ready(&t, "1", 1).await;
    held.writes.hold();
    let write = {
        let (t, n) = (t.clone(), n.clone());
        tokio::spawn(async move { t.execute(&n, cmd(0, &rw10(0x2a, 5, 1), &[7; BS])).await })
    };
    held.writes.arrivals(1).await;
    let remove = {
        let t = t.clone();
        tokio::spawn(async move { t.remove_lun(0).await.is_some() })
    };
    // given 300 ms, a removal that does not wait has returned
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !remove.is_finished(),
        "the LU was removed with a write still at its volume"
    );
    held.writes.open();
    assert_eq!(write.await.unwrap().status, status::GOOD);
    assert!(remove.await.unwrap());
    assert_eq!(held.read(5, 1).await.unwrap(), vec![7u8; BS]);
}

/// Blocks of the copy targets: 16 MiB of 512-byte blocks, several batches.
const BIG: u64 = 16 * 2048;

/// A target with LUN 0 over memory and LUN 1 (NAA ending 0xee) over a held
/// memory volume, both [`BIG`] blocks.
fn copy_target() -> (Arc<ScsiTarget>, Arc<block::HoldVolume>) {
    let t = Arc::new(target_with(Arc::new(MemVolume::new(BS as u32, BIG))));
    let held = Arc::new(block::HoldVolume::new(Arc::new(MemVolume::new(
        BS as u32, BIG,
    ))));
    t.add_lun(1, copy_lun1(), held.clone(), None).unwrap();
    (t, held)
}

/// LUN 1 of [`copy_target`].
fn copy_lun1() -> LunConfig {
    let mut c = lun_config();
    c.naa[15] = 0xee;
    c
}

/// `x` copies LUN 0 onto LUN 1 of [`copy_target`] with EXTENDED COPY (a
/// command to LUN 0); returns once its first write waits at `held`.
async fn copy_held_at_its_first_write(
    t: &Arc<ScsiTarget>,
    x: &ItNexus,
    held: &block::HoldVolume,
) -> tokio::task::JoinHandle<Response> {
    held.writes.hold();
    let p = xcopy_params(
        1,
        0,
        &[lun_config().naa, copy_lun1().naa],
        &[(0, 1, BIG as u16, 0, 0)],
    );
    let copy = {
        let (t, x) = (t.clone(), x.clone());
        tokio::spawn(async move { t.execute(&x, cmd(0, &xcopy_cdb(p.len()), &p)).await })
    };
    held.writes.arrivals(1).await;
    copy
}

/// A LOGICAL UNIT RESET (or CLEAR TASK SET) of the LU an EXTENDED COPY writes,
/// the copy sent to another LU, stops the copy: once the reset is answered,
/// none of its writes lands there. Before (review of 2026-12-06), the reset
/// aborted only the reset LU's own commands, and the copy, a command of LUN
/// 0, went on writing LUN 1 to its end.
#[tokio::test]
async fn a_copy_stops_once_the_lu_it_writes_is_reset() {
    for clear in [false, true] {
        let (t, held) = copy_target();
        let x = ready(&t, "1", 1).await;
        let _ = t.execute(&x, cmd(1, &[0; 6], &[])).await;
        let ones = vec![1u8; 2048 * BS];
        for i in 0..BIG / 2048 {
            let w = t
                .execute(&x, cmd(0, &rw16(0x8a, i * 2048, 2048), &ones))
                .await;
            assert_eq!(w.status, status::GOOD);
        }
        // a copy of LUN 0 onto LUN 1 (a command to LUN 0); its first write waits
        let copy = copy_held_at_its_first_write(&t, &x, &held).await;
        let reset = {
            let (t, x) = (t.clone(), x.clone());
            tokio::spawn(async move {
                if clear {
                    t.clear_task_set(&x, 1).await;
                } else {
                    assert!(t.lun_reset(&x, 1).await);
                }
            })
        };
        held.writes.open();
        reset.await.unwrap();
        let r = copy.await.unwrap();
        assert_ne!(
            r.status,
            status::GOOD,
            "the copy went on writing LUN 1 after its reset (clear task set: {clear})"
        );
        let tail = held.read(BIG - 8, 8).await.unwrap();
        assert!(tail.iter().all(|&b| b == 0), "the copy reached the end");
    }
}

/// A host group changed while a WRITE USING TOKEN runs stops the copy before
/// its next batch: its initiator no longer sees the token's LU, so the rest is
/// not copied (COPY TARGET DEVICE NOT REACHABLE). Before, visibility was
/// checked at the start only.
#[tokio::test]
async fn odx_copy_stops_once_its_initiator_no_longer_sees_the_source() {
    let (t, held) = copy_target();
    let n = ready_as(&t, "iqn.copier").await;
    // the start of the third chunk (one chunk is 1 MiB: 2048 blocks)
    stamp(&t, &n, 0, 4096..4112).await;
    let token = populate(&t, &n, 0, 1, 0, &[(0, 6144)]).await;
    // the second chunk's write waits at LUN 1's disk
    held.writes.hold_range(2048, 4096);
    let task = {
        let (t, n) = (t.clone(), n.clone());
        tokio::spawn(async move { write_using(&t, &n, 1, 2, 0, &token, &[(0, 6144)]).await })
    };
    held.writes.arrivals(1).await;
    // the initiator now sees LUN 1 only
    t.set_host_groups(vec![initiators_group("copier", &["iqn.copier"], &[(1, 1)])])
        .unwrap();
    held.writes.open();
    let r = task.await.unwrap();
    assert_eq!(sense_of(&r), (key::COPY_ABORTED, 0x0d, 0x02), "{r:?}");
    let third = held.read(4096, 16).await.unwrap();
    assert!(third.iter().all(|&b| b == 0), "the third chunk was copied");
}

/// Two nodes with the same access rules written differently (group names,
/// order, initiator case, a name twice) describe LUN 0 alike; a group that
/// maps it under another number, or admits another initiator, does not.
#[test]
fn access_lines_depend_on_who_reaches_the_lu_not_on_how_it_is_written() {
    let (a, _) = target_with_two_luns();
    let (b, _) = target_with_two_luns();
    let group = |name: &str, initiators: &[&str], seen: u64| {
        initiators_group(name, initiators, &[(seen, 0)])
    };
    a.set_admission(vec!["initiator iqn.x".into(), "any CHAP".into()]);
    b.set_admission(vec![
        "any CHAP".into(),
        "initiator iqn.x".into(),
        "initiator iqn.x".into(),
    ]);
    a.set_host_groups(vec![
        group("one", &["iqn.a", "iqn.b"], 0),
        group("two", &["iqn.c"], 5),
    ])
    .unwrap();
    b.set_host_groups(vec![
        group("later", &["iqn.c"], 5),
        group("first", &["IQN.B", "iqn.a"], 0),
    ])
    .unwrap();
    assert_eq!(a.access_lines(0), b.access_lines(0));
    b.set_host_groups(vec![
        group("later", &["iqn.c"], 6),
        group("first", &["iqn.b", "iqn.a"], 0),
    ])
    .unwrap();
    assert_ne!(a.access_lines(0), b.access_lines(0));
    b.set_host_groups(vec![
        group("later", &["iqn.c"], 5),
        group("first", &["iqn.b", "iqn.a", "iqn.d"], 0),
    ])
    .unwrap();
    assert_ne!(a.access_lines(0), b.access_lines(0));
    assert_eq!(a.access_lines(9), None);
}

/// A host group of initiator names (no CHAP users) mapping `luns` (seen, LUN).
fn initiators_group(name: &str, initiators: &[&str], luns: &[(u64, u64)]) -> HostGroup {
    HostGroup {
        name: name.into(),
        initiators: initiators.iter().map(|s| s.to_string()).collect(),
        chap_users: vec![],
        luns: luns.to_vec(),
    }
}

/// A command that took a unit attention and was then aborted (never
/// answered) did not report it: the condition comes back, first, to the
/// nexus's next command, as a CHECK CONDITION or as REQUEST SENSE data; a
/// reset in between supersedes it; an answered command's condition is gone.
#[tokio::test]
async fn an_unanswered_unit_attention_is_reported_again() {
    let t = target();
    let a = nexus("1", 1);
    let tur = [0u8; 6];
    let r = run(&t, &a, &tur, &[]).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x29, 0x00));
    assert!(t.unanswered(&a, 0, &tur, &r), "kept");
    let r2 = run(&t, &a, &tur, &[]).await;
    assert_eq!(sense_of(&r2), (key::UNIT_ATTENTION, 0x29, 0x00));
    // answered this time: gone
    assert_eq!(run(&t, &a, &tur, &[]).await.status, status::GOOD);
    // taken by REQUEST SENSE, unanswered: back
    let b = nexus("2", 1);
    let rs = [0x03, 0, 0, 0, 18, 0];
    let r = run(&t, &b, &rs, &[]).await;
    assert_eq!(
        (r.status, r.data_in[2] & 0xf),
        (status::GOOD, key::UNIT_ATTENTION)
    );
    assert!(t.unanswered(&b, 0, &rs, &r));
    assert_eq!(
        sense_of(&run(&t, &b, &tur, &[]).await),
        (key::UNIT_ATTENTION, 0x29, 0x00)
    );
    assert_eq!(run(&t, &b, &tur, &[]).await.status, status::GOOD);
    // an answer that reported no unit attention restores nothing
    let good = run(&t, &b, &tur, &[]).await;
    assert!(!t.unanswered(&b, 0, &tur, &good));
    // a reset after the command took it: the reset's condition alone
    let c = nexus("3", 1);
    let r = run(&t, &c, &tur, &[]).await;
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x29, 0x00));
    let d = ready(&t, "4", 1).await;
    assert!(t.lun_reset(&d, 0).await);
    assert!(!t.unanswered(&c, 0, &tur, &r), "superseded by the reset");
    assert_eq!(
        sense_of(&run(&t, &c, &tur, &[]).await).0,
        key::UNIT_ATTENTION
    );
    assert_eq!(run(&t, &c, &tur, &[]).await.status, status::GOOD);
}
