//! The read-latency plot of `bench lanes --plot DIR`: one line per
//! arrangement through its p50, p99, p99.9 and p99.99, latency on a
//! logarithmic axis (a shared connection's tail is orders of magnitude
//! above the others').

use super::report::Row;
use crate::bench::plotting::{self, COLORS, FAMILY, Picture, err, finish};
use fastwake::Result;
use plotters::prelude::*;
use std::path::Path;

const QUANTILES: [(f64, &str); 4] = [
    (0.5, "p50"),
    (0.99, "p99"),
    (0.999, "p99.9"),
    (0.9999, "p99.99"),
];

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    rows: &[Row],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err("fill"))?;
    let ys: Vec<f64> = rows
        .iter()
        .flat_map(|r| QUANTILES.iter().map(|&(q, _)| r.read_us(q)))
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let y0 = ys.iter().copied().fold(f64::INFINITY, f64::min).min(1.0) / 2.0;
    let y1 = ys.iter().copied().fold(0.0, f64::max).max(10.0) * 2.0;
    let mut chart = ChartBuilder::on(&root)
        .caption("fastwake bench lanes: read latency", (FAMILY, 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(-0.3f64..3.3f64, (y0..y1).log_scale())
        .map_err(err("axes"))?;
    chart
        .configure_mesh()
        .x_labels(QUANTILES.len())
        .x_label_formatter(&|x| {
            QUANTILES
                .get(x.round() as usize)
                .map_or(String::new(), |q| q.1.to_string())
        })
        .x_desc("read latency quantile")
        .y_desc("µs")
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 15))
        .draw()
        .map_err(err("mesh"))?;
    for (i, r) in rows.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = QUANTILES
            .iter()
            .enumerate()
            .map(|(k, &(q, _))| (k as f64, r.read_us(q).max(y0)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
            .map_err(err("series"))?
            .label(format!(
                "{} ({} conns): {:.0} IOPS, write {:.0} MiB/s",
                r.name,
                r.connections,
                r.iops(),
                r.write_mib_s()
            ))
            .legend(move |(lx, ly)| Circle::new((lx + 8, ly), 5, c.filled()));
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 5, c.filled())))
            .map_err(err("points"))?;
    }
    finish(&mut chart, &root, SeriesLabelPosition::UpperLeft)
}

struct Reads<'a>(&'a [Row]);

impl Picture for Reads<'_> {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, plotters::coord::Shift>) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        draw(root, self.0)
    }
}

/// Write `DIR/lanes.svg` and `DIR/lanes.png`; returns their paths.
pub fn write(dir: &Path, rows: &[Row]) -> Result<Vec<String>> {
    plotting::write(dir, "lanes", &Reads(rows))
}
