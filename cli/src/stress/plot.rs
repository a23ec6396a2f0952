//! The picture of a stress run: reserved and in-use bytes over time
//! against the limit, with poisons and recoveries marked (SVG).

use std::path::Path;

use plotters::prelude::*;

use super::counters::{ContextEvent, ContextEventKind};
use super::monitor::Sample;

const MIB: f64 = (1u64 << 20) as f64;

/// Draws the run's memory `samples` and context `events` under `limit`
/// into the SVG file `path`. The error names the file.
pub fn draw(
    path: &Path,
    title: &str,
    samples: &[Sample],
    events: &[ContextEvent],
    limit: u64,
) -> Result<(), String> {
    draw_chart(path, title, samples, events, limit)
        .map_err(|e| format!("cannot draw the plot {}: {e}", path.display()))
}

fn draw_chart(
    path: &Path,
    title: &str,
    samples: &[Sample],
    events: &[ContextEvent],
    limit: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let x_max = samples
        .iter()
        .map(|s| s.seconds)
        .chain(events.iter().map(|e| e.seconds))
        .fold(0.001f64, f64::max);
    let top = samples
        .iter()
        .map(|s| s.reserved_bytes.max(s.in_use_bytes))
        .fold(limit, u64::max) as f64
        / MIB;
    let y_max = (top * 1.12).max(0.001);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("MiB")
        .light_line_style(WHITE.mix(0.0))
        .draw()?;

    let reserved = RGBColor(31, 119, 180);
    let in_use = RGBColor(44, 160, 44);
    let poison = RGBColor(214, 39, 40);
    let recovery = RGBColor(148, 103, 189);
    chart
        .draw_series(LineSeries::new(
            [(0.0, limit as f64 / MIB), (x_max, limit as f64 / MIB)],
            BLACK.stroke_width(1),
        ))?
        .label("limit")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    chart
        .draw_series(LineSeries::new(
            samples
                .iter()
                .map(|s| (s.seconds, s.reserved_bytes as f64 / MIB)),
            reserved.stroke_width(2),
        ))?
        .label("reserved")
        .legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], reserved.stroke_width(2))
        });
    chart
        .draw_series(LineSeries::new(
            samples
                .iter()
                .map(|s| (s.seconds, s.in_use_bytes as f64 / MIB)),
            in_use.stroke_width(1),
        ))?
        .label("in use")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], in_use));

    let marker_y = y_max * 0.97;
    let poisons: Vec<f64> = events
        .iter()
        .filter(|e| e.kind == ContextEventKind::Poison)
        .map(|e| e.seconds)
        .collect();
    let recoveries: Vec<f64> = events
        .iter()
        .filter(|e| e.kind == ContextEventKind::Recovery)
        .map(|e| e.seconds)
        .collect();
    for &x in &poisons {
        chart.draw_series(LineSeries::new(
            [(x, 0.0), (x, marker_y)],
            poison.mix(0.35).stroke_width(1),
        ))?;
    }
    chart
        .draw_series(
            poisons
                .iter()
                .map(|&x| TriangleMarker::new((x, marker_y), 6, poison.filled())),
        )?
        .label(format!("poison ({})", poisons.len()))
        .legend(move |(x, y)| TriangleMarker::new((x + 10, y), 6, poison.filled()));
    chart
        .draw_series(
            recoveries
                .iter()
                .map(|&x| Circle::new((x, marker_y * 0.94), 4, recovery.filled())),
        )?
        .label(format!("recovery ({})", recoveries.len()))
        .legend(move |(x, y)| Circle::new((x + 10, y), 4, recovery.filled()));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plot_is_an_svg_with_the_series_and_markers() {
        let dir = std::env::temp_dir().join(format!("cistern-plot-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("run.svg");
        let samples: Vec<Sample> = (0..50)
            .map(|i| Sample {
                seconds: f64::from(i) * 0.1,
                reserved_bytes: (i as u64 % 10) << 20,
                in_use_bytes: (i as u64 % 7) << 20,
                peak_reserved_bytes: 9 << 20,
            })
            .collect();
        let events = [
            ContextEvent {
                seconds: 1.0,
                kind: ContextEventKind::Poison,
                generation: 0,
            },
            ContextEvent {
                seconds: 1.1,
                kind: ContextEventKind::Recovery,
                generation: 1,
            },
        ];
        let drawn = draw(&path, "test", &samples, &events, 16 << 20);
        assert_eq!(drawn, Ok(()));
        let svg = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        assert!(svg.contains("poison (1)") && svg.contains("recovery (1)"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
