//! The controller's and the webhook's working set against the ServiceMappings present, phase by phase,
//! as an SVG line plot committed beside the report (`make bench` writes it with the node section).

use std::fmt::Write;

use super::memory::Phase;

/// The file the plot is written to, beside the report.
pub const FILE: &str = "BENCHMARKS-memory-vs-mappings.svg";

const W: f64 = 640.0;
const H: f64 = 360.0;
const LEFT: f64 = 60.0;
const BOTTOM: f64 = 40.0;

/// A line of the plot: its label, colour and points (mappings, MiB).
type Series<'a> = (&'a str, &'a str, Vec<(f64, f64)>);

/// The plot of `phases`: one point per phase (the settled phases; the phase during the load is left
/// out, it has no more mappings than the idle one), the working set from the cgroup and the peak.
pub fn svg(phases: &[Phase]) -> String {
    let settled: Vec<&Phase> = phases
        .iter()
        .filter(|p| !p.name.contains("during"))
        .collect();
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let series: [Series; 3] = [
        (
            "controller working set",
            "#1f77b4",
            settled
                .iter()
                .map(|p| (p.mappings as f64, mib(p.controller.cgroup_ws)))
                .collect(),
        ),
        (
            "controller peak",
            "#aec7e8",
            settled
                .iter()
                .map(|p| (p.mappings as f64, mib(p.controller.peak)))
                .collect(),
        ),
        (
            "webhook working set",
            "#ff7f0e",
            settled
                .iter()
                .map(|p| (p.mappings as f64, mib(p.webhook.cgroup_ws)))
                .collect(),
        ),
    ];
    let max_x = settled.iter().map(|p| p.mappings).max().unwrap_or(1).max(1) as f64;
    let max_y = series
        .iter()
        .flat_map(|(_, _, pts)| pts.iter().map(|p| p.1))
        .fold(1.0_f64, f64::max)
        * 1.1;
    let x = |v: f64| LEFT + v / max_x * (W - LEFT - 20.0);
    let y = |v: f64| H - BOTTOM - v / max_y * (H - BOTTOM - 20.0);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">
<rect width="{W}" height="{H}" fill="white"/>
<line x1="{LEFT}" y1="{b}" x2="{r}" y2="{b}" stroke="black"/>
<line x1="{LEFT}" y1="20" x2="{LEFT}" y2="{b}" stroke="black"/>
<text x="{cx}" y="{xl}" text-anchor="middle">ServiceMappings present</text>
<text x="14" y="{cy}" text-anchor="middle" transform="rotate(-90 14 {cy})">MiB (cgroup)</text>
"#,
        b = H - BOTTOM,
        r = W - 20.0,
        cx = (W + LEFT) / 2.0,
        xl = H - 6.0,
        cy = (H - BOTTOM) / 2.0,
    );
    for i in 0..=4 {
        let (vx, vy) = (max_x * f64::from(i) / 4.0, max_y * f64::from(i) / 4.0);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{:.0}</text><text x="{}" y="{}" text-anchor="end">{:.0}</text>"#,
            x(vx),
            H - BOTTOM + 14.0,
            vx,
            LEFT - 4.0,
            y(vy) + 4.0,
            vy
        );
    }
    for (i, (label, colour, pts)) in series.iter().enumerate() {
        let path: Vec<String> = pts
            .iter()
            .map(|(a, b)| format!("{:.1},{:.1}", x(*a), y(*b)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for (a, b) in pts {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{colour}"/>"#,
                x(*a),
                y(*b)
            );
        }
        let ly = 30.0 + 14.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{}" y="{}" width="10" height="10" fill="{colour}"/><text x="{}" y="{}">{label}</text>"#,
            LEFT + 10.0,
            ly - 9.0,
            LEFT + 24.0,
            ly
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::node::memory::Sample;

    #[test]
    fn the_plot_is_an_svg_with_a_point_per_settled_phase() {
        let phase = |name: &str, mappings: usize, mib: u64| Phase {
            name: name.into(),
            mappings,
            webhook: Sample {
                cgroup_ws: mib << 19,
                ..Default::default()
            },
            controller: Sample {
                cgroup_ws: mib << 20,
                peak: (mib + 1) << 20,
                ..Default::default()
            },
        };
        let svg = svg(&[
            phase("(a) idle", 0, 4),
            phase("(b) during the load", 0, 5),
            phase("(c) 10000", 10_000, 12),
            phase("(e) 50000", 50_000, 40),
        ]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg.matches("<circle").count(),
            9,
            "3 series × 3 settled phases"
        );
        assert!(
            svg.contains(">50000<"),
            "the x axis reaches the most mappings"
        );
    }
}
