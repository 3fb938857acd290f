//! The paper's figures redrawn from our results with `plotters` (SVG), in the paper's
//! layout: Fig. 2 (100 clients; a: continuous, b: random), Fig. 3 (continuous; a: 200,
//! b: 400 clients), Fig. 4 (unnecessary retransmissions per client, 400 clients; a:
//! continuous, b: random), Fig. 5 (random; a: 200, b: 400 clients), all over the three
//! buffers of the error-free link, and Fig. 6 (10 clients on the 2,500 B buffer over
//! the three error profiles; a: continuous, b: random). Flow completion times are box
//! plots as in the paper (box: quartiles; line: median; whiskers: 10th–90th
//! percentile). The paper's medians are drawn beside our boxes in black: a triangle
//! where the paper states the value, a ring where it is back-calculated
//! ([`crate::paper::Source`]).

use crate::case::{Loss, Mode, Variant, Workload};
use crate::paper::{self, Source, INFINITE};
use crate::summary::Summary;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::io;
use std::path::Path;

/// One panel's groups along x: the buffers of the error-free link, or the error
/// profiles of the lossy one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Groups {
    Buffers,
    Losses,
}

/// A panel: a case family whose groups are along x.
#[derive(Debug, Clone, Copy)]
struct Panel {
    caption: &'static str,
    workload: Workload,
    clients: usize,
    groups: Groups,
}

impl Panel {
    /// The (buffer, loss) of group `i`.
    fn group(&self, i: usize) -> (usize, Loss) {
        match self.groups {
            Groups::Buffers => ([2_500, 28_200, INFINITE][i], Loss::None),
            Groups::Losses => (2_500, Loss::ALL[i]),
        }
    }

    fn group_label(&self, i: usize) -> String {
        match self.groups {
            Groups::Buffers => ["2500 B", "28200 B", "infinite"][i].to_string(),
            Groups::Losses => ["error-free", "medium errors", "high errors"][i].to_string(),
        }
    }
}

/// What a figure shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Measure {
    /// Flow completion time, box plots.
    Fct,
    /// Unnecessary retransmissions per client, bars (TCP's SYN/SYN-ACK ones stacked).
    Unnecessary,
}

/// A figure of the paper.
#[derive(Debug, Clone, Copy)]
struct Figure {
    name: &'static str,
    title: &'static str,
    measure: Measure,
    panels: [Panel; 2],
}

const fn panel(caption: &'static str, workload: Workload, clients: usize, groups: Groups) -> Panel {
    Panel {
        caption,
        workload,
        clients,
        groups,
    }
}

const FIGURES: [Figure; 5] = {
    use Groups::{Buffers, Losses};
    use Workload::{Continuous as C, Random as R};
    [
        Figure {
            name: "fig2",
            title: "Fig. 2: flow completion time with 100 clients",
            measure: Measure::Fct,
            panels: [
                panel("(a) Continuous clients", C, 100, Buffers),
                panel("(b) Random clients", R, 100, Buffers),
            ],
        },
        Figure {
            name: "fig3",
            title: "Fig. 3: flow completion time with continuous clients",
            measure: Measure::Fct,
            panels: [
                panel("(a) 200 clients", C, 200, Buffers),
                panel("(b) 400 clients", C, 400, Buffers),
            ],
        },
        Figure {
            name: "fig4",
            title: "Fig. 4: unnecessary retransmissions per client for 400 clients",
            measure: Measure::Unnecessary,
            panels: [
                panel("(a) Continuous clients", C, 400, Buffers),
                panel("(b) Random clients", R, 400, Buffers),
            ],
        },
        Figure {
            name: "fig5",
            title: "Fig. 5: flow completion time with random clients",
            measure: Measure::Fct,
            panels: [
                panel("(a) 200 clients", R, 200, Buffers),
                panel("(b) 400 clients", R, 400, Buffers),
            ],
        },
        Figure {
            name: "fig6",
            title: "Fig. 6: flow completion time over an error-prone link (10 clients)",
            measure: Measure::Fct,
            panels: [
                panel("(a) Continuous clients", C, 10, Losses),
                panel("(b) Random clients", R, 10, Losses),
            ],
        },
    ]
};

/// Colours per variant (the paper's three first).
fn color(v: Variant) -> RGBColor {
    match v {
        Variant::Default => RGBColor(214, 39, 40),
        Variant::Cocoa => RGBColor(31, 119, 180),
        Variant::Tcp => RGBColor(127, 127, 127),
        Variant::CocoaStrong => RGBColor(23, 190, 207),
        Variant::Fasor => RGBColor(44, 160, 44),
        Variant::FasorK => RGBColor(255, 127, 14),
        Variant::Karn => RGBColor(148, 103, 189),
    }
}

/// The variants in the order of the paper's legends, then ours.
const ORDER: [Variant; 7] = [
    Variant::Default,
    Variant::Cocoa,
    Variant::Tcp,
    Variant::CocoaStrong,
    Variant::Fasor,
    Variant::FasorK,
    Variant::Karn,
];

/// The paper's median for a case, if it gives one.
fn paper_median(
    w: Workload,
    clients: usize,
    buffer: usize,
    loss: Loss,
    v: Variant,
) -> Option<(f64, Source)> {
    if loss != Loss::None {
        return None;
    }
    if let Some((.., p)) = paper::TABLE_I
        .iter()
        .find(|t| (t.0, t.1, t.2, t.3) == (w, clients, buffer, v))
    {
        return Some((p[2], Source::Stated));
    }
    (w == Workload::Continuous)
        .then(|| {
            paper::MEDIANS
                .iter()
                .find(|m| (m.clients, m.buffer, m.variant) == (clients, buffer, v))
                .map(|m| (m.median, m.source))
        })
        .flatten()
}

fn find<'a>(
    summaries: &'a [Summary],
    mode: Mode,
    p: &Panel,
    group: usize,
    v: Variant,
) -> Option<&'a Summary> {
    let (buffer, loss) = p.group(group);
    summaries.iter().find(|s| {
        let g = &s.group;
        (g.mode, g.workload, g.clients, g.buffer, g.loss, g.variant)
            == (mode, p.workload, p.clients, buffer, loss, v)
    })
}

/// The variants that have a value in either panel of `fig` (our results or the paper's).
fn variants(fig: &Figure, summaries: &[Summary], mode: Mode) -> Vec<Variant> {
    ORDER
        .into_iter()
        .filter(|&v| {
            fig.panels.iter().any(|p| {
                (0..3).any(|g| {
                    let (b, l) = p.group(g);
                    find(summaries, mode, p, g, v).is_some()
                        || (fig.measure == Measure::Fct
                            && paper_median(p.workload, p.clients, b, l, v).is_some())
                })
            })
        })
        .collect()
}

fn plot_error(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("cannot draw the figure: {e}"))
}

/// Draws one panel into `area`.
fn draw_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    fig: &Figure,
    p: &Panel,
    summaries: &[Summary],
    mode: Mode,
    variants: &[Variant],
) -> io::Result<()> {
    let value = |s: &Summary| match fig.measure {
        Measure::Fct => s.fct.map_or(0.0, |f| f[4]),
        Measure::Unnecessary => s.unnecessary + s.handshake,
    };
    let mut top: f64 = 0.0;
    for g in 0..3 {
        let (b, l) = p.group(g);
        for &v in variants {
            if let Some(s) = find(summaries, mode, p, g, v) {
                top = top.max(value(s));
            }
            if fig.measure == Measure::Fct {
                if let Some((m, _)) = paper_median(p.workload, p.clients, b, l, v) {
                    top = top.max(m);
                }
            }
        }
    }
    let top = if top > 0.0 { top * 1.1 } else { 1.0 };
    let y_desc = match fig.measure {
        Measure::Fct => "Flow completion time (s)",
        Measure::Unnecessary => "Unnecessary retransmissions per client",
    };
    let mut chart = ChartBuilder::on(area)
        .caption(p.caption, ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..3f64, 0f64..top)
        .map_err(plot_error)?;
    let label = |x: &f64| {
        let i = x.floor() as usize;
        if (x - (i as f64 + 0.5)).abs() < 1e-6 && i < 3 {
            p.group_label(i)
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(7)
        .x_label_formatter(&label)
        .y_label_formatter(&|y: &f64| {
            if top >= 10.0 {
                format!("{y:.0}")
            } else {
                format!("{y:.1}")
            }
        })
        .y_desc(y_desc)
        .draw()
        .map_err(plot_error)?;
    let slot = 0.8 / variants.len().max(1) as f64;
    for g in 0..3 {
        let (b, l) = p.group(g);
        for (i, &v) in variants.iter().enumerate() {
            let x0 = g as f64 + 0.1 + slot * i as f64;
            let (left, right, mid) = (x0 + slot * 0.15, x0 + slot * 0.65, x0 + slot * 0.4);
            let c = color(v);
            if let Some(s) = find(summaries, mode, p, g, v) {
                match (fig.measure, s.fct) {
                    (Measure::Fct, Some(f)) => {
                        let boxes = [
                            Rectangle::new([(left, f[1]), (right, f[3])], c.mix(0.35).filled()),
                            Rectangle::new([(left, f[1]), (right, f[3])], c.stroke_width(1)),
                        ];
                        chart.draw_series(boxes).map_err(plot_error)?;
                        let lines = [
                            vec![(mid, f[0]), (mid, f[1])],
                            vec![(mid, f[3]), (mid, f[4])],
                            vec![(left, f[0]), (right, f[0])],
                            vec![(left, f[4]), (right, f[4])],
                        ];
                        chart
                            .draw_series(lines.into_iter().map(|l| PathElement::new(l, c)))
                            .map_err(plot_error)?;
                        chart
                            .draw_series([PathElement::new(
                                vec![(left, f[2]), (right, f[2])],
                                c.stroke_width(3),
                            )])
                            .map_err(plot_error)?;
                    }
                    (Measure::Fct, None) => {}
                    (Measure::Unnecessary, _) => {
                        let (coap, hs) = (s.unnecessary, s.handshake);
                        chart
                            .draw_series([
                                Rectangle::new([(left, 0.0), (right, coap)], c.filled()),
                                Rectangle::new(
                                    [(left, coap), (right, coap + hs)],
                                    c.mix(0.35).filled(),
                                ),
                            ])
                            .map_err(plot_error)?;
                    }
                }
            }
            if fig.measure == Measure::Fct {
                if let Some((m, source)) = paper_median(p.workload, p.clients, b, l, v) {
                    let at = (x0 + slot * 0.85, m);
                    match source {
                        Source::Stated => chart
                            .draw_series([TriangleMarker::new(at, 5, BLACK.filled())])
                            .map(|_| ()),
                        Source::Derived => chart
                            .draw_series([Circle::new(at, 4, BLACK.stroke_width(2))])
                            .map(|_| ()),
                    }
                    .map_err(plot_error)?;
                }
            }
        }
    }
    Ok(())
}

/// Draws `fig` for `mode` into an SVG string, or `None` if neither our results nor the
/// paper have a value for it.
fn draw(fig: &Figure, summaries: &[Summary], mode: Mode) -> io::Result<Option<String>> {
    let variants = variants(fig, summaries, mode);
    let ours = fig.panels.iter().any(|p| {
        (0..3).any(|g| {
            variants
                .iter()
                .any(|&v| find(summaries, mode, p, g, v).is_some())
        })
    });
    if !ours {
        return Ok(None);
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1100, 470)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let mode_name = match mode {
            Mode::Emulated => "emulated",
            Mode::Virtual => "virtual time",
        };
        let root = root
            .titled(&format!("{} ({mode_name})", fig.title), ("sans-serif", 18))
            .map_err(plot_error)?;
        let (body, legend) = root.split_vertically(410);
        let halves = body.split_evenly((1, 2));
        for (area, p) in halves.iter().zip(&fig.panels) {
            draw_panel(area, fig, p, summaries, mode, &variants)?;
        }
        let mut x = 20;
        for &v in &variants {
            legend
                .draw(&Rectangle::new([(x, 8), (x + 12, 20)], color(v).filled()))
                .map_err(plot_error)?;
            legend
                .draw(&Text::new(v.label(), (x + 16, 8), ("sans-serif", 13)))
                .map_err(plot_error)?;
            x += 24 + 8 * v.label().len() as i32;
        }
        let note = match fig.measure {
            Measure::Fct => "the paper's median: ▲ stated, ○ back-calculated",
            Measure::Unnecessary => "solid: CoAP messages; pale: TCP SYN/SYN-ACK",
        };
        legend
            .draw(&Text::new(note, (x + 10, 8), ("sans-serif", 13)))
            .map_err(plot_error)?;
        root.present().map_err(plot_error)?;
    }
    Ok(Some(svg))
}

/// Writes `figN-MODE.svg` for each of the paper's figures and each mode with results
/// for it into `dir`; returns the names written.
pub fn write_all(dir: &Path, summaries: &[Summary]) -> io::Result<Vec<String>> {
    let mut written = Vec::new();
    for mode in [Mode::Emulated, Mode::Virtual] {
        for fig in &FIGURES {
            if let Some(svg) = draw(fig, summaries, mode)? {
                let name = format!(
                    "{}-{}.svg",
                    fig.name,
                    match mode {
                        Mode::Emulated => "emulated",
                        Mode::Virtual => "virtual",
                    }
                );
                std::fs::write(dir.join(&name), svg)?;
                written.push(name);
            }
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::Group;

    fn summary(clients: usize, buffer: usize, v: Variant, median: f64) -> Summary {
        Summary {
            group: Group {
                mode: Mode::Virtual,
                workload: Workload::Continuous,
                clients,
                buffer,
                loss: Loss::None,
                variant: v,
            },
            runs: 1,
            finished: clients,
            unfinished: 0,
            fct: Some([
                median - 2.0,
                median - 1.0,
                median,
                median + 1.0,
                median + 2.0,
            ]),
            retransmissions: 0.0,
            unnecessary: 0.0,
            handshake: 0.0,
            failures: 0,
            drops_queue_down: 0.0,
            wall_s: 0.0,
        }
    }

    #[test]
    fn fig3_draws_our_boxes_and_the_papers_derived_medians_as_rings() {
        let s = [summary(200, 2500, Variant::Default, 180.0)];
        let svg = draw(&FIGURES[1], &s, Mode::Virtual).unwrap().unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.contains("Fig. 3") && svg.contains("2500 B"));
        // The paper's three variants are in the legend though only Default CoAP ran.
        for v in [Variant::Default, Variant::Cocoa, Variant::Tcp] {
            assert!(svg.contains(v.label()), "{}", v.label());
        }
        // The paper's 200- and 400-client medians are back-calculated: rings, no triangles.
        assert_eq!(svg.matches("<circle").count(), 6, "{svg}");
        assert!(!svg.contains("<polygon"));
        // Its 100-client ones are stated: triangles.
        let s100 = [summary(100, 2500, Variant::Default, 100.0)];
        let fig2 = draw(&FIGURES[0], &s100, Mode::Virtual).unwrap().unwrap();
        assert_eq!(fig2.matches("<polygon").count(), 3, "{fig2}");
        // No emulated results: no emulated figure.
        assert!(draw(&FIGURES[1], &s, Mode::Emulated).unwrap().is_none());
        assert_eq!(
            paper_median(Workload::Continuous, 200, 2500, Loss::None, Variant::Tcp),
            Some((171.3, Source::Derived))
        );
        assert_eq!(
            paper_median(Workload::Continuous, 50, INFINITE, Loss::None, Variant::Tcp),
            Some((69.868, Source::Stated))
        );
    }
}
