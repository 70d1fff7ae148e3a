use super::fake_result;
use crate::{chart, RunResult, Suite};

/// Three configurations of the standard suite with made-up but plausible figures.
pub(crate) fn sample_configs() -> Vec<(String, Vec<RunResult>)> {
    let configs = [
        ("tgt (baseline)", 0.55f64),
        ("freesan RAID10", 1.0),
        ("freesan RAID10 + SSD cache", 2.7),
    ];
    configs
        .iter()
        .map(|(label, factor)| {
            let rs = Suite::standard()
                .workloads
                .iter()
                .map(|w| {
                    let base = match w.block_size_bytes {
                        4096 => 48_000.0,
                        8192 => 31_000.0,
                        65536 => 3_400.0,
                        _ => 900.0,
                    };
                    let f = if w.block_size_bytes >= 65536 {
                        factor.min(1.2f64)
                    } else {
                        *factor
                    };
                    fake_result(w, base * f * (1.0 - w.read_pct as f64 / 400.0), 1000.0 / f)
                })
                .collect();
            (label.to_string(), rs)
        })
        .collect()
}

#[test]
fn svg_has_every_label_and_a_bar_per_config_and_pattern() {
    let configs = sample_configs();
    let c = chart(&configs);
    assert!(c.svg.starts_with("<svg"));
    for (label, rs) in &configs {
        assert!(
            c.svg.contains(&format!(">{label}</text>")),
            "legend {label}"
        );
        for r in rs {
            assert!(
                c.svg.contains(&format!(">{}</text>", r.name)),
                "pattern {}",
                r.name
            );
            assert!(
                c.svg.contains(&format!(
                    r#"class="bar" data-config="{label}" data-pattern="{}""#,
                    r.name
                )),
                "bar {label} {}",
                r.name
            );
        }
    }
    assert_eq!(c.svg.matches(r#"class="bar""#).count(), 24);
    assert_eq!(c.svg.matches(r#"class="value""#).count(), 24);
    assert!(c.svg.contains(">IOPS</text>") && c.svg.contains(">MB/s</text>"));
    // The IOPS panel holds only small-block patterns, in suite order.
    let first = c.svg.find(r#"data-pattern="4k-randread""#).unwrap();
    let large = c.svg.find(r#"data-pattern="64k-seqread""#).unwrap();
    assert!(first < large);
    // Escaping.
    let mut odd = sample_configs();
    odd[0].0 = "a<b & c".into();
    let c = chart(&odd);
    assert!(c.svg.contains("a&lt;b &amp; c") && !c.svg.contains("a<b"));
}

#[test]
fn png_renders() {
    let c = chart(&sample_configs());
    let png = c.to_png().expect("png");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(
        png.len() > 20_000,
        "suspiciously small PNG: {} bytes",
        png.len()
    );
    // Width and height from the IHDR chunk.
    let w = u32::from_be_bytes([png[16], png[17], png[18], png[19]]);
    let h = u32::from_be_bytes([png[20], png[21], png[22], png[23]]);
    assert_eq!((w, h), (1400, 660));
    if let Ok(dir) = std::env::var("BENCH_CHART_DIR") {
        std::fs::write(format!("{dir}/bench-chart-3cfg.png"), &png).unwrap();
        let two: Vec<_> = sample_configs().into_iter().skip(1).collect();
        std::fs::write(
            format!("{dir}/bench-chart-2cfg.png"),
            chart(&two).to_png().unwrap(),
        )
        .unwrap();
        let one: Vec<_> = sample_configs().into_iter().take(1).collect();
        std::fs::write(
            format!("{dir}/bench-chart-1cfg.png"),
            chart(&one).to_png().unwrap(),
        )
        .unwrap();
        std::fs::write(format!("{dir}/bench-chart-3cfg.svg"), &c.svg).unwrap();
        // Six configurations with large figures: narrow bars, rotated labels, M suffix.
        let mut six = sample_configs();
        six.extend(sample_configs().into_iter().map(|(l, rs)| {
            let rs = rs
                .into_iter()
                .map(|mut r| {
                    r.iops *= 13.0;
                    r.mb_per_sec *= 17.0;
                    r
                })
                .collect();
            (format!("{l}, 25GbE"), rs)
        }));
        std::fs::write(
            format!("{dir}/bench-chart-6cfg.png"),
            chart(&six).to_png().unwrap(),
        )
        .unwrap();
    }
}

#[test]
fn empty_chart_is_still_a_picture() {
    let c = chart(&[]);
    assert!(c.svg.contains("no results"));
    assert!(c.to_png().unwrap().len() > 1000);
}
