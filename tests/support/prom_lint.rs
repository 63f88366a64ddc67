//! A checker for Prometheus text exposition (format 0.0.4) that applies the
//! rules `promtool check metrics` applies, so the suite checks /metrics
//! where promtool cannot be had: valid metric and label names, label
//! syntax and escapes, one HELP and one TYPE per family, before its samples,
//! a family's samples together, no duplicate series, parseable values,
//! counters named `_total`, other types not, histograms with `le`
//! buckets ending at `+Inf`, cumulative, and `_sum` and `_count`.

use std::collections::{HashMap, HashSet};

fn valid_metric_name(n: &str) -> bool {
    let mut c = n.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

fn valid_label_name(n: &str) -> bool {
    let mut c = n.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && n.chars().all(|x| x.is_ascii_alphanumeric() || x == '_')
        && !n.starts_with("__")
}

fn valid_value(v: &str) -> bool {
    matches!(v, "+Inf" | "-Inf" | "NaN") || v.parse::<f64>().is_ok_and(f64::is_finite)
}

/// One sample line: name, labels in order, value.
type Sample = (String, Vec<(String, String)>, String);

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        let chars: Vec<char> = r.chars().collect();
        let mut i = 0;
        loop {
            match chars.get(i) {
                Some('}') => break,
                None => return Err("unterminated label set".into()),
                _ => {}
            }
            let eq = (i..chars.len()).find(|&j| chars[j] == '=').ok_or("label without =")?;
            let key: String = chars[i..eq].iter().collect();
            if !valid_label_name(&key) {
                return Err(format!("invalid label name {key:?}"));
            }
            if chars.get(eq + 1) != Some(&'"') {
                return Err(format!("label {key} value is not quoted"));
            }
            i = eq + 2;
            let mut value = String::new();
            loop {
                match chars.get(i) {
                    Some('\\') => {
                        match chars.get(i + 1) {
                            Some('\\') => value.push('\\'),
                            Some('"') => value.push('"'),
                            Some('n') => value.push('\n'),
                            other => return Err(format!("bad escape {other:?} in label {key}")),
                        }
                        i += 2;
                    }
                    Some('"') => break,
                    Some(c) => {
                        value.push(*c);
                        i += 1;
                    }
                    None => return Err(format!("unterminated value of label {key}")),
                }
            }
            labels.push((key, value));
            i += 1;
            match chars.get(i) {
                Some(',') => i += 1,
                Some('}') => {}
                _ => return Err("labels must be separated by commas".into()),
            }
        }
        let consumed: String = chars[..=i].iter().collect();
        rest = &r[consumed.len()..];
    }
    let mut parts = rest.split_whitespace();
    let value = parts.next().ok_or("no value")?.to_string();
    if let Some(ts) = parts.next() {
        ts.parse::<i64>().map_err(|_| format!("bad timestamp {ts:?}"))?;
    }
    if parts.next().is_some() {
        return Err("text after the timestamp".into());
    }
    Ok((name.to_string(), labels, value))
}

/// The family a sample belongs to, given the declared types.
fn family_of<'a>(name: &'a str, types: &HashMap<String, String>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if types.get(base).is_some_and(|t| t == "histogram" || t == "summary") {
                return base;
            }
        }
    }
    name
}

/// Every problem in `text`, one line each; empty when it passes.
pub fn lint(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut helps: HashSet<String> = HashSet::new();
    let mut types: HashMap<String, String> = HashMap::new();
    let mut finished: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    let mut series: HashSet<String> = HashSet::new();
    // Histogram buckets per (family, labels without le): (le, count) in order.
    let mut buckets: HashMap<(String, String), Vec<(f64, f64)>> = HashMap::new();
    let mut hist_parts: HashMap<(String, String), HashSet<&'static str>> = HashMap::new();
    let mut sampled: HashSet<String> = HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let at = |m: String| format!("line {}: {m}", n + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(c) = line.strip_prefix('#') {
            let mut w = c.trim_start().splitn(3, ' ');
            match (w.next(), w.next(), w.next()) {
                (Some("HELP"), Some(name), _) => {
                    if !valid_metric_name(name) {
                        problems.push(at(format!("invalid metric name {name:?}")));
                    }
                    if !helps.insert(name.to_string()) {
                        problems.push(at(format!("second HELP for {name}")));
                    }
                }
                (Some("TYPE"), Some(name), Some(kind)) => {
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                        problems.push(at(format!("unknown type {kind} for {name}")));
                    }
                    if types.insert(name.to_string(), kind.to_string()).is_some() {
                        problems.push(at(format!("second TYPE for {name}")));
                    }
                    if sampled.contains(name) {
                        problems.push(at(format!("TYPE of {name} after its samples")));
                    }
                    let base_counter = kind == "counter";
                    if base_counter && !name.ends_with("_total") {
                        problems.push(at(format!("counter {name} should end in _total")));
                    }
                    if !base_counter && name.ends_with("_total") {
                        problems.push(at(format!("non-counter {name} should not end in _total")));
                    }
                }
                (Some("TYPE"), ..) => problems.push(at("TYPE without name and type".into())),
                _ => {}
            }
            continue;
        }
        let (name, labels, value) = match parse_sample(line) {
            Ok(s) => s,
            Err(e) => {
                problems.push(at(e));
                continue;
            }
        };
        if !valid_metric_name(&name) {
            problems.push(at(format!("invalid metric name {name:?}")));
        }
        if !valid_value(&value) {
            problems.push(at(format!("bad value {value:?}")));
        }
        let mut keys: Vec<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
        keys.sort_unstable();
        if keys.windows(2).any(|w| w[0] == w[1]) {
            problems.push(at(format!("a label repeats in {line}")));
        }
        let family = family_of(&name, &types).to_string();
        sampled.insert(family.clone());
        if current.as_deref() != Some(family.as_str()) {
            if let Some(prev) = current.take() {
                finished.insert(prev);
            }
            if finished.contains(&family) {
                problems.push(at(format!("samples of {family} are not together")));
            }
            current = Some(family.clone());
        }
        let mut sorted = labels.clone();
        sorted.sort();
        if !series.insert(format!("{name}{sorted:?}")) {
            problems.push(at(format!("duplicate series {line}")));
        }
        if types.get(&family).map(String::as_str) == Some("histogram") {
            let rest: Vec<_> = sorted.iter().filter(|(k, _)| k != "le").cloned().collect();
            let key = (family.clone(), format!("{rest:?}"));
            let part = if name.ends_with("_bucket") {
                "bucket"
            } else if name.ends_with("_sum") {
                "sum"
            } else {
                "count"
            };
            hist_parts.entry(key.clone()).or_default().insert(part);
            if part == "bucket" {
                let Some((_, le)) = labels.iter().find(|(k, _)| k == "le") else {
                    problems.push(at(format!("bucket without le: {line}")));
                    continue;
                };
                let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::NAN) };
                buckets.entry(key).or_default().push((le, value.parse().unwrap_or(f64::NAN)));
            }
        }
    }
    for ((family, labels), b) in &buckets {
        if b.last().is_none_or(|(le, _)| *le != f64::INFINITY) {
            problems.push(format!("{family}{labels}: no +Inf bucket last"));
        }
        if b.windows(2).any(|w| w[1].0.partial_cmp(&w[0].0) != Some(std::cmp::Ordering::Greater) || w[0].1 > w[1].1) {
            problems.push(format!("{family}{labels}: buckets not increasing and cumulative"));
        }
    }
    for ((family, labels), parts) in &hist_parts {
        for p in ["bucket", "sum", "count"] {
            if !parts.contains(p) {
                problems.push(format!("{family}{labels}: no _{p}"));
            }
        }
    }
    for name in &sampled {
        if !types.contains_key(name) {
            problems.push(format!("{name} has samples but no TYPE"));
        }
        if !helps.contains(name) {
            problems.push(format!("{name} has samples but no HELP"));
        }
    }
    problems
}
