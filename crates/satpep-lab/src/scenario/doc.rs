//! A report written once and rendered twice: Markdown (report.md, the terminal) and one
//! self-contained HTML page (report.html, plots inlined). Its tables are kept as well, for
//! tables.json and one CSV file each.

use super::report::Table;
use serde::Serialize;
use std::fmt::Write as _;

/// The report being written.
pub struct Doc {
    md: String,
    html: String,
    section: String,
    tables: Vec<DocTable>,
}

/// A table as the report shows it, with where it stands.
#[derive(Debug, Clone, Serialize)]
pub struct DocTable {
    /// The level-2 heading it stands under (a part), empty before the first.
    pub section: String,
    /// Its own heading.
    pub title: String,
    /// The table.
    #[serde(flatten)]
    pub table: Table,
}

/// `s` with HTML's special characters escaped.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

impl Doc {
    /// A report titled `title`.
    pub fn new(title: &str) -> Doc {
        let html = format!(
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title><style>\
             body{{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}}\
             table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #bbb;padding:3px 8px;text-align:right}}\
             th{{background:#eee}}td.l{{text-align:left}}svg{{max-width:100%;height:auto}}</style></head><body>\n<h1>{t}</h1>\n",
            t = esc(title)
        );
        Doc {
            md: format!("# {title}\n\n"),
            html,
            section: String::new(),
            tables: Vec::new(),
        }
    }

    /// A heading of `level` (2 or more; the title is 1).
    pub fn heading(&mut self, level: usize, text: &str) {
        if level == 2 {
            self.section = text.to_string();
        }
        let _ = writeln!(self.md, "{} {text}\n", "#".repeat(level));
        let _ = writeln!(self.html, "<h{level}>{}</h{level}>", esc(text));
    }

    /// A paragraph.
    pub fn para(&mut self, text: &str) {
        let _ = writeln!(self.md, "{}\n", text.trim());
        let _ = writeln!(self.html, "<p>{}</p>", esc(text.trim()));
    }

    /// A table under a heading of `level`.
    pub fn table(&mut self, level: usize, title: &str, t: &Table) {
        let _ = writeln!(self.md, "{} {title}\n\n{}", "#".repeat(level), t.markdown());
        let _ = writeln!(
            self.html,
            "<h{level}>{}</h{level}>\n{}",
            esc(title),
            t.html()
        );
        self.tables.push(DocTable {
            section: self.section.clone(),
            title: title.to_string(),
            table: t.clone(),
        });
    }

    /// The tables so far, in order.
    pub fn tables(&self) -> &[DocTable] {
        &self.tables
    }

    /// A plot: linked image in Markdown, the SVG `svg` inlined in HTML under its caption.
    pub fn figure(&mut self, file: &str, caption: &str, svg: &str) {
        let _ = writeln!(self.md, "![{caption}]({file})\n");
        let _ = writeln!(self.html, "<h3>{}</h3>\n{svg}", esc(caption));
    }

    /// Plots one may open: a list of links in Markdown, folded sections in HTML.
    pub fn folded(&mut self, items: &[(String, String, String)]) {
        for (file, caption, svg) in items {
            let _ = writeln!(self.md, "- [{caption}]({file})");
            let _ = writeln!(
                self.html,
                "<details><summary>{}</summary>\n{svg}</details>",
                esc(caption)
            );
        }
        self.md.push('\n');
    }

    /// A bulleted list.
    pub fn list(&mut self, items: &[String]) {
        for i in items {
            let _ = writeln!(self.md, "- {i}");
        }
        self.md.push('\n');
        let _ = writeln!(
            self.html,
            "<ul>{}</ul>",
            items
                .iter()
                .map(|i| format!("<li>{}</li>", esc(i)))
                .collect::<String>()
        );
    }

    /// The Markdown and the HTML.
    pub fn finish(mut self) -> (String, String) {
        self.html.push_str("</body></html>\n");
        (self.md, self.html)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_element_goes_to_both_renderings_once() {
        let mut d = Doc::new("T <1>");
        d.heading(2, "part a");
        d.para("x & y");
        d.table(
            3,
            "tab",
            &Table {
                header: vec!["k".into(), "v".into()],
                label_cols: 1,
                rows: vec![vec!["a".into(), "1".into()]],
            },
        );
        d.list(&["one".into()]);
        assert_eq!(d.tables().len(), 1);
        assert_eq!(
            (d.tables()[0].section.as_str(), d.tables()[0].title.as_str()),
            ("part a", "tab")
        );
        let (md, html) = d.finish();
        assert!(md.starts_with("# T <1>\n"), "{md}");
        assert!(
            md.contains("## part a\n") && md.contains("### tab\n\n| k | v |"),
            "{md}"
        );
        assert!(md.contains("x & y") && md.contains("- one"), "{md}");
        assert!(html.contains("<h1>T &lt;1&gt;</h1>") && html.contains("<h2>part a</h2>"));
        assert!(html.contains("<p>x &amp; y</p>") && html.contains("<td class=\"l\">a</td>"));
        assert!(html.ends_with("</body></html>\n"));
    }
}
