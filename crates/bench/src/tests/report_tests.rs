use super::fake_result;
use crate::report::rfc3339_utc;
use crate::{
    csv_from_str, summary_line, text_table, to_csv, CsvRow, Report, ReportMeta, Suite,
    VerifyFailure, VerifyKind, VerifySummary,
};

fn suite_results() -> Vec<crate::RunResult> {
    Suite::standard()
        .workloads
        .iter()
        .enumerate()
        .map(|(i, w)| fake_result(w, 123_456.0 / (i + 1) as f64, 258.0 * (i + 1) as f64))
        .collect()
}

#[test]
fn json_roundtrip_keeps_everything() {
    let mut results = suite_results();
    results[1].verify = Some(VerifySummary {
        passed: false,
        reads_checked: 10,
        reads_unwritten: 2,
        failures: 1,
        first_failure: Some(VerifyFailure {
            kind: VerifyKind::LostWrite,
            lba: 4242,
            block: 530,
            gen_min: 3,
            gen_max: 3,
            found_gen: Some(2),
            found_lba: Some(4242),
            found_writer: Some(0x10003),
        }),
    });
    results[2].first_error = Some("write at lba 8: i/o error".into());
    let report = Report {
        meta: ReportMeta::new("iscsi://127.0.0.1/iqn.2026-01.org.freesan:lun0/0"),
        results,
    };
    let json = report.to_json().unwrap();
    assert!(json.contains("\"freesan_version\"") && json.contains("\"lost_write\""));
    let back = Report::from_json(&json).unwrap();
    assert_eq!(back, report);
    assert!(!report.meta.host.is_empty());
    assert!(report.meta.date_utc.ends_with('Z') && report.meta.date_utc.len() == 20);
    assert!(Report::from_json("{\"meta\": 1}").is_err());
}

#[test]
fn csv_roundtrip() {
    let mut results = suite_results();
    results[0].name = "odd, \"quoted\" name".into();
    results[3].verify = Some(VerifySummary {
        passed: true,
        reads_checked: 1,
        reads_unwritten: 0,
        failures: 0,
        first_failure: None,
    });
    let csv = to_csv(&results);
    assert_eq!(csv.lines().count(), 9);
    assert!(csv.starts_with("name,block_size_bytes,read_pct,"));
    let rows = csv_from_str(&csv).unwrap();
    let want: Vec<CsvRow> = results.iter().map(CsvRow::from).collect();
    assert_eq!(rows, want);
    assert_eq!(rows[3].verify, "ok");
    assert!(csv_from_str("bad header\n").is_err());
    let broken = csv.replacen("123456", "12x456", 1);
    assert!(matches!(
        csv_from_str(&broken),
        Err(crate::BenchError::Csv { line: 2, .. })
    ));
}

#[test]
fn summary_line_format() {
    let w = Suite::standard().workloads[0].clone();
    let mut r = fake_result(&w, 123_456.4, 258.3);
    r.mb_per_sec = 505.66;
    assert_eq!(
        summary_line(std::slice::from_ref(&r)),
        "summary: 4k-randread iops=123456 mbps=505.7 lat_avg_us=258 errors=0"
    );
    r.write_errors = 3;
    r.verify = Some(VerifySummary {
        passed: true,
        reads_checked: 1,
        reads_unwritten: 0,
        failures: 0,
        first_failure: None,
    });
    assert_eq!(
        summary_line(std::slice::from_ref(&r)),
        "summary: 4k-randread iops=123456 mbps=505.7 lat_avg_us=258 errors=3 verify=ok"
    );
    let all = suite_results();
    let line = summary_line(&all);
    assert!(line.starts_with("summary: 4k-randread iops=123456 mbps=505.7 lat_avg_us=258 errors=0 | 4k-randwrite iops=61728 "));
    let items: Vec<&str> = line.trim_start_matches("summary: ").split(" | ").collect();
    assert_eq!(items.len(), all.len(), "one item per pattern, no total");
    for (item, r) in items.iter().zip(&all) {
        assert!(
            item.starts_with(&format!("{} iops={:.0} ", r.name, r.iops)),
            "{item}"
        );
    }
    assert!(!line.contains('\n'));
    assert_eq!(summary_line(&[]), "summary: none");
}

#[test]
fn text_table_has_a_row_per_result() {
    let all = suite_results();
    let t = text_table(&all);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 9);
    assert!(
        lines[0].contains("IOPS") && lines[0].contains("p99.9 us") && lines[0].contains("CPU%")
    );
    for (l, r) in lines[1..].iter().zip(&all) {
        assert!(l.starts_with(&r.name));
        assert!(l.contains(&format!("{:.0}", r.iops)));
    }
    assert!(!lines[0].contains("verify"));
}

#[test]
fn dates_are_rfc3339_utc() {
    assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339_utc(1_700_000_000), "2023-11-14T22:13:20Z");
    assert_eq!(rfc3339_utc(951_782_400), "2000-02-29T00:00:00Z");
}
