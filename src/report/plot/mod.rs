//! Charts drawn with plotters, each written as PNG and SVG. Text uses the
//! bundled DejaVu Sans (registered from bytes the binary carries), so charts
//! render the same on a machine without fonts.

pub mod bars;
pub mod lines;

use anyhow::{anyhow, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Once;

static FONT_BYTES: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");
pub const FONT: &str = "sans-serif";

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for style in [FontStyle::Normal, FontStyle::Bold] {
            if plotters::style::register_font(FONT, style, FONT_BYTES).is_err() {
                panic!("the bundled font assets/fonts/DejaVuSans.ttf is not a valid font");
            }
        }
    });
}

pub type DrawResult<DB> =
    std::result::Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// The series legend in one style for every chart: a light box at `position`.
pub fn legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
    font_size: u32,
) -> DrawResult<DB> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font((FONT, font_size))
        .draw()
}

/// The caption's font size: `max` points, less when the title would not fit
/// the figure's width (a long study name on a narrow chart).
pub fn caption_size<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    max: f64,
) -> f64 {
    let room = root.dim_in_pixel().0.saturating_sub(40) as f64;
    match root.estimate_text_size(title, &(FONT, max).into_text_style(root)) {
        Ok((w, _)) if w as f64 > room && w > 0 => (max * room / w as f64).floor().max(10.0),
        _ => max,
    }
}

/// Something that can draw itself on any plotters backend.
pub trait Figure {
    fn size(&self) -> (u32, u32) {
        (1100, 650)
    }
    /// What the figure shows (its title; a page's caption).
    fn title(&self) -> &str;
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB>;
}

/// A figure as written: its name, its title, its files (PNG and SVG) and
/// its SVG text (what a page inlines).
#[derive(Debug, Clone)]
pub struct Chart {
    pub name: String,
    pub title: String,
    pub svg: String,
    pub files: Vec<PathBuf>,
}

/// Writes `<dir>/<name>.png` and `<dir>/<name>.svg` (each to a temporary
/// name first, then renamed).
pub fn save(fig: &impl Figure, dir: &Path, name: &str) -> Result<Chart> {
    crate::util::fs::make_dir(dir)?;
    let size = fig.size();
    let drawn = |e: String| anyhow!("drawing {name}: {e}");
    let svg = svg(fig).with_context(|| format!("drawing {name}"))?;
    let svg_path = dir.join(format!("{name}.svg"));
    crate::util::fs::write_atomic(&svg_path, svg.as_bytes())?;
    let png_path = dir.join(format!("{name}.png"));
    // A fresh temporary name (created exclusively): the backend writes a
    // path, and no file of anyone else's can be there.
    // The backend picks the image format by the extension.
    let (file, tmp) = crate::util::fs::temp_beside_as(&png_path, ".chart-", ".png")?.into_parts();
    drop(file);
    let result = (|| -> Result<()> {
        let root = BitMapBackend::new(&tmp, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| drawn(e.to_string()))?;
        fig.draw(&root).map_err(|e| drawn(e.to_string()))?;
        root.present().map_err(|e| drawn(e.to_string()))?;
        Ok(())
    })();
    result?;
    crate::util::fs::persist(tmp, &png_path)?;
    Ok(Chart {
        name: name.to_string(),
        title: fig.title().to_string(),
        svg,
        files: vec![png_path, svg_path],
    })
}

/// A figure as SVG text, in memory (what a page inlines without a file).
pub fn svg(fig: &impl Figure) -> Result<String> {
    register_font();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, fig.size()).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
        fig.draw(&root).map_err(|e| anyhow!("{e}"))?;
        root.present().map_err(|e| anyhow!("{e}"))?;
    }
    Ok(svg)
}

/// A figure drawn at another size than its own.
pub struct Resized<'a, F: Figure>(pub &'a F, pub (u32, u32));

impl<F: Figure> Figure for Resized<'_, F> {
    fn size(&self) -> (u32, u32) {
        self.1
    }
    fn title(&self) -> &str {
        self.0.title()
    }
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        self.0.draw(root)
    }
}

/// Distinct colours (Tableau 20: ten hues, dark then light).
pub fn color(i: usize) -> RGBColor {
    const C: [(u8, u8, u8); 20] = [
        (78, 121, 167),
        (242, 142, 43),
        (225, 87, 89),
        (118, 183, 178),
        (89, 161, 79),
        (237, 201, 72),
        (176, 122, 161),
        (255, 157, 167),
        (156, 117, 95),
        (121, 112, 110),
        (160, 203, 232),
        (255, 190, 125),
        (255, 157, 154),
        (134, 188, 182),
        (140, 209, 125),
        (241, 206, 99),
        (212, 166, 200),
        (250, 191, 210),
        (215, 181, 166),
        (186, 176, 172),
    ];
    let (r, g, b) = C[i % C.len()];
    RGBColor(r, g, b)
}

/// Compact numbers for labels: 7,873 / 38.5 / 0.46 / 1.2e-5.
pub fn fmt_value(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 10_000.0 {
        let s = format!("{:.0}", v);
        let (sign, digits) = s.split_at(if v < 0.0 { 1 } else { 0 });
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        format!("{sign}{out}")
    } else if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else if a >= 0.01 {
        format!("{v:.2}")
    } else {
        format!("{v:.1e}")
    }
}

/// An axis's tick labels over `lo..hi`: as [`fmt_value`], with at least
/// the decimals that tell ticks a tenth of the span apart (a loss axis from
/// 10.18 to 10.26 reads 10.18, 10.20, … rather than 10.2 five times).
pub fn axis_labels(lo: f64, hi: f64) -> impl Fn(&f64) -> String {
    // The tick step a chart draws: the first 1, 2 or 5 × 10^k at or above
    // a tenth of the span.
    let step = (hi - lo).abs() / 10.0;
    let decimals = match step.is_finite() && step > 0.0 && step < 1.0 {
        true => {
            let k = step.log10().floor();
            let nice = [1.0, 2.0, 5.0, 10.0]
                .into_iter()
                .find(|m| m * 10f64.powf(k) >= step * (1.0 - 1e-9))
                .unwrap_or(10.0)
                * 10f64.powf(k);
            ((-nice.log10() - 1e-9).ceil().max(0.0) as usize).min(6)
        }
        false => 0,
    };
    move |v: &f64| {
        let plain = fmt_value(*v);
        let shown = plain.split('.').nth(1).map_or(0, str::len);
        match decimals > shown && !plain.contains('e') {
            true => format!("{v:.decimals$}"),
            false => plain,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_a_tenth_of_the_span_apart_read_apart() {
        let label = axis_labels(10.18, 10.26);
        let ticks: Vec<String> = [10.18, 10.2, 10.22].iter().map(&label).collect();
        assert_eq!(ticks, ["10.18", "10.20", "10.22"]);
        assert_eq!(axis_labels(0.0, 8000.0)(&2000.0), "2000");
        assert_eq!(axis_labels(0.0, 1e6)(&250000.0), "250,000");
        assert_eq!(axis_labels(0.1, 0.2)(&0.15), "0.15");
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(fmt_value(7873.05), "7873");
        assert_eq!(fmt_value(123456.0), "123,456");
        assert_eq!(fmt_value(38.47), "38.5");
        assert_eq!(fmt_value(0.456), "0.46");
        assert_eq!(fmt_value(0.0), "0");
    }
}
