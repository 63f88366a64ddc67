//! Reads the captured engine frames in tests/fixtures/wire/ (written by
//! scripts/capture_wire_fixtures.sh) for the wire tests and benchmark.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// One message: its ZMQ frames.
pub type Message = Vec<Vec<u8>>;

/// One capture: live messages, replay replies and the JSON sidecar.
pub struct Fixture {
    pub name: String,
    pub live: Vec<Message>,
    pub replay: Vec<Message>,
    pub sidecar: serde_json::Value,
}

pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wire")
}

fn u32_at(bytes: &[u8], pos: &mut usize) -> usize {
    let v = u32::from_le_bytes(bytes[*pos..*pos + 4].try_into().unwrap());
    *pos += 4;
    v as usize
}

/// Parses the capture layout: b"KVWIRE01", u32 live, u32 replay, then each
/// message as u32 frame count and u32-length-prefixed frames (little endian).
pub fn parse_capture(bytes: &[u8]) -> (Vec<Message>, Vec<Message>) {
    assert_eq!(&bytes[..8], b"KVWIRE01", "not a wire capture");
    let mut pos = 8;
    let live = u32_at(bytes, &mut pos);
    let replay = u32_at(bytes, &mut pos);
    let mut messages = Vec::new();
    for _ in 0..live + replay {
        let frames = u32_at(bytes, &mut pos);
        let mut message = Vec::new();
        for _ in 0..frames {
            let len = u32_at(bytes, &mut pos);
            message.push(bytes[pos..pos + len].to_vec());
            pos += len;
        }
        messages.push(message);
    }
    assert_eq!(pos, bytes.len(), "bytes after the last message");
    let replay = messages.split_off(live);
    (messages, replay)
}

/// Every committed capture, sorted by name.
pub fn load_all() -> Vec<Fixture> {
    let mut names: Vec<String> = std::fs::read_dir(fixture_dir())
        .expect("tests/fixtures/wire exists")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".json").map(str::to_owned)
        })
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let dir = fixture_dir();
            let bytes = std::fs::read(dir.join(format!("{name}.bin"))).unwrap();
            let sidecar = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap();
            let (live, replay) = parse_capture(&bytes);
            Fixture { name, live, replay, sidecar: serde_json::from_str(&sidecar).unwrap() }
        })
        .collect()
}
