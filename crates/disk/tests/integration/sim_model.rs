//! Deterministic tests of the HDD and SSD models in virtual time (no clock at all).

use disk::sim::{
    run_closed_loop, HddModel, HddParams, SimDiskConfig, SimError, SimModel, SimModelConfig, SimOp,
    SimOpKind, SsdModel, SsdParams, Workload,
};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const HDD_CAP: u64 = 1024 * GIB;

fn hdd() -> HddModel {
    HddModel::new(HddParams::default(), HDD_CAP).expect("valid params")
}

fn ssd() -> SsdModel {
    SsdModel::new(SsdParams::default(), 256 * GIB).expect("valid params")
}

/// Runs the model until every outstanding request completed; returns (tag, time).
fn drain(model: &mut dyn SimModel) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut done = Vec::new();
    while let Some(t) = model.next_event_ns() {
        done.clear();
        model.advance(t, &mut done);
        out.extend(done.iter().map(|&tag| (tag, t)));
    }
    out
}

fn within(x: f64, target: f64, rel: f64) -> bool {
    (x - target).abs() <= target * rel
}

// ---------------------------------------------------------------- HDD

#[test]
fn sim_hdd_seek_is_monotone_and_within_parameters() {
    let m = hdd();
    let p = HddParams::default();
    let t2t_ns = (p.track_to_track_seek_ms * 1e6) as u64;
    let full_ns = (p.full_stroke_seek_ms * 1e6) as u64;
    assert_eq!(m.seek_ns(0, 0), 0, "no seek in place");
    let mut prev = 0;
    for i in 0..=1000u64 {
        let to = HDD_CAP / 1000 * i;
        let s = m.seek_ns(0, to);
        assert!(s >= prev, "seek not monotone at {to}: {s} < {prev}");
        assert!(s <= full_ns, "seek {s} beyond full stroke");
        if s > 0 {
            assert!(s >= t2t_ns, "seek {s} shorter than track-to-track");
        }
        prev = s;
    }
    // A short hop just past one track costs about track-to-track.
    let hop = m.track_bytes(0) as u64 + 4096;
    let s = m.seek_ns(0, hop);
    assert!(s >= t2t_ns && s < t2t_ns + 200_000, "short seek {s}");
    assert!(within(m.seek_ns(0, HDD_CAP) as f64, full_ns as f64, 0.001));
    // The analytic average is in the 8-9 ms range the datasheets quote.
    assert!((8.0..9.0).contains(&p.avg_seek_ms()), "{}", p.avg_seek_ms());
    assert!(within(p.avg_rotation_ms(), 4.1667, 0.001));
}

#[test]
fn sim_hdd_sequential_requests_pay_no_positioning() {
    let mut m = hdd();
    let len = 256 * 1024;
    let start = 10 * GIB;
    m.submit(0, 0, SimOp::read(start, len));
    let t1 = drain(&mut m)[0].1;
    // Arrives long after: still sequential, so transfer time only.
    let t_arrive = t1 + 5_000_000;
    assert_eq!(
        m.positioning_ns(t_arrive, &SimOp::read(start + len, len)),
        0
    );
    m.submit(t_arrive, 1, SimOp::read(start + len, len));
    let t2 = drain(&mut m)[0].1;
    let xfer_ns = len as f64 * 1e3 / m.zone_mb_s(start + len);
    assert!(
        within((t2 - t_arrive) as f64, xfer_ns, 0.01),
        "{}",
        t2 - t_arrive
    );
    // A non-contiguous request pays command overhead at least.
    assert!(m.positioning_ns(t2, &SimOp::read(start + 3 * len, len)) >= 50_000);
}

#[test]
fn sim_hdd_ncq_picks_the_nearest_and_fifo_does_not() {
    for ncq in [true, false] {
        let params = HddParams {
            ncq,
            ..HddParams::default()
        };
        let mut m = HddModel::new(params, HDD_CAP).expect("valid");
        m.submit(0, 0, SimOp::read(0, 4096)); // on the actuator
        m.submit(1, 1, SimOp::read(HDD_CAP / 10 * 9, 4096)); // far
        m.submit(2, 2, SimOp::read(HDD_CAP / 2, 4096)); // middle
        m.submit(3, 3, SimOp::read(HDD_CAP / 100, 4096)); // near
        let order: Vec<u64> = drain(&mut m).iter().map(|&(tag, _)| tag).collect();
        assert_eq!(order[0], 0);
        if ncq {
            assert_eq!(order[1], 3, "NCQ must serve the nearest first: {order:?}");
        } else {
            assert_eq!(order, vec![0, 1, 2, 3], "FIFO without NCQ");
        }
    }
}

#[test]
fn sim_hdd_flush_is_a_barrier() {
    let mut m = hdd();
    m.submit(0, 0, SimOp::write(0, 4096));
    m.submit(1, 1, SimOp::write(HDD_CAP / 2, 4096));
    m.submit(2, 2, SimOp::flush());
    m.submit(3, 3, SimOp::write(HDD_CAP / 2 + 8192, 4096)); // nearest, but after the flush
    let order: Vec<u64> = drain(&mut m).iter().map(|&(tag, _)| tag).collect();
    assert_eq!(order, vec![0, 1, 2, 3]);
}

#[test]
fn sim_hdd_qd1_matches_the_analytic_service_time() {
    let p = HddParams::default();
    let mut m = hdd();
    let r = run_closed_loop(&mut m, &Workload::random_4k(false, 1, 3000, HDD_CAP));
    let analytic_ms = p.avg_random_service_ms(4096);
    let measured_ms = r.us_per_op() / 1e3;
    assert!(
        within(measured_ms, analytic_ms, 0.03),
        "qd1 {measured_ms} ms vs analytic {analytic_ms} ms"
    );
}

#[test]
fn sim_hdd_ncq_raises_iops_at_qd32() {
    let nominal = hdd().nominal();
    assert!(
        (70.0..90.0).contains(&nominal.rand_read_4k_iops_qd1),
        "{nominal:?}"
    );
    assert!(
        nominal.rand_read_4k_iops_qd32 > 2.0 * nominal.rand_read_4k_iops_qd1,
        "{nominal:?}"
    );
    assert!(within(nominal.seq_read_mb_s, 200.0, 0.02), "{nominal:?}");
    let no_ncq = HddModel::new(
        HddParams {
            ncq: false,
            ..HddParams::default()
        },
        HDD_CAP,
    )
    .expect("valid")
    .nominal();
    assert!(
        within(
            no_ncq.rand_read_4k_iops_qd32,
            no_ncq.rand_read_4k_iops_qd1,
            0.05
        ),
        "{no_ncq:?}"
    );
}

#[test]
fn sim_hdd_zones_slow_the_inner_tracks() {
    let m = hdd();
    assert!(within(m.zone_mb_s(0), 200.0, 1e-9));
    assert!(within(m.zone_mb_s(HDD_CAP), 120.0, 1e-9));
    let mut m = hdd();
    let mut w = Workload::sequential(false, MIB, 4, 200);
    w.span_bytes = HDD_CAP;
    let outer = run_closed_loop(&mut m, &w).mb_s();
    assert!(within(outer, 200.0, 0.02), "{outer}");
}

#[test]
fn sim_hdd_slow_sector_adds_service_time() {
    let mut a = hdd();
    let mut b = hdd();
    a.submit(0, 0, SimOp::read(GIB, 4096));
    b.submit(
        0,
        0,
        SimOp {
            extra_ns: 30_000_000,
            ..SimOp::read(GIB, 4096)
        },
    );
    assert_eq!(drain(&mut b)[0].1 - drain(&mut a)[0].1, 30_000_000);
}

// ---------------------------------------------------------------- SSD

fn link_read_ns(p: &SsdParams, bytes: u64) -> u64 {
    (p.command_overhead_us * 1e3 + bytes as f64 * 1e3 / p.link_read_mb_s) as u64
}

#[test]
fn sim_ssd_dies_work_in_parallel() {
    let p = SsdParams::default();
    let stripe = p.die_stripe_kib as u64 * 1024;
    let lat = (p.read_latency_us * 1e3) as u64;
    let link = link_read_ns(&p, 4096);
    for (n, waves) in [(8u64, 1u64), (16, 2)] {
        let mut m = ssd();
        for i in 0..n {
            m.submit(0, i, SimOp::read(i * stripe, 4096));
        }
        let last = drain(&mut m).iter().map(|&(_, t)| t).max().expect("done");
        // `waves` die latencies, plus the link serializing one wave's transfers.
        assert!(last >= waves * lat, "{n} reads in {last} ns");
        assert!(
            last <= waves * lat + 8 * (link + 1),
            "{n} reads in {last} ns"
        );
    }
    // Eight reads on one die take eight latencies.
    let mut m = ssd();
    for i in 0..8 {
        m.submit(0, i, SimOp::read(i * stripe * p.dies as u64, 4096));
    }
    let last = drain(&mut m).iter().map(|&(_, t)| t).max().expect("done");
    assert!(last >= 8 * lat, "{last}");
}

#[test]
fn sim_ssd_transfer_is_capped_by_the_link() {
    let p = SsdParams::default();
    for write in [false, true] {
        let mut m = ssd();
        let op = if write {
            SimOp::write(0, MIB)
        } else {
            SimOp::read(0, MIB)
        };
        m.submit(0, 0, op);
        let t = drain(&mut m)[0].1 as f64;
        let rate = if write {
            p.link_write_mb_s
        } else {
            p.link_read_mb_s
        };
        let ideal_ns = MIB as f64 * 1e3 / rate;
        assert!(t >= ideal_ns, "1 MiB in {t} ns < {ideal_ns}");
        assert!(t <= ideal_ns * 1.1, "1 MiB in {t} ns >> {ideal_ns}");
        // A stream can never beat the link.
        let mut m = ssd();
        let mb_s = run_closed_loop(&mut m, &Workload::sequential(write, MIB, 8, 200)).mb_s();
        assert!(
            mb_s <= rate * 1.001 && mb_s >= rate * 0.95,
            "{write} {mb_s}"
        );
    }
}

#[test]
fn sim_ssd_sustained_write_is_limited_by_program_rate() {
    let p = SsdParams {
        program_mb_s: 100.0,
        write_buffer_mib: 4,
        ..SsdParams::default()
    };
    let mut m = SsdModel::new(p, 64 * GIB).expect("valid");
    // 400 MiB through a 4 MiB buffer: burst at link rate, then the program rate.
    let r = run_closed_loop(&mut m, &Workload::sequential(true, MIB, 8, 400));
    assert!(within(r.mb_s(), 100.0, 0.03), "{}", r.mb_s());
}

#[test]
fn sim_ssd_flush_waits_for_the_buffer() {
    let p = SsdParams {
        program_mb_s: 100.0,
        ..SsdParams::default()
    };
    let mut m = SsdModel::new(p.clone(), 64 * GIB).expect("valid");
    m.submit(0, 0, SimOp::write(0, MIB));
    m.submit(0, 1, SimOp::flush());
    let times = drain(&mut m);
    let flush_t = times.iter().find(|&&(tag, _)| tag == 1).expect("flush").1;
    // 1 MiB at 100 MB/s drains in ~10.5 ms.
    assert!(flush_t as f64 >= MIB as f64 * 1e3 / 100.0, "{flush_t}");
}

#[test]
fn sim_ssd_nominal_figures_are_sata_like() {
    let n = ssd().nominal();
    assert!(
        (9_000.0..12_000.0).contains(&n.rand_read_4k_iops_qd1),
        "{n:?}"
    );
    assert!(
        (75_000.0..96_000.0).contains(&n.rand_read_4k_iops_qd32),
        "{n:?}"
    );
    assert!(
        (80_000.0..100_000.0).contains(&n.rand_write_4k_iops_qd32),
        "{n:?}"
    );
    assert!(within(n.seq_read_mb_s, 520.0, 0.02), "{n:?}");
    assert!(within(n.seq_write_mb_s, 480.0, 0.02), "{n:?}");
}

#[test]
fn sim_trims_are_cheap() {
    let mut m = ssd();
    m.submit(
        0,
        0,
        SimOp {
            kind: SimOpKind::Trim,
            offset_bytes: 0,
            len_bytes: GIB,
            extra_ns: 0,
        },
    );
    assert!(drain(&mut m)[0].1 < 100_000);
}

// ---------------------------------------------------------------- config

#[test]
fn sim_params_are_validated() {
    let bad = HddParams {
        rpm: 0,
        ..HddParams::default()
    };
    assert!(matches!(
        HddModel::new(bad, GIB),
        Err(SimError::InvalidParam { name: "rpm", .. })
    ));
    let bad = SsdParams {
        link_read_mb_s: f64::NAN,
        ..SsdParams::default()
    };
    assert!(SsdModel::new(bad, GIB).is_err());
    assert!(HddModel::new(HddParams::default(), 0).is_err());
}

#[test]
fn sim_config_reads_from_toml_with_defaults() {
    let cfg: SimDiskConfig = toml::from_str(
        r#"
        model = "hdd"
        rpm = 5400
        queue_depth_max = 64
    "#,
    )
    .expect("parse");
    assert_eq!(cfg.queue_depth_max, 64);
    match &cfg.model {
        SimModelConfig::Hdd(p) => {
            assert_eq!(p.rpm, 5400);
            assert_eq!(p.ncq_depth, 32);
        }
        other => panic!("wrong model {other:?}"),
    }
    let ssd: SimDiskConfig = toml::from_str("model = \"ssd\"\ndies = 4").expect("parse");
    assert!(
        matches!(&ssd.model, SimModelConfig::Ssd(p) if p.dies == 4 && p.read_latency_us == 85.0)
    );
    let text = toml::to_string(&cfg).expect("serialize");
    let back: SimDiskConfig = toml::from_str(&text).expect("reparse");
    assert_eq!(back, cfg);
}
