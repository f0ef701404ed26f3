//! Text rendering of the operator view: one block per node, one row per device, one line per
//! holder, so a row never grows with the number of pods and the default table stays within 80
//! columns for typical names. Colour is optional (the caller decides: terminal and `NO_COLOR`).
//!
//! Presentation only: every number comes from [`crate::cluster::report`].

use std::fmt::Write as _;

use crate::cluster::report::{
    ClusterReport, CpuHolder, CpuReport, DeviceReport, DeviceState, Holder, NodeReport,
    PartitionReport, StateCounts, Summary, Usage,
};
use crate::model::device::format_bytes;
use crate::model::quantity::Quantity;

const RED: &str = "\x1b[31m";
const YELLOW: &str = "\x1b[33m";
const BOLD: &str = "\x1b[1m";
const RESET: &str = "\x1b[0m";

/// A cell: its text and an optional colour.
struct Cell {
    text: String,
    style: Option<&'static str>,
}

impl Cell {
    fn plain(text: impl Into<String>) -> Self {
        Cell {
            text: text.into(),
            style: None,
        }
    }
    fn styled(text: impl Into<String>, style: Option<&'static str>) -> Self {
        Cell {
            text: text.into(),
            style,
        }
    }
}

/// Aligned columns; the last column is not padded (no trailing spaces).
fn table(out: &mut String, indent: &str, rows: &[Vec<Cell>], color: bool) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0usize; columns];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.text.chars().count());
        }
    }
    for row in rows {
        let mut line = String::from(indent);
        for (i, cell) in row.iter().enumerate() {
            let last = i + 1 == row.len();
            match (color, cell.style) {
                (true, Some(style)) => {
                    let _ = write!(line, "{style}{}{RESET}", cell.text);
                }
                _ => line.push_str(&cell.text),
            }
            if !last {
                let pad = widths[i] - cell.text.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

/// Bytes for people: the exact quantity when it has a binary suffix (`80Gi`), else one decimal
/// of the largest suffix it reaches (`7.5Gi` for 8,074,538,516), never a ten-digit number.
pub(crate) fn bytes(v: i64) -> String {
    let exact = format_bytes(Quantity::from_units(v));
    if v.unsigned_abs() < 1024 || !exact.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
        return exact;
    }
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let mut scaled = v as f64 / 1024.0;
    let mut exp = 0;
    while scaled.abs() >= 1024.0 && exp < SUFFIXES.len() - 1 {
        scaled /= 1024.0;
        exp += 1;
    }
    format!("{scaled:.1}{}", SUFFIXES[exp])
}

fn used_of(u: Option<Usage>, fmt: fn(i64) -> String) -> String {
    match u {
        Some(u) => format!("{}/{}", fmt(u.used), fmt(u.total)),
        None => "-".to_string(),
    }
}

fn state_cell(d: &DeviceReport) -> Cell {
    match d.state {
        DeviceState::WholeFree => Cell::plain("free"),
        DeviceState::PartlyUsed => Cell::plain("partial"),
        DeviceState::Full => Cell::plain("full"),
        DeviceState::Unhealthy => Cell::styled("UNHEALTHY", Some(RED)),
        DeviceState::Absent => Cell::styled("absent", Some(YELLOW)),
    }
}

fn holder_text(h: &Holder, wide: bool) -> (String, Option<&'static str>) {
    let mut s = if h.pod.is_empty() {
        format!("uid:{}", h.uid)
    } else {
        h.pod.clone()
    };
    if wide {
        let mut parts = Vec::new();
        if let Some(c) = h.core_percent {
            parts.push(format!("core {c}"));
        }
        if let Some(m) = h.memory_bytes {
            parts.push(format!("mem {}", bytes(m)));
        }
        if let Some(p) = h.share_percent {
            parts.push(format!("share {p}"));
        }
        if !h.vfs.is_empty() {
            parts.push(format!("VF {}", h.vfs.join(",")));
        }
        if !parts.is_empty() {
            let _ = write!(s, " ({})", parts.join(", "));
        }
        if !h.pod.is_empty() && !h.uid.is_empty() {
            let _ = write!(s, " uid={}", h.uid);
        }
    }
    if h.entry == "assumed" {
        s.push_str(" [assumed]");
        (s, Some(YELLOW))
    } else if h.entry.starts_with("dra-") {
        (s, Some(YELLOW))
    } else {
        (s, None)
    }
}

/// Rows for one device type: a header, then one row per device and one more per extra holder.
fn device_rows(kind: &str, devices: &[DeviceReport], wide: bool) -> Vec<Vec<Cell>> {
    let gpu = kind == "GPU";
    let mut header = vec![
        Cell::plain(kind),
        Cell::plain("STATE"),
        Cell::plain("NUMA"),
        Cell::plain("PCIE"),
    ];
    if wide {
        header.insert(1, Cell::plain("ID"));
    }
    if gpu {
        header.push(Cell::plain("CORE%"));
        header.push(Cell::plain("MEMORY"));
    } else {
        header.push(Cell::plain("SHARE%"));
    }
    header.push(Cell::plain("HOLDERS"));
    let mut rows = vec![header];
    for d in devices {
        let mut row = vec![
            Cell::plain(d.minor.to_string()),
            state_cell(d),
            Cell::plain(d.numa.map_or("-".to_string(), |n| n.to_string())),
            Cell::plain(d.pcie.clone().unwrap_or_else(|| "-".to_string())),
        ];
        if wide {
            row.insert(1, Cell::plain(if d.id.is_empty() { "-" } else { &d.id }));
        }
        let width = row.len() + if gpu { 2 } else { 1 };
        if gpu {
            row.push(Cell::plain(used_of(d.core_percent, |v| v.to_string())));
            row.push(Cell::plain(used_of(d.memory_bytes, bytes)));
        } else {
            row.push(Cell::plain(used_of(d.share_percent, |v| v.to_string())));
        }
        let mut holders = d.holders.iter();
        match holders.next() {
            Some(h) => {
                let (text, style) = holder_text(h, wide);
                row.push(Cell::styled(text, style));
            }
            None => row.push(Cell::plain("-")),
        }
        rows.push(row);
        for h in holders {
            let mut more: Vec<Cell> = (0..width).map(|_| Cell::plain("")).collect();
            let (text, style) = holder_text(h, wide);
            more.push(Cell::styled(text, style));
            rows.push(more);
        }
    }
    rows
}

fn cpus_of(milli: i64) -> String {
    Quantity::from_milli(milli.into()).to_string()
}

fn cpu_holder_text(h: &CpuHolder, wide: bool) -> (String, Option<&'static str>) {
    let mut s = if h.pod.is_empty() {
        format!("uid:{}", h.uid)
    } else {
        h.pod.clone()
    };
    if wide && !h.pod.is_empty() {
        let _ = write!(s, " uid={}", h.uid);
    }
    if let Some(m) = &h.malformed {
        let _ = write!(s, " MALFORMED: {m}");
        return (s, Some(RED));
    }
    if h.entry == "assumed" {
        s.push_str(" [assumed]");
        (s, Some(YELLOW))
    } else {
        (s, None)
    }
}

/// The CPU part of a node's block: a heading line, one row per NUMA node, one per holder.
fn cpu_block(out: &mut String, c: &CpuReport, wide: bool, color: bool) {
    let mut heading = format!(
        "  CPUS {}  reserved {}  NUMA policy {}",
        c.cpus.as_deref().unwrap_or("unknown"),
        if c.reserved.is_empty() {
            "-"
        } else {
            &c.reserved
        },
        c.numa_policy
    );
    if let Some(why) = &c.unusable {
        let note = format!("  NO CPUSETS: {why}");
        if color {
            let _ = write!(heading, "{RED}{note}{RESET}");
        } else {
            heading.push_str(&note);
        }
    }
    if let Some(a) = &c.amplification {
        let note = match (&a.ratio, a.free_milli) {
            (Some(ratio), Some(free)) => format!(
                "  CPU AMPLIFIED ×{ratio}: {} of {} left",
                cpus_of(free),
                cpus_of(a.allocatable_milli)
            ),
            _ => format!(
                "  INVALID CPU AMPLIFICATION RATIO: {}",
                a.invalid.as_deref().unwrap_or("")
            ),
        };
        heading.push_str(&note);
    }
    out.push_str(&heading);
    out.push('\n');
    let mut rows = vec![vec![
        Cell::plain("NUMA"),
        Cell::plain("FREE CPUS"),
        Cell::plain("CPU"),
        Cell::plain("MEMORY"),
    ]];
    for n in &c.numa {
        rows.push(vec![
            Cell::plain(n.id.to_string()),
            Cell::plain(match n.free_cpus.as_deref() {
                None => "-",
                Some("") => "none",
                Some(f) => f,
            }),
            // On an amplified node, what NUMA placement counts (the heading names the ratio).
            Cell::plain(used_of(
                Some(n.amplified.as_ref().map_or(n.cpu_milli, |a| a.cpu_milli)),
                cpus_of,
            )),
            Cell::plain(used_of(
                Some(
                    n.amplified
                        .as_ref()
                        .map_or(n.memory_bytes, |a| a.memory_bytes),
                ),
                bytes,
            )),
        ]);
    }
    table(out, "  ", &rows, color);
    if c.holders.is_empty() {
        return;
    }
    let mut rows = vec![vec![
        Cell::plain("CPUSET"),
        Cell::plain("NUMA"),
        Cell::plain("EXCLUSIVE"),
        Cell::plain("HOLDER"),
    ]];
    for h in &c.holders {
        let (text, style) = cpu_holder_text(h, wide);
        let numa: Vec<String> = h.numa.iter().map(u32::to_string).collect();
        rows.push(vec![
            Cell::plain(if h.cpuset.is_empty() { "-" } else { &h.cpuset }),
            Cell::plain(if numa.is_empty() {
                "-".to_string()
            } else {
                numa.join(",")
            }),
            Cell::plain(if h.exclusive.is_empty() {
                "-"
            } else {
                &h.exclusive
            }),
            Cell::styled(text, style),
        ]);
    }
    table(out, "  ", &rows, color);
}

/// One node's block.
pub fn node(out: &mut String, n: &NodeReport, wide: bool, color: bool) {
    let name = if color {
        format!("{BOLD}{}{RESET}", n.name)
    } else {
        n.name.clone()
    };
    let mut notes = Vec::new();
    if !n.node_object {
        notes.push("no Node object".to_string());
    }
    if !n.device_object {
        notes.push("no Device object".to_string());
    }
    if !n.blocked_by.is_empty() {
        notes.push(format!(
            "BLOCKED: malformed device-allocated on {}",
            n.blocked_by.join(", ")
        ));
    }
    if !n.unknown_identity.is_empty() {
        notes.push(format!(
            "UNKNOWN IDENTITY: {} hold devices without a device-allocated annotation",
            n.unknown_identity.join(", ")
        ));
    }
    if notes.is_empty() {
        let _ = writeln!(out, "NODE {name}");
    } else {
        let _ = writeln!(out, "NODE {name} ({})", notes.join("; "));
    }
    let mut any = false;
    for (kind, list) in [("GPU", &n.gpus), ("RDMA", &n.rdma), ("FPGA", &n.fpga)] {
        if list.is_empty() {
            continue;
        }
        any = true;
        table(out, "  ", &device_rows(kind, list, wide), color);
    }
    if !any {
        out.push_str("  no devices\n");
    }
    if let Some(p) = &n.gpu_partitions {
        partition_lines(out, p);
    }
    if let Some(c) = &n.cpus {
        cpu_block(out, c, wide, color);
    }
}

/// `GPU PARTITIONS builtin-hopper, Honor` and one line per size: each partition's minors, `*`
/// marking the free ones.
fn partition_lines(out: &mut String, p: &PartitionReport) {
    let _ = write!(out, "  GPU PARTITIONS {}, {}", p.source, p.policy);
    if let Some(why) = &p.invalid {
        let _ = write!(out, "  (Device table ignored: {why})");
    }
    out.push('\n');
    for size in &p.sizes {
        let free = size.partitions.iter().filter(|r| r.free).count();
        let rows: Vec<String> = size
            .partitions
            .iter()
            .map(|r| {
                let minors: Vec<String> = r.minors.iter().map(i32::to_string).collect();
                format!("{}{}", minors.join(","), if r.free { "*" } else { "" })
            })
            .collect();
        let _ = writeln!(
            out,
            "    {} GPUs: {free} of {} free  {}",
            size.gpus,
            size.partitions.len(),
            rows.join("  ")
        );
    }
}

fn counts(c: &StateCounts) -> String {
    format!(
        "{} total: {} whole-free, {} partly used, {} full, {} unhealthy",
        c.total, c.whole_free, c.partly_used, c.full, c.unhealthy
    )
}

/// The summary block (`title` is e.g. `SUMMARY`, `BEFORE`, `AFTER`).
pub fn summary(out: &mut String, title: &str, s: &Summary) {
    let plural = if s.nodes == 1 { "" } else { "s" };
    let _ = writeln!(out, "{title}: {} node{plural}", s.nodes);
    let mut rows = vec![
        vec![Cell::plain("GPUs"), Cell::plain(counts(&s.gpus))],
        vec![
            Cell::plain("GPU memory"),
            Cell::plain(format!(
                "{} of {} used",
                bytes(s.gpu_memory_bytes.used),
                bytes(s.gpu_memory_bytes.total)
            )),
        ],
        vec![
            Cell::plain("GPU core"),
            Cell::plain(format!(
                "{}% of {}% used",
                s.gpu_core_percent.used, s.gpu_core_percent.total
            )),
        ],
        vec![
            Cell::plain("fragmentation"),
            Cell::plain(format!(
                "{} free on partly used GPUs",
                bytes(s.fragmentation_bytes)
            )),
        ],
    ];
    if s.rdma.total > 0 {
        rows.push(vec![Cell::plain("RDMA"), Cell::plain(counts(&s.rdma))]);
    }
    if s.fpga.total > 0 {
        rows.push(vec![Cell::plain("FPGA"), Cell::plain(counts(&s.fpga))]);
    }
    table(out, "  ", &rows, false);
}

/// Every node's block, then the summary.
pub fn cluster(view: &ClusterReport, wide: bool, color: bool) -> String {
    let mut out = String::new();
    for n in &view.nodes {
        node(&mut out, n, wide, color);
        out.push('\n');
    }
    summary(&mut out, "SUMMARY", &view.summary);
    out
}

#[cfg(test)]
mod tests {
    use super::bytes;

    #[test]
    fn bytes_read_as_people_read_them() {
        assert_eq!(bytes(80 << 30), "80Gi");
        assert_eq!(bytes(512), "512");
        assert_eq!(bytes(0), "0");
        // simulate's share of a 32 GiB card, as issue 39 found it printed.
        assert_eq!(bytes(8_074_538_516), "7.5Gi");
        assert_eq!(bytes(33_844_342_292), "31.5Gi");
        assert_eq!(bytes(1536), "1.5Ki");
        assert_eq!(bytes(-(3 << 20) - 1), "-3.0Mi");
    }
}
