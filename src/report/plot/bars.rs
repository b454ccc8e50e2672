//! Bar charts: grouped bars (one colour per series) and stacked bars, with
//! value labels, and category names written under the bars on several lines
//! so that long configuration names never overlap.

use super::{axis_labels, caption_size, color, fmt_value, legend, DrawResult, Figure, FONT};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Grouped bars: `series[s].1[g]` is series s's value for category g.
pub struct Bars {
    pub title: String,
    pub y_label: String,
    pub categories: Vec<String>,
    pub series: Vec<(String, Vec<Option<f64>>)>,
    /// Error bars: `intervals[s][g]` is the (low, high) of series s's value
    /// for category g (empty: none).
    pub intervals: Vec<Vec<Option<(f64, f64)>>>,
    /// A note above each category (e.g. a speedup), if any.
    pub notes: Vec<Option<String>>,
}

/// Stacked bars: `layers[l].1[c]` is layer l's part of category c.
pub struct StackedBars {
    pub title: String,
    pub y_label: String,
    pub categories: Vec<String>,
    pub layers: Vec<(String, Vec<f64>)>,
    pub notes: Vec<Option<String>>,
}

/// Splits a category name into short lines at `-`, `_` and spaces.
fn label_lines(name: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for part in name.split_inclusive(['-', '_', ' ']) {
        let cur = lines.last_mut().unwrap();
        if !cur.is_empty() && cur.len() + part.len() > width {
            lines.push(part.to_string());
        } else {
            cur.push_str(part);
        }
    }
    lines
        .into_iter()
        .map(|l| l.trim_end_matches([' ', '_']).to_string())
        .collect()
}

const LABEL_AREA: u32 = 90;

type BarChart<'a, DB> = ChartContext<
    'a,
    DB,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

fn frame<'a, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, Shift>,
    title: &str,
    y_label: &str,
    n: usize,
    y_max: f64,
) -> Result<BarChart<'a, DB>, DrawingAreaErrorKind<DB::ErrorType>> {
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, caption_size(root, title, 26.0)))
        .margin(16)
        .x_label_area_size(LABEL_AREA)
        .y_label_area_size(90)
        .build_cartesian_2d(0.0..n as f64, 0.0..y_max)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .disable_x_axis()
        .y_desc(y_label)
        .y_label_formatter(&axis_labels(0.0, y_max))
        .axis_desc_style((FONT, 18))
        .label_style((FONT, 15))
        .draw()?;
    Ok(chart)
}

/// Category names under the bars, centred, on as many lines as they need.
fn draw_categories<DB: DrawingBackend, X, Y>(
    root: &DrawingArea<DB, Shift>,
    chart: &ChartContext<DB, Cartesian2d<X, Y>>,
    categories: &[String],
) -> DrawResult<DB>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let (px0, _) = chart.backend_coord(&(0.0, 0.0));
    let (px1, _) = chart.backend_coord(&(1.0, 0.0));
    let chars = (((px1 - px0) as f64) / 8.5).max(6.0) as usize;
    for (i, name) in categories.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
        for (k, line) in label_lines(name, chars).iter().enumerate() {
            let style =
                TextStyle::from((FONT, 15).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
            root.draw(&Text::new(line.clone(), (x, y + 8 + 18 * k as i32), style))?;
        }
    }
    Ok(())
}

fn note<DB: DrawingBackend, X, Y>(
    chart: &mut ChartContext<DB, Cartesian2d<X, Y>>,
    x: f64,
    y: f64,
    text: &str,
    size: u32,
) -> DrawResult<DB>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let style = TextStyle::from((FONT, size).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
    chart
        .plotting_area()
        .draw(&Text::new(text.to_string(), (x, y), style))
}

/// An interval's whisker with caps at `at` on the category axis: the value
/// axis is y for upright bars, x for lying ones.
fn error_bar(
    at: f64,
    (lo, hi): (f64, f64),
    cap: f64,
    upright: bool,
) -> [PathElement<(f64, f64)>; 3] {
    let p = |v: f64, c: f64| if upright { (at + c, v) } else { (v, at + c) };
    let style = BLACK.stroke_width(2);
    [
        PathElement::new(vec![p(lo, 0.0), p(hi, 0.0)], style),
        PathElement::new(vec![p(lo, -cap), p(lo, cap)], style),
        PathElement::new(vec![p(hi, -cap), p(hi, cap)], style),
    ]
}

/// Beyond this many categories, bars lie down: one row per category, its
/// name on one line at the left.
const UPRIGHT_MAX: usize = 12;

impl Bars {
    fn horizontal(&self) -> bool {
        self.categories.len() > UPRIGHT_MAX
    }

    fn interval(&self, series: usize, category: usize) -> Option<(f64, f64)> {
        *self.intervals.get(series)?.get(category)?
    }

    /// The largest value or interval bound: the axis must hold both.
    fn top(&self) -> f64 {
        let values = self
            .series
            .iter()
            .flat_map(|(_, v)| v.iter().flatten().copied());
        let highs = self.intervals.iter().flatten().flatten().map(|(_, hi)| *hi);
        values.chain(highs).fold(0.0f64, f64::max)
    }

    fn draw_horizontal<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let n = self.categories.len();
        let max = self.top();
        let x_max = if max > 0.0 { max * 1.18 } else { 1.0 };
        let longest = self
            .categories
            .iter()
            .map(|c| c.chars().count())
            .max()
            .unwrap_or(10) as u32;
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, (FONT, caption_size(root, &self.title, 24.0)))
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size((longest * 8 + 20).min(520))
            .build_cartesian_2d(0.0..x_max, 0.0..n as f64)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .disable_y_axis()
            .x_desc(&self.y_label)
            .x_label_formatter(&axis_labels(0.0, x_max))
            .axis_desc_style((FONT, 18))
            .label_style((FONT, 14))
            .draw()?;
        let s = self.series.len().max(1) as f64;
        let height = 0.8 / s;
        // Category g is drawn top-down: row n-1-g.
        let row = |g: usize| (n - 1 - g) as f64;
        for (k, (name, values)) in self.series.iter().enumerate() {
            let c = color(k);
            let bars = values.iter().enumerate().filter_map(|(g, v)| {
                let y0 = row(g) + 0.1 + k as f64 * height;
                v.map(|v| Rectangle::new([(0.0, y0), (v, y0 + height * 0.9)], c.filled()))
            });
            let drawn = chart.draw_series(bars)?;
            if self.series.len() > 1 {
                drawn.label(name.clone()).legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled())
                });
            }
            for (g, v) in values.iter().enumerate() {
                if let Some(v) = v {
                    let y = row(g) + 0.1 + (k as f64 + 0.45) * height;
                    let mut end = *v;
                    if let Some((lo, hi)) = self.interval(k, g) {
                        chart.draw_series(error_bar(y, (lo, hi), height * 0.25, false))?;
                        end = end.max(hi);
                    }
                    let mut text = fmt_value(*v);
                    if let Some(Some(extra)) = self.notes.get(g).filter(|_| k == 0) {
                        text = format!("{text}  ({extra})");
                    }
                    let style = TextStyle::from((FONT, 13).into_font())
                        .pos(Pos::new(HPos::Left, VPos::Center));
                    chart
                        .plotting_area()
                        .draw(&Text::new(text, (end + max * 0.01, y), style))?;
                }
            }
        }
        for (g, name) in self.categories.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(0.0, row(g) + 0.5));
            let style =
                TextStyle::from((FONT, 14).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
            root.draw(&Text::new(name.clone(), (x - 8, y), style))?;
        }
        if self.series.len() > 1 {
            legend(&mut chart, SeriesLabelPosition::LowerRight, 14)?;
        }
        Ok(())
    }
}

impl Figure for Bars {
    fn title(&self) -> &str {
        &self.title
    }

    fn size(&self) -> (u32, u32) {
        if self.horizontal() {
            (
                1300,
                110 + 26 * self.categories.len() as u32 * (self.series.len() as u32).max(1),
            )
        } else {
            ((160 * self.categories.len() as u32 + 200).max(900), 650)
        }
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        if self.horizontal() {
            return self.draw_horizontal(root);
        }
        let n = self.categories.len();
        let max = self.top();
        let mut chart = frame(
            root,
            &self.title,
            &self.y_label,
            n,
            if max > 0.0 { max * 1.22 } else { 1.0 },
        )?;
        let s = self.series.len().max(1) as f64;
        let width = 0.8 / s;
        for (k, (name, values)) in self.series.iter().enumerate() {
            let c = color(k);
            let bars = values.iter().enumerate().filter_map(|(g, v)| {
                let x0 = g as f64 + 0.1 + k as f64 * width;
                v.map(|v| Rectangle::new([(x0, 0.0), (x0 + width * 0.92, v)], c.filled()))
            });
            let drawn = chart.draw_series(bars)?;
            if self.series.len() > 1 {
                drawn.label(name.clone()).legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled())
                });
            }
            let label_size = if s > 2.0 { 12 } else { 14 };
            for (g, v) in values.iter().enumerate() {
                if let Some(v) = v {
                    let x = g as f64 + 0.1 + (k as f64 + 0.46) * width;
                    let mut top = *v;
                    if let Some((lo, hi)) = self.interval(k, g) {
                        chart.draw_series(error_bar(x, (lo, hi), width * 0.2, true))?;
                        top = top.max(hi);
                    }
                    note(&mut chart, x, top, &fmt_value(*v), label_size)?;
                }
            }
        }
        for (g, text) in self.notes.iter().enumerate() {
            if let Some(t) = text {
                let top = self
                    .series
                    .iter()
                    .enumerate()
                    .filter_map(|(k, (_, v))| {
                        Some(v[g]?.max(self.interval(k, g).map_or(0.0, |i| i.1)))
                    })
                    .fold(0.0f64, f64::max);
                note(&mut chart, g as f64 + 0.5, top + max * 0.07, t, 15)?;
            }
        }
        if self.series.len() > 1 {
            legend(&mut chart, SeriesLabelPosition::UpperRight, 15)?;
        }
        draw_categories(root, &chart, &self.categories)
    }
}

impl Figure for StackedBars {
    fn title(&self) -> &str {
        &self.title
    }

    fn size(&self) -> (u32, u32) {
        ((170 * self.categories.len() as u32 + 200).max(900), 650)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let n = self.categories.len();
        let totals: Vec<f64> = (0..n)
            .map(|c| self.layers.iter().map(|(_, v)| v[c]).sum())
            .collect();
        let max = totals.iter().fold(0.0f64, |a, &b| a.max(b));
        let mut chart = frame(
            root,
            &self.title,
            &self.y_label,
            n,
            if max > 0.0 { max * 1.25 } else { 1.0 },
        )?;
        let mut base = vec![0.0; n];
        for (k, (name, values)) in self.layers.iter().enumerate() {
            let c = color(k);
            let rects: Vec<_> = (0..n)
                .map(|g| {
                    let r = Rectangle::new(
                        [
                            (g as f64 + 0.2, base[g]),
                            (g as f64 + 0.8, base[g] + values[g]),
                        ],
                        c.filled(),
                    );
                    base[g] += values[g];
                    r
                })
                .collect();
            chart
                .draw_series(rects)?
                .label(name.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled()));
        }
        for (g, t) in totals.iter().enumerate() {
            let text = match &self.notes[g] {
                Some(n) => format!("{} ({n})", fmt_value(*t)),
                None => fmt_value(*t),
            };
            note(&mut chart, g as f64 + 0.5, *t + max * 0.01, &text, 15)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight, 15)?;
        draw_categories(root, &chart, &self.categories)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_wrap_at_separators() {
        assert_eq!(
            label_lines("pretokenized-padding-free-bs2", 14),
            vec!["pretokenized-", "padding-free-", "bs2"]
        );
        assert_eq!(label_lines("short", 14), vec!["short"]);
    }
}
