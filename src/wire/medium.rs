//! Engine `medium` strings to storage tiers.
//!
//! Engines and connectors spell tiers differently (vLLM `GPU`/`CPU`/`FS`/
//! `OBJ`/`STORAGE`, SGLang `CPU_PINNED`/`DISK`/`EXTERNAL`, Mooncake's
//! connector lower-case `cpu`), so names compare case-insensitively. An
//! unknown name maps to nothing: the caller skips the event rather than file
//! blocks under a guessed tier.

use crate::event::StorageTier;

const DEVICE: &[&str] = &["GPU", "DEVICE"];
const HOST_PINNED: &[&str] = &["CPU", "CPU_PINNED", "CPU_TIER1"];
const DISK: &[&str] = &["CPU_TIER2", "DISK", "NVME", "STORAGE", "FS", "OBJ"];
const EXTERNAL: &[&str] = &["EXTERNAL", "NETWORK", "REMOTE", "SHARED"];

/// The tier for an event's `medium`; absent (or empty) means device.
pub fn tier_for_medium(medium: Option<&str>) -> Option<StorageTier> {
    let Some(medium) = medium.filter(|m| !m.is_empty()) else {
        return Some(StorageTier::Device);
    };
    let is = |names: &[&str]| names.iter().any(|n| n.eq_ignore_ascii_case(medium));
    if is(DEVICE) {
        Some(StorageTier::Device)
    } else if is(HOST_PINNED) {
        Some(StorageTier::HostPinned)
    } else if is(DISK) {
        Some(StorageTier::Disk)
    } else if is(EXTERNAL) {
        Some(StorageTier::External)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_name_maps() {
        use StorageTier::*;
        let cases = [
            (None, Device),
            (Some(""), Device),
            (Some("GPU"), Device),
            (Some("device"), Device),
            (Some("CPU"), HostPinned),
            (Some("cpu"), HostPinned),
            (Some("CPU_PINNED"), HostPinned),
            (Some("CPU_TIER1"), HostPinned),
            (Some("CPU_TIER2"), Disk),
            (Some("Disk"), Disk),
            (Some("NVME"), Disk),
            (Some("STORAGE"), Disk),
            (Some("FS"), Disk),
            (Some("obj"), Disk),
            (Some("EXTERNAL"), External),
            (Some("NETWORK"), External),
            (Some("REMOTE"), External),
            (Some("shared"), External),
        ];
        for (medium, tier) in cases {
            assert_eq!(tier_for_medium(medium), Some(tier), "{medium:?}");
        }
    }

    #[test]
    fn unknown_names_map_to_nothing() {
        for medium in ["TAPE", "GPU0", " gpu", "CPU-PINNED"] {
            assert_eq!(tier_for_medium(Some(medium)), None, "{medium}");
        }
    }
}
