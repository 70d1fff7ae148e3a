//! Runs the standard suite (shortened) against in-memory volumes, prints the table and
//! the summary line, and writes a chart: `cargo run -p bench --example mem_suite [DIR]`.
//! A smoke test of the whole crate, and a measure of the engine's own overhead.

use bench::{chart, run, summary_line, text_table, ProgressLine, Report, ReportMeta, Suite};
use block::{DelayVolume, MemVolume, VolumeRef};
use std::sync::Arc;
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "/tmp".to_string());
    let suite = Suite::standard().with_duration_secs(2.0, 0.5);
    let mem: VolumeRef = Arc::new(MemVolume::new(4096, 256 * 1024));
    let slow: VolumeRef = Arc::new(DelayVolume::new(
        mem.clone(),
        Duration::from_micros(200),
        Duration::from_micros(400),
    ));
    let mut configs = Vec::new();
    for (label, vol) in [("memory", mem), ("memory + delay", slow)] {
        let mut results = Vec::new();
        for w in &suite.workloads {
            let line = ProgressLine::new(&w.name);
            results.push(run(vol.clone(), w, Some(line.sink())).await?);
        }
        println!("{label}:\n{}", text_table(&results));
        println!("{}", summary_line(&results));
        let report = Report {
            meta: ReportMeta::new(&format!("mem:{label}")),
            results: results.clone(),
        };
        std::fs::write(
            format!("{dir}/bench-{}.json", label.replace(' ', "_")),
            report.to_json()?,
        )?;
        configs.push((label.to_string(), results));
    }
    let c = chart(&configs);
    std::fs::write(format!("{dir}/bench-mem-suite.svg"), &c.svg)?;
    std::fs::write(format!("{dir}/bench-mem-suite.png"), c.to_png()?)?;
    println!("chart: {dir}/bench-mem-suite.png");
    Ok(())
}
