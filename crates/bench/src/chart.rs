//! Side-by-side bar charts of the kind SAN reviews publish: IOPS of the small-block
//! patterns (4K/8K) on the left, MB/s of the large-block patterns (64K/256K) on the
//! right, one bar per configuration per pattern. Drawn as SVG by hand; rendered to PNG
//! with resvg.

use crate::RunResult;
use std::fmt::Write;
use std::sync::{Arc, OnceLock};

/// Patterns with a block size below this go to the IOPS panel, the rest to MB/s.
const LARGE_BLOCK_BYTES_MIN: u32 = 64 * 1024;
const WIDTH_PX: f64 = 1400.0;
const HEIGHT_PX: f64 = 660.0;
const LEGEND_FONT_PX: f64 = 15.0;
const LEGEND_SWATCH_PX: f64 = 14.0;
const LEGEND_GAP_PX: f64 = 28.0;
const LEGEND_Y_PX: f64 = 88.0;
const LEGEND_ROW_PX: f64 = 22.0;
/// Bars never get wider than this, however few configurations there are.
const BAR_WIDTH_PX_MAX: f64 = 90.0;
const FONT: &str = "DejaVu Sans, Liberation Sans, Arial, Helvetica, sans-serif";
/// Distinct colours (Tableau 10), one per configuration, cycled.
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];
/// Fonts tried when the system font scan finds none.
const FALLBACK_FONT_FILES: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Why a chart could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// The SVG did not parse (a bug of this module).
    #[error("svg: {0}")]
    Svg(String),
    /// No font was found, so text would not render (install `fonts-dejavu-core`).
    #[error("no font found for chart text (install fonts-dejavu-core)")]
    NoFonts,
    /// The picture has no size.
    #[error("empty picture")]
    Empty,
    /// PNG encoding failed.
    #[error("png: {0}")]
    Png(String),
}

/// A rendered chart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chart {
    /// The picture as a standalone SVG document.
    pub svg: String,
}

fn font_db() -> Option<Arc<resvg::usvg::fontdb::Database>> {
    static DB: OnceLock<Option<Arc<resvg::usvg::fontdb::Database>>> = OnceLock::new();
    DB.get_or_init(|| {
        let mut db = resvg::usvg::fontdb::Database::new();
        db.load_system_fonts();
        if db.is_empty() {
            for f in FALLBACK_FONT_FILES {
                if db.load_font_file(f).is_ok() {
                    break;
                }
            }
        }
        if db.is_empty() {
            return None;
        }
        let has = |name: &str| {
            db.faces()
                .any(|f| f.families.iter().any(|(n, _)| n == name))
        };
        if has("DejaVu Sans") {
            db.set_sans_serif_family("DejaVu Sans");
        } else {
            let first = db
                .faces()
                .next()
                .and_then(|f| f.families.first())
                .map(|(n, _)| n.clone());
            if let Some(first) = first {
                db.set_sans_serif_family(first);
            }
        }
        Some(Arc::new(db))
    })
    .clone()
}

impl Chart {
    /// Renders the SVG to PNG at its natural size (1400 x 660 px, plus 22 px per extra
    /// legend row when the configuration labels need more than one).
    pub fn to_png(&self) -> Result<Vec<u8>, ChartError> {
        self.to_png_scaled(1.0)
    }

    /// Renders the SVG to PNG, `scale` times its natural size (2.0 for print).
    pub fn to_png_scaled(&self, scale: f32) -> Result<Vec<u8>, ChartError> {
        use resvg::{tiny_skia, usvg};
        let fontdb = font_db().ok_or(ChartError::NoFonts)?;
        let opt = usvg::Options {
            fontdb,
            font_family: "DejaVu Sans".to_string(),
            ..usvg::Options::default()
        };
        let tree =
            usvg::Tree::from_str(&self.svg, &opt).map_err(|e| ChartError::Svg(e.to_string()))?;
        let size = tree
            .size()
            .to_int_size()
            .scale_by(scale)
            .ok_or(ChartError::Empty)?;
        let mut pixmap =
            tiny_skia::Pixmap::new(size.width(), size.height()).ok_or(ChartError::Empty)?;
        pixmap.fill(tiny_skia::Color::WHITE);
        resvg::render(
            &tree,
            tiny_skia::Transform::from_scale(scale, scale),
            &mut pixmap.as_mut(),
        );
        pixmap
            .encode_png()
            .map_err(|e| ChartError::Png(e.to_string()))
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Rough width of `s` in DejaVu Sans at `size_px` (about 0.6 em per character).
fn text_width_px(s: &str, size_px: f64) -> f64 {
    s.chars().count() as f64 * size_px * 0.6
}

/// A "nice" axis: (step, top) with ticks at multiples of step up to top >= max.
fn nice_axis(max: f64) -> (f64, f64) {
    if max <= 0.0 || !max.is_finite() {
        return (1.0, 5.0);
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    (step, (max / step).ceil() * step)
}

/// Compact number: 950, 12.3k, 123k, 1.25M.
fn compact(v: f64) -> String {
    let (x, suffix) = if v >= 1e6 {
        (v / 1e6, "M")
    } else if v >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let s = if suffix.is_empty() {
        if x >= 100.0 {
            format!("{x:.0}")
        } else if x >= 10.0 {
            format!("{x:.1}")
        } else {
            format!("{x:.2}")
        }
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    };
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    format!("{s}{suffix}")
}

struct Panel<'a> {
    title: &'a str,
    unit: &'a str,
    patterns: Vec<String>,
    metric: fn(&RunResult) -> f64,
    fmt: fn(f64) -> String,
}

/// Plain number for MB/s: 4810, 97.3, 5.25.
fn plain(v: f64) -> String {
    let s = if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Draws the grouped-bar charts for several configurations (label, results).
///
/// Every pattern that appears in any configuration gets a group (in order of first
/// appearance); every configuration that measured it gets a bar with its value on top.
/// Bars carry `class="bar"` and `data-config` / `data-pattern` attributes.
pub fn chart(results_per_config: &[(String, Vec<RunResult>)]) -> Chart {
    let mut small: Vec<String> = Vec::new();
    let mut large: Vec<String> = Vec::new();
    for (_, rs) in results_per_config {
        for r in rs {
            let list = if r.spec.block_size_bytes < LARGE_BLOCK_BYTES_MIN {
                &mut small
            } else {
                &mut large
            };
            if !list.contains(&r.name) {
                list.push(r.name.clone());
            }
        }
    }
    let rows = legend_rows(results_per_config);
    let extra_rows_px = rows.len().saturating_sub(1) as f64 * LEGEND_ROW_PX;
    let height_px = HEIGHT_PX + extra_rows_px;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH_PX}" height="{height_px}" viewBox="0 0 {WIDTH_PX} {height_px}" font-family="{FONT}">
<rect x="0" y="0" width="{WIDTH_PX}" height="{height_px}" fill="white"/>
<text x="{}" y="38" font-size="24" font-weight="bold" text-anchor="middle" fill="#222">freesan benchmark: IOPS and throughput by configuration</text>
"##,
        WIDTH_PX / 2.0
    );
    let threads_qd: Vec<String> = {
        let mut v: Vec<String> = results_per_config
            .iter()
            .flat_map(|(_, rs)| {
                rs.iter().map(|r| {
                    format!(
                        "{} threads x {} outstanding I/O",
                        r.spec.threads, r.spec.queue_depth
                    )
                })
            })
            .collect();
        v.dedup();
        v.sort();
        v.dedup();
        v
    };
    if !threads_qd.is_empty() {
        let _ = writeln!(
            svg,
            r##"<text x="{}" y="62" font-size="14" text-anchor="middle" fill="#555">{} — higher is better</text>"##,
            WIDTH_PX / 2.0,
            esc(&threads_qd.join(", "))
        );
    }
    legend(&mut svg, results_per_config, &rows);
    let panels = [
        Panel {
            title: "Small blocks (4K / 8K): IOPS",
            unit: "IOPS",
            patterns: small,
            metric: |r| r.iops,
            fmt: compact,
        },
        Panel {
            title: "Large blocks (64K / 256K): MB/s",
            unit: "MB/s",
            patterns: large,
            metric: |r| r.mb_per_sec,
            fmt: plain,
        },
    ];
    let panel_w = (WIDTH_PX - 60.0) / 2.0;
    for (i, p) in panels.iter().enumerate() {
        let x0 = 20.0 + i as f64 * (panel_w + 20.0);
        let y0 = 112.0 + extra_rows_px;
        draw_panel(
            &mut svg,
            p,
            results_per_config,
            x0,
            y0,
            panel_w,
            height_px - y0 - 12.0,
        );
    }
    svg.push_str("</svg>\n");
    Chart { svg }
}

/// Lays out the legend in centred rows that fit the width; returns the rows' items
/// (index, x) and the number of rows.
fn legend_rows(configs: &[(String, Vec<RunResult>)]) -> Vec<Vec<(usize, f64)>> {
    let widths: Vec<f64> = configs
        .iter()
        .map(|(l, _)| LEGEND_SWATCH_PX + 8.0 + text_width_px(l, LEGEND_FONT_PX))
        .collect();
    let usable = WIDTH_PX - 40.0;
    let mut rows: Vec<Vec<usize>> = Vec::new();
    let mut row_w = 0.0;
    for (i, w) in widths.iter().enumerate() {
        match rows.last_mut() {
            Some(row) if row_w + LEGEND_GAP_PX + w <= usable => {
                row.push(i);
                row_w += LEGEND_GAP_PX + w;
            }
            _ => {
                rows.push(vec![i]);
                row_w = *w;
            }
        }
    }
    rows.into_iter()
        .map(|row| {
            let total: f64 = row.iter().map(|&i| widths[i]).sum::<f64>()
                + LEGEND_GAP_PX * (row.len() - 1) as f64;
            let mut x = ((WIDTH_PX - total) / 2.0).max(20.0);
            row.into_iter()
                .map(|i| {
                    let at = x;
                    x += widths[i] + LEGEND_GAP_PX;
                    (i, at)
                })
                .collect()
        })
        .collect()
}

fn legend(svg: &mut String, configs: &[(String, Vec<RunResult>)], rows: &[Vec<(usize, f64)>]) {
    for (r, row) in rows.iter().enumerate() {
        let y = LEGEND_Y_PX + r as f64 * LEGEND_ROW_PX;
        for &(i, x) in row {
            let _ = writeln!(
                svg,
                r##"<rect class="legend" x="{x:.1}" y="{:.1}" width="{LEGEND_SWATCH_PX}" height="{LEGEND_SWATCH_PX}" rx="2" fill="{}"/><text x="{:.1}" y="{y:.1}" font-size="{LEGEND_FONT_PX}" fill="#222">{}</text>"##,
                y - LEGEND_SWATCH_PX + 2.0,
                PALETTE[i % PALETTE.len()],
                x + LEGEND_SWATCH_PX + 8.0,
                esc(&configs[i].0)
            );
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn draw_panel(
    svg: &mut String,
    p: &Panel<'_>,
    configs: &[(String, Vec<RunResult>)],
    x0: f64,
    y0: f64,
    w: f64,
    h: f64,
) {
    let _ = writeln!(
        svg,
        r##"<rect x="{x0:.1}" y="{y0:.1}" width="{w:.1}" height="{h:.1}" rx="6" fill="#fafafa" stroke="#ddd"/>
<text x="{:.1}" y="{:.1}" font-size="17" font-weight="bold" text-anchor="middle" fill="#222">{}</text>"##,
        x0 + w / 2.0,
        y0 + 26.0,
        esc(p.title)
    );
    // Plot area.
    let (left, right, top, bottom) = (x0 + 86.0, x0 + w - 16.0, y0 + 48.0, y0 + h - 46.0);
    let plot_h = bottom - top;
    if p.patterns.is_empty() {
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" font-size="15" text-anchor="middle" fill="#888">no results</text>"##,
            (left + right) / 2.0,
            (top + bottom) / 2.0
        );
        return;
    }
    let value = |c: &[RunResult], pat: &str| c.iter().find(|r| r.name == pat).map(p.metric);
    let max = configs
        .iter()
        .flat_map(|(_, rs)| p.patterns.iter().filter_map(|pat| value(rs, pat)))
        .fold(0.0f64, f64::max);
    let n_cfg = configs.len().max(1) as f64;
    let group_w = (right - left) / p.patterns.len() as f64;
    let bar_gap_px = 3.0;
    let bar_w =
        ((group_w * 0.82 - bar_gap_px * (n_cfg - 1.0)) / n_cfg).clamp(2.0, BAR_WIDTH_PX_MAX);
    let label_px = if bar_w >= 40.0 {
        13.0
    } else if bar_w >= 30.0 {
        12.0
    } else {
        11.0
    };
    // Leave headroom above the tallest bar for its value label.
    let widest_label = configs
        .iter()
        .flat_map(|(_, rs)| p.patterns.iter().filter_map(|pat| value(rs, pat)))
        .map(|v| text_width_px(&(p.fmt)(v), label_px))
        .fold(0.0f64, f64::max);
    let rotate = widest_label + 2.0 > bar_w + bar_gap_px;
    let headroom_px = if rotate {
        widest_label + 8.0
    } else {
        label_px + 8.0
    };
    let (step, axis_top) = nice_axis(max * plot_h / (plot_h - headroom_px).max(plot_h * 0.5));
    let y_of = |v: f64| bottom - v / axis_top * plot_h;
    // Grid and ticks.
    let mut t = 0.0;
    while t <= axis_top + step * 1e-9 {
        let y = y_of(t);
        let _ = writeln!(
            svg,
            r##"<line x1="{left:.1}" y1="{y:.1}" x2="{right:.1}" y2="{y:.1}" stroke="{}" stroke-width="1"/><text x="{:.1}" y="{:.1}" font-size="13" text-anchor="end" fill="#444">{}</text>"##,
            if t == 0.0 { "#888" } else { "#e2e2e2" },
            left - 8.0,
            y + 4.5,
            (p.fmt)(t)
        );
        t += step;
    }
    let _ = writeln!(
        svg,
        r##"<line x1="{left:.1}" y1="{top:.1}" x2="{left:.1}" y2="{bottom:.1}" stroke="#888"/>
<text x="{:.1}" y="{:.1}" font-size="14" text-anchor="middle" fill="#333" transform="rotate(-90 {:.1} {:.1})">{}</text>"##,
        x0 + 20.0,
        (top + bottom) / 2.0,
        x0 + 20.0,
        (top + bottom) / 2.0,
        esc(p.unit)
    );
    for (gi, pat) in p.patterns.iter().enumerate() {
        let gx = left + gi as f64 * group_w;
        let bars_w = bar_w * n_cfg + bar_gap_px * (n_cfg - 1.0);
        let mut x = gx + (group_w - bars_w) / 2.0;
        for (ci, (label, rs)) in configs.iter().enumerate() {
            if let Some(v) = value(rs, pat) {
                let y = y_of(v);
                let _ = writeln!(
                    svg,
                    r##"<rect class="bar" data-config="{}" data-pattern="{}" x="{x:.1}" y="{y:.1}" width="{bar_w:.1}" height="{:.1}" fill="{}"><title>{}: {} {} {}</title></rect>"##,
                    esc(label),
                    esc(pat),
                    (bottom - y).max(0.0),
                    PALETTE[ci % PALETTE.len()],
                    esc(label),
                    esc(pat),
                    (p.fmt)(v),
                    esc(p.unit)
                );
                let cx = x + bar_w / 2.0;
                if rotate {
                    let _ = writeln!(
                        svg,
                        r##"<text class="value" x="{cx:.1}" y="{:.1}" font-size="{label_px}" fill="#222" transform="rotate(-90 {cx:.1} {:.1})" dominant-baseline="middle">{}</text>"##,
                        y - 4.0,
                        y - 4.0,
                        (p.fmt)(v)
                    );
                } else {
                    let _ = writeln!(
                        svg,
                        r##"<text class="value" x="{cx:.1}" y="{:.1}" font-size="{label_px}" text-anchor="middle" fill="#222">{}</text>"##,
                        y - 5.0,
                        (p.fmt)(v)
                    );
                }
            }
            x += bar_w + bar_gap_px;
        }
        let _ = writeln!(
            svg,
            r##"<text class="pattern" x="{:.1}" y="{:.1}" font-size="14" text-anchor="middle" fill="#222">{}</text>"##,
            gx + group_w / 2.0,
            bottom + 24.0,
            esc(pat)
        );
    }
}
