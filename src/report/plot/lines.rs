//! Line charts: one line per series (loss against step or time, throughput
//! over time, scaling curves).

use super::{axis_labels, caption_size, color, legend, DrawResult, Figure, FONT};
use plotters::coord::Shift;
use plotters::prelude::*;

pub struct Lines {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<(String, Vec<(f64, f64)>)>,
    /// A shaded band around series k: `bands[k]` holds (x, low, high) (empty or
    /// `None`: no band), e.g. the spread of a configuration's repeats.
    pub bands: Vec<Option<Vec<(f64, f64, f64)>>>,
    /// Also mark each point (for sparse data such as scaling curves).
    pub points: bool,
    /// Start the y axis at zero (throughputs) rather than at the data (losses).
    pub y_from_zero: bool,
}

/// Beyond this many series (or names this long) the legend goes beside the plot.
const INLINE_LEGEND: usize = 6;
const INLINE_NAME: usize = 28;

impl Lines {
    /// For each series, the first earlier series with exactly the same points:
    /// it would hide behind that one, so it is drawn dashed and says so.
    fn same_as(&self) -> Vec<Option<usize>> {
        let s = &self.series;
        (0..s.len())
            .map(|k| (0..k).find(|&j| !s[k].1.is_empty() && s[j].1 == s[k].1))
            .collect()
    }

    fn labels(&self) -> Vec<String> {
        self.series
            .iter()
            .zip(self.same_as())
            .map(|((name, _), same)| match same {
                Some(j) => format!("{name} (= {})", self.series[j].0),
                None => name.clone(),
            })
            .collect()
    }

    fn legend_beside(&self) -> bool {
        self.series.len() > INLINE_LEGEND
            || self
                .labels()
                .iter()
                .any(|n| n.chars().count() > INLINE_NAME)
    }
}

impl Figure for Lines {
    fn title(&self) -> &str {
        &self.title
    }

    fn size(&self) -> (u32, u32) {
        if self.legend_beside() {
            (1500, 700)
        } else {
            (1100, 650)
        }
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let beside = self.legend_beside();
        let (labels, same_as) = (self.labels(), self.same_as());
        let (plot_area, legend_area) = if beside {
            let (w, _) = root.dim_in_pixel();
            let longest = labels.iter().map(|n| n.chars().count()).max().unwrap_or(10) as i32;
            let (a, b) = root.split_horizontally(w as i32 - (longest * 8 + 50).clamp(200, 600));
            (a, Some(b))
        } else {
            (root.clone(), None)
        };
        let root = &plot_area;
        let bands = self.bands.iter().flatten().flatten();
        let band_points = bands.flat_map(|&(x, lo, hi)| [(x, lo), (x, hi)]);
        let all = self
            .series
            .iter()
            .flat_map(|(_, p)| p.iter().copied())
            .chain(band_points);
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for (x, y) in all {
            if x.is_finite() && y.is_finite() {
                x0 = x0.min(x);
                x1 = x1.max(x);
                y0 = y0.min(y);
                y1 = y1.max(y);
            }
        }
        if x0 > x1 {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        if self.y_from_zero {
            y0 = y0.min(0.0);
        }
        let pad = ((y1 - y0) * 0.08).max(1e-9);
        let (x1, y0, y1) = (
            if x1 > x0 { x1 } else { x0 + 1.0 },
            if self.y_from_zero { y0 } else { y0 - pad },
            y1 + pad,
        );
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, (FONT, caption_size(root, &self.title, 26.0)))
            .margin(16)
            .x_label_area_size(60)
            .y_label_area_size(90)
            .build_cartesian_2d(x0..x1, y0..y1)?;
        chart
            .configure_mesh()
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .x_label_formatter(&axis_labels(x0, x1))
            .y_label_formatter(&axis_labels(y0, y1))
            .axis_desc_style((FONT, 18))
            .label_style((FONT, 15))
            .light_line_style(BLACK.mix(0.05))
            .draw()?;
        for (k, band) in self.bands.iter().enumerate() {
            if let Some(band) = band.as_ref().filter(|b| b.len() > 1) {
                let outline: Vec<(f64, f64)> = band
                    .iter()
                    .map(|&(x, _, hi)| (x, hi))
                    .chain(band.iter().rev().map(|&(x, lo, _)| (x, lo)))
                    .collect();
                chart.draw_series([Polygon::new(outline, color(k).mix(0.18).filled())])?;
            }
        }
        for (k, (_, pts)) in self.series.iter().enumerate() {
            let c = color(k);
            let pts: Vec<(f64, f64)> = pts
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            let drawn = if same_as[k].is_some() {
                chart.draw_series(DashedLineSeries::new(pts.clone(), 10, 8, c.stroke_width(2)))?
            } else {
                chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
            };
            drawn.label(labels[k].clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3))
            });
            if self.points {
                chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
            }
        }
        if let Some(area) = legend_area {
            // One line per series in the right-hand column, the font sized so
            // that the longest name fits (DejaVu glyphs average ~0.5 em).
            let rows = self.series.len();
            let (width, height) = area.dim_in_pixel();
            let longest = labels.iter().map(|n| n.chars().count()).max().unwrap_or(1) as f64;
            let step = ((height as i32 - 80) / rows as i32).clamp(10, 22);
            let fit = ((width as f64 - 44.0) / (0.5 * longest)) as i32;
            let size = (step - 4).min(fit).clamp(9, 14) as u32;
            for (k, name) in labels.iter().enumerate() {
                let y = 60 + step * k as i32;
                let segments: &[(i32, i32)] = if same_as[k].is_some() {
                    &[(8, 16), (22, 30)]
                } else {
                    &[(8, 30)]
                };
                for &(a, b) in segments {
                    area.draw(&PathElement::new(
                        vec![(a, y), (b, y)],
                        color(k).stroke_width(3),
                    ))?;
                }
                area.draw(&Text::new(
                    name.clone(),
                    (36, y - size as i32 / 2 - 1),
                    (FONT, size),
                ))?;
            }
        } else {
            legend(&mut chart, SeriesLabelPosition::UpperRight, 14)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_identical_to_an_earlier_one_is_marked() {
        let pts = vec![(1.0, 10.0), (2.0, 9.0)];
        let lines = Lines {
            bands: vec![],
            title: String::new(),
            x_label: String::new(),
            y_label: String::new(),
            series: vec![
                ("baseline".into(), pts.clone()),
                ("other".into(), vec![(1.0, 10.0), (2.0, 8.0)]),
                ("pretokenized".into(), pts),
                ("empty".into(), vec![]),
                ("empty too".into(), vec![]),
            ],
            points: false,
            y_from_zero: false,
        };
        assert_eq!(lines.same_as(), vec![None, None, Some(0), None, None]);
        assert_eq!(lines.labels()[2], "pretokenized (= baseline)");
    }
}
