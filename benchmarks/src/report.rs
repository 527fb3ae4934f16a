//! Result tables: printed as markdown, saved as CSV.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

/// One table of results with the notes printed under it.
#[derive(Debug, Clone, Default)]
pub struct Table {
    /// Column headers.
    pub columns: Vec<String>,
    /// Which columns hold numbers (right-aligned in markdown).
    pub numeric: Vec<bool>,
    /// Cells, row by row.
    pub rows: Vec<Vec<String>>,
    /// Lines printed under the table (skipped systems, scaled counts…).
    pub notes: Vec<String>,
}

impl Table {
    /// A table with these columns; names ending in `#` are numeric (the
    /// `#` is not printed).
    #[must_use]
    pub fn new(columns: &[&str]) -> Self {
        Self {
            columns: columns
                .iter()
                .map(|c| c.trim_end_matches('#').to_string())
                .collect(),
            numeric: columns.iter().map(|c| c.ends_with('#')).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Appends a row (missing cells are left empty).
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.columns.len(), String::new());
        self.rows.push(cells);
    }

    /// Adds a note line.
    pub fn note(&mut self, note: impl Into<String>) {
        let note = note.into();
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    /// The table as GitHub markdown, notes as a list below it.
    #[must_use]
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "| {} |", self.columns.join(" | "));
        let aligns: Vec<&str> = self
            .numeric
            .iter()
            .map(|&n| if n { "---:" } else { "---" })
            .collect();
        let _ = writeln!(out, "| {} |", aligns.join(" | "));
        for row in &self.rows {
            let cells: Vec<String> = row.iter().map(|c| c.replace('|', "\\|")).collect();
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for note in &self.notes {
                let _ = writeln!(out, "- {note}");
            }
        }
        out
    }

    /// The table as CSV (RFC 4180 quoting); notes are left out.
    #[must_use]
    pub fn to_csv(&self) -> String {
        let mut out = String::new();
        let line = |cells: &[String]| -> String {
            cells
                .iter()
                .map(|c| csv_field(c))
                .collect::<Vec<_>>()
                .join(",")
                + "\n"
        };
        out.push_str(&line(&self.columns));
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }

    /// Writes [`Table::to_csv`] to `path`.
    pub fn write_csv(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.to_csv())
    }
}

fn csv_field(field: &str) -> String {
    if field.contains([',', '"', '\n']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_string()
    }
}

/// `256 B`, `4 KiB`, `1 MiB`.
#[must_use]
pub fn human_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / f64::from(1 << 30)),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / f64::from(1 << 20)),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// A duration in microseconds, no decimals.
#[must_use]
pub fn micros(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e6)
}

/// A rate with no decimals and thousands separators: `39,012`.
#[must_use]
pub fn rate(value: f64) -> String {
    let rounded = value.round().max(0.0) as u64;
    let digits = rounded.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes in MiB with one decimal.
#[must_use]
pub fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / f64::from(1 << 20))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_and_csv() {
        let mut table = Table::new(&["system", "ops/s#"]);
        table.row(vec!["a|b".into(), "1,000".into()]);
        table.row(vec!["c".into()]);
        table.note("skipped: x");
        let md = table.to_markdown();
        assert!(md.contains("| system | ops/s |"));
        assert!(md.contains("| --- | ---: |"));
        assert!(md.contains("| a\\|b | 1,000 |"));
        assert!(md.contains("| c |  |"));
        assert!(md.contains("- skipped: x"));
        assert_eq!(table.to_csv(), "system,ops/s\na|b,\"1,000\"\nc,\n");
    }

    #[test]
    fn formatting() {
        assert_eq!(rate(39_012.4), "39,012");
        assert_eq!(rate(999.0), "999");
        assert_eq!(rate(1_000_000.0), "1,000,000");
        assert_eq!(human_size(256), "256 B");
        assert_eq!(human_size(4096), "4 KiB");
        assert_eq!(human_size(1 << 20), "1 MiB");
        assert_eq!(human_size(4 << 30), "4 GiB");
        assert_eq!(human_size(20_000 << 10), "19.5 MiB");
    }
}
