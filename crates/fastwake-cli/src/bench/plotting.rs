//! What every `bench` plot shares: the font, the colours, the error
//! wording.
//!
//! PNG text needs a font file: DejaVu Sans (assets/fonts, with its
//! licence) is compiled in and registered once, so the plots render the
//! same on any host.

use fastwake::{Fail, Result};
use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

static FONT: &[u8] = include_bytes!("../../../../assets/fonts/DejaVuSans.ttf");
pub const FAMILY: &str = "sans-serif";

pub fn register() -> Result<()> {
    static ONCE: Once = Once::new();
    let mut ok = true;
    ONCE.call_once(|| {
        ok = plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok();
    });
    if ok {
        Ok(())
    } else {
        Err(Fail::new(
            libc::EINVAL,
            "bundled font DejaVuSans.ttf is unreadable",
        ))
    }
}

pub const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
    RGBColor(140, 86, 75),
    RGBColor(127, 127, 127),
];

/// A plotting error as one line naming what was drawn.
pub fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> Fail + '_ {
    move |e| Fail::new(libc::EIO, format!("plot {what}: {e}"))
}

/// Draw the series' legend at `pos` and write the picture out.
pub fn finish<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    root: &DrawingArea<DB, Shift>,
    pos: SeriesLabelPosition,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FAMILY, 13))
        .position(pos)
        .draw()
        .map_err(err("legend"))?;
    root.present().map_err(err("write"))?;
    Ok(())
}

/// A picture that can be drawn on any backend.
pub trait Picture {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<()>
    where
        DB::ErrorType: 'static;
}

/// Write `pic` as `DIR/<name>.svg` and `.png` (960 x 640), creating DIR;
/// returns their paths.
pub fn write(dir: &Path, name: &str, pic: &impl Picture) -> Result<Vec<String>> {
    register()?;
    std::fs::create_dir_all(dir).map_err(|e| {
        Fail::new(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("create plot directory {}: {e}", dir.display()),
        )
    })?;
    let svg = dir.join(format!("{name}.svg"));
    let png = dir.join(format!("{name}.png"));
    pic.draw(SVGBackend::new(&svg, (960, 640)).into_drawing_area())?;
    pic.draw(BitMapBackend::new(&png, (960, 640)).into_drawing_area())?;
    Ok(vec![svg.display().to_string(), png.display().to_string()])
}
