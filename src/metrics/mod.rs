//! A small Prometheus text writer. The HTTP layer's request metrics, the
//! daemon's state figures and the process figures all write through it at
//! scrape time. Names keep Dynamo's `dynamo_kvindexer_*` families; the rest
//! are `kv_indexer_*`.

pub mod process;

use std::fmt::Write;

/// A Prometheus text writer.
#[derive(Default)]
pub struct Prom {
    pub text: String,
}

impl Prom {
    /// Starts a metric family.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample. Label values are escaped.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"");
                for c in v.chars() {
                    match c {
                        '\\' => self.text.push_str("\\\\"),
                        '"' => self.text.push_str("\\\""),
                        '\n' => self.text.push_str("\\n"),
                        c => self.text.push(c),
                    }
                }
                self.text.push('"');
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    /// A family with one sample per value of its one label.
    pub fn labelled<S: AsRef<str>>(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        label: &str,
        samples: impl IntoIterator<Item = (S, f64)>,
    ) {
        self.family(name, kind, help);
        for (value, x) in samples {
            self.sample(name, &[(label, value.as_ref())], x);
        }
    }

    /// A family with a single unlabelled sample.
    pub fn single(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let mut p = Prom::default();
        p.sample("x", &[("model", "a\"b\\c")], 1.0);
        assert_eq!(p.text, "x{model=\"a\\\"b\\\\c\"} 1\n");
    }
}
