//! `--plot`: train and validation loss over steps (SVG).

use std::path::Path;

use plotters::prelude::*;

/// One point of the loss curves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossPoint {
    /// Steps taken.
    pub step: u64,
    /// The mean batch loss since the previous point.
    pub train: f64,
    /// The validation MSE.
    pub validation: f64,
}

/// Draws `points` (and the mean baseline as a line) into `path`. The
/// error names the file.
pub fn draw(path: &Path, title: &str, points: &[LossPoint], baseline: f64) -> Result<(), String> {
    draw_chart(path, title, points, baseline)
        .map_err(|e| format!("cannot draw the plot {}: {e}", path.display()))
}

fn draw_chart(
    path: &Path,
    title: &str,
    points: &[LossPoint],
    baseline: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let x_max = points.last().map_or(1, |p| p.step).max(1) as f64;
    let y_max = points
        .iter()
        .flat_map(|p| [p.train, p.validation])
        .filter(|v| v.is_finite())
        .fold(baseline, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max.max(1e-6))?;
    chart
        .configure_mesh()
        .x_desc("steps")
        .y_desc("MSE")
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let series = [
        ("train loss", RGBColor(31, 119, 180), 0),
        ("validation MSE", RGBColor(214, 39, 40), 1),
    ];
    for (label, color, which) in series {
        let line = points.iter().map(|p| {
            let value = if which == 0 { p.train } else { p.validation };
            (p.step as f64, value)
        });
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
    }
    let grey = RGBColor(127, 127, 127);
    chart
        .draw_series(LineSeries::new([(0.0, baseline), (x_max, baseline)], grey))?
        .label("predict the mean")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], grey));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
