//! A hand-written SVG grouped bar chart: drain events/s per workload, one
//! bar per tool (medians).

use std::fmt::Write as _;

use crate::report::{Results, Tool};

const W: f64 = 980.0;
const H: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 90.0;
/// One colour per [`Tool::ALL`] entry, in its order.
const COLORS: [&str; Tool::ALL.len()] = [
    "#2b6cb0", "#90cdf4", "#38a169", "#805ad5", "#718096", "#a0aec0", "#dd6b20", "#c53030",
    "#feb2b2",
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

pub fn drain_chart(r: &Results) -> String {
    // The tools this run drained with (the baseline binary only with
    // `--baseline-bin`), each with its colour.
    let tools: Vec<(Tool, &str)> = Tool::ALL
        .iter()
        .zip(COLORS)
        .filter(|(t, _)| r.drain.iter().any(|d| d.tool == **t))
        .map(|(t, c)| (*t, c))
        .collect();
    let groups: Vec<(String, Vec<Option<f64>>)> = r
        .workloads
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
        .collect();
    let max = groups
        .iter()
        .flat_map(|(_, v)| v.iter().flatten())
        .fold(0.0f64, |a, b| a.max(*b));
    let (top, step) = axis(max);
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let y = |v: f64| TOP + plot_h - v / top * plot_h;
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
    // Legend.
    let mut lx = LEFT;
    for (t, colour) in &tools {
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="30" width="10" height="10" fill="{}"/><text x="{}" y="39">{}</text>"#,
            colour,
            lx + 14.0,
            escape(t.label())
        );
        lx += 14.0 + t.label().len() as f64 * 6.2 + 16.0;
    }
    // Grid and axis labels.
    let mut v = 0.0;
    while v <= top + step / 2.0 {
        let yy = y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#e2e8f0"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            yy + 4.0,
            short(v)
        );
        v += step;
    }
    let n = groups.len().max(1) as f64;
    let group_w = plot_w / n;
    let bar_w = (group_w * 0.8) / tools.len().max(1) as f64;
    for (gi, (label, values)) in groups.iter().enumerate() {
        let gx = LEFT + gi as f64 * group_w + group_w * 0.1;
        for (ti, value) in values.iter().enumerate() {
            let x = gx + ti as f64 * bar_w;
            match value {
                Some(val) => {
                    let yy = y(*val);
                    let _ = writeln!(
                        s,
                        r#"<rect x="{x:.1}" y="{yy:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {:.0} events/s</title></rect>"#,
                        bar_w - 1.0,
                        TOP + plot_h - yy,
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
                        TOP + plot_h - 3.0
                    );
                }
            }
        }
        let cx = LEFT + gi as f64 * group_w + group_w / 2.0;
        for (li, part) in label.split(", ").enumerate() {
            let _ = writeln!(
                s,
                r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                TOP + plot_h + 16.0 + li as f64 * 13.0,
                escape(part)
            );
        }
    }
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#4a5568"/>"##,
        W - RIGHT,
        TOP + plot_h,
        TOP + plot_h
    );
    s.push_str("</svg>\n");
    s
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
