//! A hand-written SVG grouped bar chart: drain events/s per workload, one
//! bar per tool (medians).

use std::fmt::Write as _;

use crate::runs::{Results, Tool};

const W: f64 = 980.0;
const H: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 90.0;
/// One colour per [`Tool::ALL`] entry, in its order.
const COLORS: [&str; Tool::ALL.len()] = [
    "#2b6cb0", "#90cdf4", "#38a169", "#805ad5", "#718096", "#a0aec0", "#cbd5e0", "#d69e2e",
    "#dd6b20", "#c53030", "#feb2b2",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn short(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.1}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.0}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// "Nice" axis maximum and step for `max`.
fn axis(max: f64) -> (f64, f64) {
    if max <= 0.0 {
        return (1.0, 0.25);
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    ((max / step).ceil() * step, step)
}

/// The plot area's size, inside the margins.
const PLOT_W: f64 = W - LEFT - RIGHT;
const PLOT_H: f64 = H - TOP - BOTTOM;

/// A tool this run drained with, and its colour.
type Bar = (Tool, &'static str);

/// The chart: a title, the legend, the grid, a group of bars per
/// workload (one per tool, "n/a" where the tool did not drain it) and the
/// x axis.
pub fn drain_chart(r: &Results) -> String {
    let tools = drained_tools(r);
    let groups = medians(r, &tools);
    let plot = Plot::new(&groups, tools.len());
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="20" font-size="14" font-weight="bold">Drain of a committed backlog: events/s (median of {} runs, higher is better)</text>"#,
        r.repeats
    );
    legend(&mut s, &tools);
    grid(&mut s, &plot);
    for (gi, (label, values)) in groups.iter().enumerate() {
        bars(&mut s, &plot, gi, values, &tools);
        group_label(&mut s, &plot, gi, label);
    }
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#4a5568"/>"##,
        W - RIGHT,
        TOP + PLOT_H,
        TOP + PLOT_H
    );
    s.push_str("</svg>\n");
    s
}

/// The tools this run drained with (the baseline binary only with
/// `--baseline-bin`), each with its colour.
fn drained_tools(r: &Results) -> Vec<Bar> {
    Tool::ALL
        .iter()
        .zip(COLORS)
        .filter(|(t, _)| r.drain.iter().any(|d| d.tool == **t))
        .map(|(t, c)| (*t, c))
        .collect()
}

/// Per workload: its label and each tool's median events/s (`None`:
/// the tool did not drain it).
fn medians(r: &Results, tools: &[Bar]) -> Vec<(String, Vec<Option<f64>>)> {
    r.workloads
        .iter()
        .map(|w| {
            (
                w.label(),
                tools
                    .iter()
                    .map(|(t, _)| r.summary(&w.id, *t).map(|s| s.rate.median))
                    .collect(),
            )
        })
        .collect()
}

/// Where things go: the y axis's top and step (from the highest bar) and
/// the widths of a workload's group and of a bar.
struct Plot {
    top: f64,
    step: f64,
    group_w: f64,
    bar_w: f64,
}

impl Plot {
    fn new(groups: &[(String, Vec<Option<f64>>)], tools: usize) -> Plot {
        let max = groups
            .iter()
            .flat_map(|(_, v)| v.iter().flatten())
            .fold(0.0f64, |a, b| a.max(*b));
        let (top, step) = axis(max);
        let n = groups.len().max(1) as f64;
        let group_w = PLOT_W / n;
        let bar_w = (group_w * 0.8) / tools.max(1) as f64;
        Plot {
            top,
            step,
            group_w,
            bar_w,
        }
    }

    /// The y of value `v`.
    fn y(&self, v: f64) -> f64 {
        TOP + PLOT_H - v / self.top * PLOT_H
    }
}

/// A swatch and a label per tool, in a row under the title.
fn legend(s: &mut String, tools: &[Bar]) {
    let mut lx = LEFT;
    for (t, colour) in tools {
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="30" width="10" height="10" fill="{}"/><text x="{}" y="39">{}</text>"#,
            colour,
            lx + 14.0,
            escape(t.label())
        );
        lx += 14.0 + t.label().len() as f64 * 6.2 + 16.0;
    }
}

/// Grid lines and axis labels, a step apart up to the axis's top.
fn grid(s: &mut String, plot: &Plot) {
    let mut v = 0.0;
    while v <= plot.top + plot.step / 2.0 {
        let yy = plot.y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#e2e8f0"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            yy + 4.0,
            short(v)
        );
        v += plot.step;
    }
}

/// The bars of workload `gi`: one per tool, its value above it, or
/// "n/a".
fn bars(s: &mut String, plot: &Plot, gi: usize, values: &[Option<f64>], tools: &[Bar]) {
    let Plot { bar_w, group_w, .. } = *plot;
    let gx = LEFT + gi as f64 * group_w + group_w * 0.1;
    for (ti, value) in values.iter().enumerate() {
        let x = gx + ti as f64 * bar_w;
        match value {
            Some(val) => {
                let yy = plot.y(*val);
                let _ = writeln!(
                    s,
                    r#"<rect x="{x:.1}" y="{yy:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {:.0} events/s</title></rect>"#,
                    bar_w - 1.0,
                    TOP + PLOT_H - yy,
                    tools[ti].1,
                    escape(tools[ti].0.label()),
                    val
                );
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" font-size="9" text-anchor="middle">{}</text>"#,
                    x + bar_w / 2.0,
                    yy - 3.0,
                    short(*val)
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    r##"<text x="{:.1}" y="{:.1}" font-size="9" text-anchor="middle" fill="#a0aec0">n/a</text>"##,
                    x + bar_w / 2.0,
                    TOP + PLOT_H - 3.0
                );
            }
        }
    }
}

/// Workload `gi`'s label under its group, a line per ", "-separated
/// part.
fn group_label(s: &mut String, plot: &Plot, gi: usize, label: &str) {
    let cx = LEFT + gi as f64 * plot.group_w + plot.group_w / 2.0;
    for (li, part) in label.split(", ").enumerate() {
        let _ = writeln!(
            s,
            r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            TOP + PLOT_H + 16.0 + li as f64 * 13.0,
            escape(part)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_axis() {
        assert_eq!(axis(480_000.0), (500_000.0, 100_000.0));
        assert_eq!(axis(0.0), (1.0, 0.25));
        assert_eq!(short(1_250_000.0), "1.2M");
    }
}
