//! `--plot` for a classifier: train loss and validation log-loss over
//! steps (left), validation accuracy and the majority-class baseline
//! (right), as SVG.

use std::path::Path;

use plotters::prelude::*;

/// Reads one value of a point.
type Value = fn(&AccuracyPoint) -> f64;

/// One evaluation of the run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AccuracyPoint {
    /// Steps taken.
    pub step: u64,
    /// The mean batch loss since the previous point.
    pub train_loss: f64,
    /// The validation log-loss.
    pub val_log_loss: f64,
    /// The validation accuracy, in [0, 1].
    pub val_accuracy: f64,
}

/// Draws `points` and the baseline accuracy into `path`; the error names the file.
pub fn draw(
    path: &Path,
    title: &str,
    points: &[AccuracyPoint],
    baseline: f64,
) -> Result<(), String> {
    draw_charts(path, title, points, baseline)
        .map_err(|e| format!("cannot draw the plot {}: {e}", path.display()))
}

fn draw_charts(
    path: &Path,
    title: &str,
    points: &[AccuracyPoint],
    baseline: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1200, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 18))?;
    let (left, right) = root.split_horizontally(600);
    let x_max = points.last().map_or(1, |p| p.step).max(1) as f64;
    let blue = RGBColor(31, 119, 180);
    let red = RGBColor(214, 39, 40);
    let grey = RGBColor(127, 127, 127);

    let y_max = points
        .iter()
        .flat_map(|p| [p.train_loss, p.val_log_loss])
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&left)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max.max(1e-6))?;
    chart
        .configure_mesh()
        .x_desc("steps")
        .y_desc("cross-entropy")
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let curves: [(&str, RGBColor, Value); 2] = [
        ("train loss", blue, |p| p.train_loss),
        ("validation log-loss", red, |p| p.val_log_loss),
    ];
    for (label, color, value) in curves {
        let line = points.iter().map(|p| (p.step as f64, value(p)));
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;

    let mut chart = ChartBuilder::on(&right)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..x_max, 0f64..100f64)?;
    chart
        .configure_mesh()
        .x_desc("steps")
        .y_desc("validation accuracy (%)")
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let line = points
        .iter()
        .map(|p| (p.step as f64, 100.0 * p.val_accuracy));
    chart
        .draw_series(LineSeries::new(line, red.stroke_width(2)))?
        .label("validation accuracy")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], red));
    chart
        .draw_series(LineSeries::new(
            [(0.0, 100.0 * baseline), (x_max, 100.0 * baseline)],
            grey,
        ))?
        .label("majority class")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], grey));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
