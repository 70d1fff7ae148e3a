//! Durability at the SCSI layer against a volume with a volatile write cache that
//! loses everything unflushed on `crash()`: SYNCHRONIZE CACHE, FUA and WCE=0 must
//! each make acknowledged data survive, and a plain write with WCE=1 may not.

use block::{Bytes, CrashSimVolume, Volume};
use scsi::{
    AluaState, Command, ItNexus, LunConfig, PortGroup, ScsiTarget, TargetConfig, TargetPort,
    TaskAttr,
};
use std::sync::Arc;

const BS: usize = 512;

fn target(vol: Arc<CrashSimVolume>) -> ScsiTarget {
    ScsiTarget::new(TargetConfig {
        name: "iqn.2026-11.org.freesan:pl".into(),
        ports: vec![TargetPort {
            relative_id: 1,
            group_id: 1,
            name: "iqn.2026-11.org.freesan:pl,t,0x0001".into(),
        }],
        port_groups: vec![PortGroup {
            id: 1,
            state: AluaState::ActiveOptimized,
            relative_port_ids: vec![1],
        }],
        luns: vec![(
            0,
            LunConfig {
                naa: [0x60; 16],
                serial: "pl0".into(),
                vendor: "FREESAN".into(),
                product: "test".into(),
                revision: "0001".into(),
                read_only: false,
                state_file: None,
                physical_block_exponent: 0,
                sanitize_rate_bytes_per_s: 0,
            },
            vol,
        )],
    })
    .unwrap()
}

fn nexus() -> ItNexus {
    ItNexus {
        initiator_name: "iqn.x:i".into(),
        initiator_port: "iqn.x:i,i,0x000000000001".into(),
        relative_port_id: 1,
        chap_user: None,
    }
}

async fn exec(t: &ScsiTarget, cdb: &[u8], data: &[u8]) -> scsi::Response {
    t.execute(
        &nexus(),
        Command {
            cdb: Bytes::copy_from_slice(cdb),
            lun: 0,
            data_out: Bytes::copy_from_slice(data),
            data_in_len_max: 1 << 20,
            attr: TaskAttr::Simple,
        },
    )
    .await
}

fn write10(lba: u32, blocks: u16, fua: bool) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x2a;
    c[1] = if fua { 0x08 } else { 0 };
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// Clears the POWER ON unit attention every new nexus starts with.
async fn settle(t: &ScsiTarget) {
    for _ in 0..4 {
        if exec(t, &[0, 0, 0, 0, 0, 0], &[]).await.status == 0 {
            return;
        }
    }
    panic!("TEST UNIT READY never succeeded");
}

/// MODE SELECT(6) of the caching page as MODE SENSE reports it, WCE cleared.
async fn write_cache_off(t: &ScsiTarget) {
    let r = exec(t, &[0x1a, 0x08, 0x08, 0, 255, 0], &[]).await;
    assert_eq!(r.status, 0);
    let page = &r.data_in[4..];
    let mut params = vec![0u8; 4];
    let mut p = page[..page[1] as usize + 2].to_vec();
    p[0] &= 0x3f;
    p[2] &= !0x04;
    params.extend_from_slice(&p);
    let sel = [0x15, 0x10, 0, 0, params.len() as u8, 0];
    let r = exec(t, &sel, &params).await;
    assert_eq!(r.status, 0, "MODE SELECT WCE=0 refused: {:?}", r.sense);
}

async fn block_after_crash(vol: &CrashSimVolume, lba: u64) -> u8 {
    vol.crash();
    vol.read(lba, 1).await.unwrap()[0]
}

#[tokio::test]
async fn unsynced_write_is_lost_but_synchronize_cache_keeps_it() {
    let vol = Arc::new(CrashSimVolume::new(BS as u32, 1024));
    let t = target(vol.clone());
    settle(&t).await;
    assert_eq!(
        exec(&t, &write10(10, 1, false), &[0xaa; BS]).await.status,
        0
    );
    assert_eq!(
        block_after_crash(&vol, 10).await,
        0,
        "the simulator kept an unflushed write"
    );
    assert_eq!(
        exec(&t, &write10(10, 1, false), &[0xbb; BS]).await.status,
        0
    );
    let sync10 = [0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(exec(&t, &sync10, &[]).await.status, 0);
    assert_eq!(
        block_after_crash(&vol, 10).await,
        0xbb,
        "SYNCHRONIZE CACHE did not flush"
    );
}

#[tokio::test]
async fn fua_write_survives() {
    let vol = Arc::new(CrashSimVolume::new(BS as u32, 1024));
    let t = target(vol.clone());
    settle(&t).await;
    assert_eq!(
        exec(&t, &write10(20, 2, true), &[0xcc; 2 * BS])
            .await
            .status,
        0
    );
    assert_eq!(block_after_crash(&vol, 21).await, 0xcc, "FUA write lost");
}

#[tokio::test]
async fn wce_reports_the_cache_and_clearing_it_makes_writes_durable() {
    let vol = Arc::new(CrashSimVolume::new(BS as u32, 1024));
    let t = target(vol.clone());
    settle(&t).await;
    // MODE SENSE(6) caching page: WCE must be 1 over a volatile cache
    let r = exec(&t, &[0x1a, 0x08, 0x08, 0, 255, 0], &[]).await;
    assert_eq!(r.status, 0);
    let page = &r.data_in[4..];
    assert_eq!(page[0] & 0x3f, 0x08);
    assert_eq!(page[2] & 0x04, 0x04, "WCE=0 reported over a volatile cache");
    write_cache_off(&t).await;
    assert_eq!(t.write_cache_enabled(0), Some(false));
    assert_eq!(
        exec(&t, &write10(30, 1, false), &[0xdd; BS]).await.status,
        0
    );
    assert_eq!(
        block_after_crash(&vol, 30).await,
        0xdd,
        "write with WCE=0 lost"
    );
}

/// UNMAP of one block at `lba`.
async fn unmap(t: &ScsiTarget, lba: u64) -> scsi::Response {
    let mut p = vec![0u8; 24];
    p[0..2].copy_from_slice(&22u16.to_be_bytes());
    p[2..4].copy_from_slice(&16u16.to_be_bytes());
    p[8..16].copy_from_slice(&lba.to_be_bytes());
    p[16..20].copy_from_slice(&1u32.to_be_bytes());
    let mut c = [0u8; 10];
    c[0] = 0x42;
    c[7..9].copy_from_slice(&(p.len() as u16).to_be_bytes());
    exec(t, &c, &p).await
}

/// An UNMAP is durable as a write is: after SYNCHRONIZE CACHE with the write
/// cache on, at once with it off (WCE=0 promises nothing is held volatile).
/// The volume keeps an unflushed discard volatile, as a disk's cache may.
#[tokio::test]
async fn an_unmap_is_durable_after_synchronize_cache_and_at_once_with_wce_off() {
    let vol = Arc::new(CrashSimVolume::new(BS as u32, 1024));
    let t = target(vol.clone());
    settle(&t).await;
    for lba in [40u32, 41] {
        let r = exec(&t, &write10(lba, 1, true), &[0xee; BS]).await;
        assert_eq!(r.status, 0);
    }
    let r = unmap(&t, 40).await;
    assert_eq!(r.status, 0, "{:?}", r.sense);
    let sync10 = [0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(exec(&t, &sync10, &[]).await.status, 0);
    assert_eq!(block_after_crash(&vol, 40).await, 0, "synced UNMAP lost");
    // the write cache off: the UNMAP itself is durable
    write_cache_off(&t).await;
    let r = unmap(&t, 41).await;
    assert_eq!(r.status, 0, "{:?}", r.sense);
    assert_eq!(
        block_after_crash(&vol, 41).await,
        0,
        "UNMAP acknowledged with WCE=0 lost"
    );
}
