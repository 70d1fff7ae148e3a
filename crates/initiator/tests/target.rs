//! The initiator against the real freesan target, in-process.

mod common;

use block::{Bytes, MemVolume, Volume};
use common::*;
use initiator::*;
use rand::{Rng, SeedableRng};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

fn opts() -> OpenOptions {
    OpenOptions {
        initiator_name: INI.into(),
        ..OpenOptions::default()
    }
}

fn login(iqn: &str, qualifier: u8) -> LoginOptions {
    let mut o = LoginOptions::new(INI, iqn);
    o.isid[5] = qualifier;
    o
}

/// `ios` random reads and writes with `in_flight` outstanding, checked against an
/// oracle. Writes and reads of the same block never overlap in time (each worker
/// owns its own blocks), so the oracle is exact.
async fn random_io(
    vol: Arc<dyn Volume>,
    oracle: Arc<MemVolume>,
    ios: usize,
    in_flight: usize,
    seed: u64,
) {
    let g = vol.geometry();
    assert_eq!((g.block_size_bytes, g.block_count), (512, BLOCKS));
    let mut set = tokio::task::JoinSet::new();
    for w in 0..in_flight {
        let (vol, oracle) = (vol.clone(), oracle.clone());
        set.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 1000 + w as u64);
            let region = BLOCKS / in_flight as u64;
            let base = w as u64 * region;
            for _ in 0..ios / in_flight {
                let blocks = rng.gen_range(1..=16u32);
                let lba = base + rng.gen_range(0..region - blocks as u64);
                if rng.gen_bool(0.5) {
                    let mut d = vec![0u8; blocks as usize * 512];
                    rng.fill(&mut d[..]);
                    let d = Bytes::from(d);
                    vol.write(lba, d.clone(), rng.gen_bool(0.1))
                        .await
                        .expect("write");
                    oracle.write(lba, d, false).await.unwrap();
                } else {
                    let got = vol.read(lba, blocks).await.expect("read");
                    let want = oracle.read(lba, blocks).await.unwrap();
                    assert!(
                        got == want,
                        "data mismatch at lba {lba} + {blocks}: got {} bytes {:?}.. want {:?}..",
                        got.len(),
                        &got[..4],
                        &want[..4]
                    );
                }
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.expect("worker");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_url_discovers_both_portals_and_roundtrips() {
    let fx = start(iscsi::Limits::default()).await;
    let targets = discover(fx.addrs[0], INI, None).await.unwrap();
    let open = targets
        .iter()
        .find(|t| t.0 == OPEN)
        .expect("open target listed");
    assert_eq!(
        open.1,
        vec![(fx.addrs[0], 1), (fx.addrs[1], 2)],
        "both portals with their TPGT"
    );
    assert!(targets.iter().any(|t| t.0 == SECURE));
    let mp = open_multipath(&url(fx.addrs[0], OPEN), &opts())
        .await
        .unwrap();
    assert_eq!(mp.path_count(), 2);
    assert_eq!(mp.identity().map(|x| x.len()), Some(16));
    let vol: Arc<dyn Volume> = Arc::new(mp.clone());
    random_io(vol, Arc::new(MemVolume::new(512, BLOCKS)), 4000, 32, 1).await;
    let stats = mp.path_stats();
    assert!(
        stats.iter().all(|s| s.healthy && s.reads + s.writes > 500),
        "{stats:?}"
    );
    assert!(mp.path_event_history().is_empty());
    // single_path uses only the URL's portal.
    let mut o = opts();
    o.single_path = true;
    let one = open_multipath(&url(fx.addrs[1], OPEN), &o).await.unwrap();
    assert_eq!(one.path_count(), 1);
    assert_eq!(one.path_stats()[0].addr, fx.addrs[1]);
    one.logout().await;
    mp.logout().await;
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chap_login_and_wrong_secret() {
    let fx = start(iscsi::Limits::default()).await;
    let good = format!("iscsi://alice%alice-secret-12@{}/{SECURE}/0", fx.addrs[0]);
    let mut o = opts();
    o.mutual_chap = Some(("target".into(), "target-secret-12".into()));
    let vol = open_url(&good, &o).await.expect("CHAP login");
    vol.write(10, Bytes::from(vec![5u8; 1024]), false)
        .await
        .unwrap();
    assert_eq!(&vol.read(10, 2).await.unwrap()[..], &[5u8; 1024][..]);
    let bad = format!("iscsi://alice%wrong-secret-99@{}/{SECURE}/0", fx.addrs[0]);
    let e = open_url(&bad, &o)
        .await
        .err()
        .expect("wrong secret must fail");
    assert!(
        matches!(
            e,
            InitiatorError::LoginFailed {
                class: 2,
                detail: 1
            }
        ),
        "{e}"
    );
    let mut bad_mutual = o.clone();
    bad_mutual.mutual_chap = Some(("target".into(), "something-else".into()));
    let e = open_url(&good, &bad_mutual)
        .await
        .err()
        .expect("bad target secret must fail");
    assert!(matches!(e, InitiatorError::Auth(_)), "{e}");
    let e = open_url(&url(fx.addrs[0], SECURE), &opts())
        .await
        .err()
        .expect("no CHAP");
    assert!(
        matches!(e, InitiatorError::LoginFailed { class: 2, .. }),
        "{e}"
    );
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_to_group_different_luns() {
    let fx = start(iscsi::Limits::default()).await;
    let a = IscsiLun::connect(fx.addrs[0], &login(OPEN, 1), 0, LunOptions::default())
        .await
        .unwrap();
    let mut sl = login(SECURE, 2);
    sl.chap = Some(("alice".into(), "alice-secret-12".into()));
    let b = IscsiLun::connect(fx.addrs[1], &sl, 0, LunOptions::default())
        .await
        .unwrap();
    let e = Multipath::new(vec![a, b], MultipathOptions::default()).expect_err("refused");
    assert!(matches!(e, InitiatorError::IdentityMismatch(_)));
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_path_fails_over_without_errors_and_comes_back() {
    let fx = start(iscsi::Limits::default()).await;
    let proxy = Proxy::start(fx.addrs[1]).await;
    let mut lo = login(OPEN, 1);
    lo.command_timeout_ms = 3000;
    let direct = IscsiLun::connect(fx.addrs[0], &lo, 0, LunOptions::default())
        .await
        .unwrap();
    let mut lo2 = login(OPEN, 2);
    lo2.command_timeout_ms = 3000;
    let proxied = IscsiLun::connect(proxy.addr, &lo2, 0, LunOptions::default())
        .await
        .unwrap();
    let mp = Multipath::new(
        vec![direct, proxied],
        MultipathOptions {
            reconnect_backoff_min_ms: 50,
            reconnect_backoff_max_ms: 200,
            ..MultipathOptions::default()
        },
    )
    .unwrap();
    let mut events = mp.path_events();
    let vol: Arc<dyn Volume> = Arc::new(mp.clone());
    let oracle = Arc::new(MemVolume::new(512, BLOCKS));
    let io = tokio::spawn(random_io(vol.clone(), oracle.clone(), 6000, 32, 2));
    // cut the proxied path once it carries I/O (not after a guessed delay: on a
    // loaded machine the I/O may not have started, on an idle one it may be over)
    let served = |mp: &Multipath| {
        let s = &mp.path_stats()[1];
        s.reads + s.writes
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        while served(&mp) < 50 && !io.is_finished() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the proxied path carried I/O");
    if std::env::var("NO_CUT").is_err() {
        proxy.cut();
    }
    // the failure is seen by the next command on the cut path: if the random
    // I/O ended before it reached one, reads go on until the event comes
    let ev = tokio::time::timeout(Duration::from_secs(10), async {
        let mut lba = 0;
        loop {
            tokio::select! {
                ev = events.recv() => break ev,
                _ = vol.read(lba % BLOCKS, 1), if io.is_finished() => lba += 1,
            }
        }
    })
    .await
    .expect("a path event")
    .unwrap();
    assert_eq!(ev.path_index, 1);
    assert_eq!(ev.addr, proxy.addr);
    assert!(matches!(ev.kind, PathEventKind::Failed { .. }), "{ev:?}");
    io.await.expect("I/O went on with no error");
    assert!(!mp.path_stats()[1].healthy);
    // I/O with the path down goes to the other path.
    let before = mp.path_stats()[0].writes;
    vol.write(1, Bytes::from(vec![1u8; 512]), false)
        .await
        .unwrap();
    oracle
        .write(1, Bytes::from(vec![1u8; 512]), false)
        .await
        .unwrap();
    assert_eq!(mp.path_stats()[0].writes, before + 1);
    proxy.heal();
    let ev = tokio::time::timeout(Duration::from_secs(10), events.recv())
        .await
        .expect("restored")
        .unwrap();
    assert_eq!(
        (ev.path_index, ev.kind.clone()),
        (1, PathEventKind::Restored)
    );
    assert!(mp.path_stats()[1].healthy);
    random_io(vol, oracle, 1000, 8, 3).await;
    assert_eq!(mp.path_event_history().len(), 2);
    mp.logout().await;
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_only_uses_one_path() {
    let fx = start(iscsi::Limits::default()).await;
    let mut o = opts();
    o.policy = PathPolicy::FailoverOnly;
    let mp = open_multipath(&url(fx.addrs[0], OPEN), &o).await.unwrap();
    for i in 0..50 {
        mp.write(i, Bytes::from(vec![i as u8; 512]), false)
            .await
            .unwrap();
    }
    let s = mp.path_stats();
    assert_eq!((s[0].writes, s[1].writes), (50, 0));
    mp.fail_path(0, "maintenance");
    for i in 0..50 {
        assert_eq!(mp.read(i, 1).await.unwrap()[0], i as u8);
    }
    assert_eq!(mp.path_stats()[1].reads, 50);
    mp.logout().await;
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_writes_use_r2t_with_digests() {
    let limits = iscsi::Limits {
        max_recv_data_segment_bytes: 8192,
        first_burst_bytes: 16384,
        max_burst_bytes: 65536,
        ..iscsi::Limits::default()
    };
    let fx = start(limits).await;
    for digests in [false, true] {
        let mut lo = login(OPEN, 7);
        lo.header_digest = digests;
        lo.data_digest = digests;
        let s = Session::login(fx.addrs[0], &lo).await.unwrap();
        let p = s.params().clone();
        assert_eq!(p.send_data_segment_bytes_max, 8192);
        assert_eq!(p.first_burst_bytes, 16384);
        assert_eq!(p.max_burst_bytes, 65536);
        assert_eq!((p.header_digest, p.data_digest), (digests, digests));
        let lun = IscsiLun::open(s.clone(), 0, LunOptions::default())
            .await
            .unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let mut d = vec![0u8; 1024 * 1024 + 512];
        rng.fill(&mut d[..]);
        let d = Bytes::from(d);
        lun.write(100, d.clone(), false).await.unwrap();
        assert!(lun.read(100, (d.len() / 512) as u32).await.unwrap() == d);
        let direct = fx
            .counting
            .inner
            .read(100, (d.len() / 512) as u32)
            .await
            .unwrap();
        assert!(direct == d, "data reached the target's volume");
        // Many concurrent mid-size writes with R2T interleaved.
        let lun = Arc::new(lun);
        let mut set = tokio::task::JoinSet::new();
        for k in 0..16u64 {
            let lun = lun.clone();
            set.spawn(async move {
                let d = Bytes::from(vec![k as u8 + 1; 100 * 1024]);
                lun.write(4000 + k * 200, d.clone(), false).await.unwrap();
                assert!(lun.read(4000 + k * 200, 200).await.unwrap() == d);
            });
        }
        while let Some(r) = set.join_next().await {
            r.unwrap();
        }
        s.logout().await.unwrap();
        assert!(s.is_closed());
    }
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_fua_unmap_and_write_zeroes_reach_the_target() {
    let fx = start(iscsi::Limits::default()).await;
    let mp = open_multipath(&url(fx.addrs[0], OPEN), &opts())
        .await
        .unwrap();
    let g = mp.geometry();
    assert!(g.thin, "MemVolume is thin: LBPME");
    assert!(g.volatile_cache, "WCE from the caching mode page");
    let c = &fx.counting;
    let (f0, u0) = (
        c.flushes.load(Ordering::SeqCst),
        c.fua_writes.load(Ordering::SeqCst),
    );
    mp.write(0, Bytes::from(vec![3u8; 4096]), true)
        .await
        .unwrap();
    assert_eq!(
        c.fua_writes.load(Ordering::SeqCst),
        u0 + 1,
        "FUA reached the volume"
    );
    mp.write(8, Bytes::from(vec![3u8; 4096]), false)
        .await
        .unwrap();
    assert_eq!(c.fua_writes.load(Ordering::SeqCst), u0 + 1);
    mp.flush().await.unwrap();
    assert!(
        c.flushes.load(Ordering::SeqCst) > f0,
        "flush reached the volume"
    );
    mp.discard(0, 8).await.unwrap();
    assert_eq!(&mp.read(0, 8).await.unwrap()[..], &[0u8; 4096][..]);
    mp.write_zeroes(8, 8, false).await.unwrap();
    assert_eq!(&mp.read(8, 8).await.unwrap()[..], &[0u8; 4096][..]);
    mp.write(20, Bytes::from(vec![4u8; 512]), false)
        .await
        .unwrap();
    mp.write_zeroes(16, 8, true).await.unwrap();
    assert_eq!(&mp.read(16, 8).await.unwrap()[..], &[0u8; 4096][..]);
    let e = mp.read(BLOCKS - 1, 2).await.expect_err("out of range");
    assert!(matches!(e, block::BlockError::OutOfRange { .. }));
    mp.logout().await;
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_commands_and_window() {
    let limits = iscsi::Limits {
        commands_in_flight_per_session_max: 4,
        ..iscsi::Limits::default()
    };
    let fx = start(limits).await;
    let s = Session::login(fx.addrs[0], &login(OPEN, 3)).await.unwrap();
    // INQUIRY standard data.
    let r = s
        .command(0, &[0x12, 0, 0, 0, 96, 0], Bytes::new(), 96)
        .await
        .unwrap();
    assert_eq!(r.status, 0);
    assert!(r.data_in.len() >= 36);
    assert_eq!(&r.data_in[8..15], b"FREESAN");
    // Clear the POWER ON unit attention of this new nexus.
    let mut tur = 0;
    while s.command(0, &[0; 6], Bytes::new(), 0).await.unwrap().status != 0 {
        tur += 1;
        assert!(tur < 5);
    }
    // An unknown opcode answers CHECK CONDITION / ILLEGAL REQUEST.
    let r = s
        .command(0, &[0xff, 0, 0, 0, 0, 0], Bytes::new(), 0)
        .await
        .unwrap();
    assert_eq!(r.status, 2);
    assert_eq!(parse_sense(r.sense.as_deref().unwrap()).unwrap().key, 5);
    // Far more commands than the 4-command window, all at once.
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let s = s.clone();
        set.spawn(async move { s.command(0, &[0; 6], Bytes::new(), 0).await });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap().unwrap();
    }
    s.logout().await.unwrap();
    assert!(s.command(0, &[0; 6], Bytes::new(), 0).await.is_err());
    fx.shutdown().await;
}
