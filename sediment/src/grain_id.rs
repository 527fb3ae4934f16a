//! `GrainId`: where a blob lives, in one `u64`.

use std::fmt;
use std::str::FromStr;

use crate::format::{BASINS, MAX_GRAINS_PER_BLOB, STRATUM_INDEX_BITS};

const COUNT_BITS: u32 = 5;
const INDEX_BITS: u32 = STRATUM_INDEX_BITS;
const STRATUM_BITS: u32 = 24;
const BASIN_BITS: u32 = 5;
const INDEX_SHIFT: u32 = COUNT_BITS;
const STRATUM_SHIFT: u32 = INDEX_SHIFT + INDEX_BITS;
const BASIN_SHIFT: u32 = STRATUM_SHIFT + STRATUM_BITS;
const USED_BITS: u32 = BASIN_SHIFT + BASIN_BITS;

/// The most strata one basin can have.
pub const MAX_STRATA: u32 = 1 << STRATUM_BITS;

/// The id of a stored blob: its basin (grain size class), stratum (file),
/// first grain index and grain count, packed into a `u64`, so that reading
/// it is one positioned read.
///
/// Bit layout, from the least significant bit: grain count − 1 (5 bits),
/// first grain index (18 bits), stratum (24 bits), basin (5 bits); the top
/// 12 bits are zero. Its text form is `basin-stratum-index-count`, e.g.
/// `3-0-17-20`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GrainId(u64);

/// Why a value is not a valid [`GrainId`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidGrainId(pub String);

impl fmt::Display for InvalidGrainId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidGrainId {}

impl GrainId {
    /// Builds an id from its parts; `None` if a part is out of range.
    #[must_use]
    pub fn new(basin: u8, stratum: u32, index: u32, count: u32) -> Option<Self> {
        if usize::from(basin) >= BASINS
            || stratum >= MAX_STRATA
            || index >= (1 << INDEX_BITS)
            || count == 0
            || count > MAX_GRAINS_PER_BLOB
        {
            return None;
        }
        Some(Self(
            u64::from(count - 1)
                | u64::from(index) << INDEX_SHIFT
                | u64::from(stratum) << STRATUM_SHIFT
                | u64::from(basin) << BASIN_SHIFT,
        ))
    }

    /// Interprets a raw `u64`, checking that every part is in range.
    pub fn from_u64(value: u64) -> Result<Self, InvalidGrainId> {
        let id = Self(value);
        if value >> USED_BITS != 0 || usize::from(id.basin()) >= BASINS {
            return Err(InvalidGrainId(format!(
                "{value:#x} is not a grain id: reserved bits or basin out of range"
            )));
        }
        Ok(id)
    }

    /// The raw `u64`.
    #[must_use]
    pub fn as_u64(self) -> u64 {
        self.0
    }

    /// The id as 8 little-endian bytes.
    #[must_use]
    pub fn to_bytes(self) -> [u8; 8] {
        self.0.to_le_bytes()
    }

    /// Reads an id written by [`GrainId::to_bytes`].
    pub fn from_bytes(bytes: [u8; 8]) -> Result<Self, InvalidGrainId> {
        Self::from_u64(u64::from_le_bytes(bytes))
    }

    /// The basin (grain-size class).
    #[must_use]
    pub fn basin(self) -> u8 {
        ((self.0 >> BASIN_SHIFT) & ((1 << BASIN_BITS) - 1)) as u8
    }

    /// The stratum (file) within the basin.
    #[must_use]
    pub fn stratum(self) -> u32 {
        ((self.0 >> STRATUM_SHIFT) & ((1 << STRATUM_BITS) - 1)) as u32
    }

    /// The index of the first grain within the stratum.
    #[must_use]
    pub fn index(self) -> u32 {
        ((self.0 >> INDEX_SHIFT) & ((1 << INDEX_BITS) - 1)) as u32
    }

    /// How many consecutive grains the blob occupies.
    #[must_use]
    pub fn count(self) -> u32 {
        (self.0 & ((1 << COUNT_BITS) - 1)) as u32 + 1
    }
}

impl fmt::Debug for GrainId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GrainId({self})")
    }
}

impl fmt::Display for GrainId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{}-{}-{}",
            self.basin(),
            self.stratum(),
            self.index(),
            self.count()
        )
    }
}

impl FromStr for GrainId {
    type Err = InvalidGrainId;

    /// Parses `basin-stratum-index-count`, or a raw `u64` in decimal or
    /// `0x` hexadecimal.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            InvalidGrainId(format!(
                "{s:?} is not a grain id (expected basin-stratum-index-count)"
            ))
        };
        let s = s.trim();
        if let Some(hex) = s.strip_prefix("0x") {
            return u64::from_str_radix(hex, 16)
                .map_err(|_| bad())
                .and_then(Self::from_u64);
        }
        let parts: Vec<&str> = s.split('-').collect();
        match parts.as_slice() {
            [raw] => raw
                .parse::<u64>()
                .map_err(|_| bad())
                .and_then(Self::from_u64),
            [basin, stratum, index, count] => {
                let basin = basin.parse::<u8>().map_err(|_| bad())?;
                let stratum = stratum.parse::<u32>().map_err(|_| bad())?;
                let index = index.parse::<u32>().map_err(|_| bad())?;
                let count = count.parse::<u32>().map_err(|_| bad())?;
                Self::new(basin, stratum, index, count).ok_or_else(|| {
                    InvalidGrainId(format!("{s:?} is not a grain id: a part is out of range"))
                })
            }
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip() {
        let id = GrainId::new(7, 123_456, 200_000, 32).unwrap();
        assert_eq!(
            (id.basin(), id.stratum(), id.index(), id.count()),
            (7, 123_456, 200_000, 32)
        );
        assert_eq!(id.to_string().parse::<GrainId>().unwrap(), id);
        assert_eq!(GrainId::from_bytes(id.to_bytes()).unwrap(), id);
        assert_eq!(GrainId::from_u64(id.as_u64()).unwrap(), id);
        assert_eq!(
            format!("{:#x}", id.as_u64()).parse::<GrainId>().unwrap(),
            id
        );
        assert_eq!(id.as_u64().to_string().parse::<GrainId>().unwrap(), id);
    }

    #[test]
    fn out_of_range_parts_are_rejected() {
        assert!(GrainId::new(BASINS as u8, 0, 0, 1).is_none());
        assert!(GrainId::new(0, MAX_STRATA, 0, 1).is_none());
        assert!(GrainId::new(0, 0, 1 << INDEX_BITS, 1).is_none());
        assert!(GrainId::new(0, 0, 0, 0).is_none());
        assert!(GrainId::new(0, 0, 0, MAX_GRAINS_PER_BLOB + 1).is_none());
        assert!(GrainId::from_u64(u64::MAX).is_err());
        assert!(GrainId::from_u64(1 << 60).is_err());
        for junk in [
            "",
            "x",
            "1-2-3",
            "1-2-3-0",
            "1-2-3-4-5",
            "99-0-0-1",
            "-1-0-0-1",
            "0xzz",
        ] {
            assert!(junk.parse::<GrainId>().is_err(), "{junk}");
        }
    }
}
