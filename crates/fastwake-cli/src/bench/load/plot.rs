//! Latency-vs-CPU plots for `bench load --plot DIR`: one per scenario, as
//! SVG and PNG. Each mode is one colour: a filled dot at (CPU, p50), a ring
//! at (CPU, p99), joined by a line. Both axes are logarithmic: CPU spans
//! 0.1 % (interrupt at a low rate) to 100 % of a core (poll), latency
//! 0.2 µs (spinning) to milliseconds (a hog's time slice).
//!
//! The font, colours and error wording are every plot's
//! ([`crate::bench::plotting`]).

use crate::bench::plotting::{self, COLORS, FAMILY, Picture, err, finish};
use crate::bench::stats::Row;
use fastwake::Result;
use plotters::prelude::*;
use std::path::Path;

fn get(r: &Row, k: &str) -> f64 {
    r.extra.get(k).and_then(|v| v.as_f64()).unwrap_or(f64::NAN)
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    rows: &[&Row],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err("fill"))?;
    let xs: Vec<f64> = rows
        .iter()
        .map(|r| get(r, "cpu_pct_of_core").max(0.01))
        .collect();
    let ys: Vec<f64> = rows
        .iter()
        .flat_map(|r| [r.t_typical, r.p99])
        .map(|v| v.max(0.01))
        .collect();
    let lo = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min) / 2.0;
    let hi = |v: &[f64]| v.iter().copied().fold(0.0, f64::max) * 2.0;
    let (x0, x1) = (lo(&xs).max(0.005), hi(&xs).max(1.0));
    let (y0, y1) = (lo(&ys).max(0.01), hi(&ys).max(1.0));
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FAMILY, 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
        .map_err(err("axes"))?;
    chart
        .configure_mesh()
        .x_desc("CPU, % of one core (consumer + helper threads)")
        .y_desc("latency, µs (dot p50, ring p99)")
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 15))
        .draw()
        .map_err(err("mesh"))?;
    for (i, r) in rows.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let x = xs[i];
        let (p50, p99) = (r.t_typical.max(0.01), r.p99.max(0.01));
        chart
            .draw_series(LineSeries::new([(x, p50), (x, p99)], c.stroke_width(2)))
            .map_err(err("series"))?
            .label(format!(
                "{}: p50 {:.2}us, p99 {:.1}us, cpu {:.1}%",
                r.mode, r.t_typical, r.p99, x
            ))
            .legend(move |(lx, ly)| Circle::new((lx + 8, ly), 5, c.filled()));
        chart
            .draw_series([Circle::new((x, p50), 6, c.filled())])
            .map_err(err("p50"))?;
        chart
            .draw_series([Circle::new((x, p99), 6, c.stroke_width(2))])
            .map_err(err("p99"))?;
        // The label sits beside the dot, not on it.
        let label = EmptyElement::at((x, p50))
            + Text::new(r.mode.clone(), (9, -4), (FAMILY, 14).into_font().color(&c));
        chart.draw_series([label]).map_err(err("label"))?;
    }
    finish(&mut chart, &root, SeriesLabelPosition::UpperRight)
}

struct Scenario<'a> {
    title: String,
    rows: &'a [&'a Row],
}

impl Picture for Scenario<'_> {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, plotters::coord::Shift>) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        draw(root, &self.title, self.rows)
    }
}

/// Write `DIR/<scenario>.svg` and `.png`; returns their paths.
pub fn write(dir: &Path, scenario: &str, rows: &[&Row]) -> Result<Vec<String>> {
    let pic = Scenario {
        title: format!("fastwake bench load: {scenario}"),
        rows,
    };
    plotting::write(dir, scenario, &pic)
}
