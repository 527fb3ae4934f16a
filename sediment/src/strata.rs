//! Every stratum of the store, by basin: finding the one that holds a
//! grain, reserving grains for a new blob (adding a stratum when none has
//! room) and giving reserved grains back. One stratum file is `stratum`'s.
//!
//! Strata are only ever added, at the end of their basin, and never
//! removed while the store is open.

use std::path::PathBuf;
use std::sync::Arc;

use okaywal::fs::FileSystem;
use parking_lot::{Mutex, RwLock};

use crate::error::{Error, Result};
use crate::format::{stratum_capacity, Layout};
use crate::grain_id::GrainId;
use crate::sealing::Sealer;
use crate::stratum::Stratum;

/// The strata of one basin (one grain size).
#[derive(Debug, Default)]
struct Basin {
    strata: RwLock<Vec<Arc<Stratum>>>,
    /// Held while a stratum is added, so two threads never add one each.
    grow: Mutex<()>,
}

/// The strata of every basin.
#[derive(Debug)]
pub(crate) struct Strata {
    directory: PathBuf,
    fs: Arc<dyn FileSystem>,
    max_blob_bytes: u64,
    basins: Vec<Basin>,
    /// The store's sealing context, if it is encrypted.
    sealer: Option<Arc<Sealer>>,
}

impl Strata {
    /// The strata found at open, per basin in order; new strata are created
    /// in `directory` on `fs` (sealed if `sealer` is given), for blobs of at
    /// most `max_blob_bytes`.
    pub fn new(
        directory: PathBuf,
        fs: Arc<dyn FileSystem>,
        max_blob_bytes: u64,
        basins: Vec<Vec<Arc<Stratum>>>,
        sealer: Option<Arc<Sealer>>,
    ) -> Self {
        let basins = basins
            .into_iter()
            .map(|strata| Basin {
                strata: RwLock::new(strata),
                grow: Mutex::new(()),
            })
            .collect();
        Self {
            directory,
            fs,
            max_blob_bytes,
            basins,
            sealer,
        }
    }

    /// How blobs are laid out in this store's grains.
    pub fn layout(&self) -> Layout {
        if self.sealer.is_some() {
            Layout::Sealed
        } else {
            Layout::Plain
        }
    }

    /// The store's sealing context, if it is encrypted.
    pub fn sealer(&self) -> Option<&Arc<Sealer>> {
        self.sealer.as_ref()
    }

    /// The directory holding the stratum files.
    pub fn directory(&self) -> &std::path::Path {
        &self.directory
    }

    /// The largest blob the store accepts.
    pub fn max_blob_bytes(&self) -> u64 {
        self.max_blob_bytes
    }

    /// The stratum holding `id`; `Ok(None)` if that stratum does not exist,
    /// an error if the id cannot name a blob at all.
    pub fn stratum_of(&self, id: GrainId) -> Result<Option<Arc<Stratum>>> {
        let capacity = stratum_capacity(id.basin());
        if u64::from(id.index()) + u64::from(id.count()) > u64::from(capacity) {
            return Err(Error::InvalidGrainId(format!(
                "{id}: grains {}..{} are past the end of a stratum of {capacity} grains",
                id.index(),
                u64::from(id.index()) + u64::from(id.count())
            )));
        }
        Ok(self.stratum(usize::from(id.basin()), id.stratum()))
    }

    /// Stratum `number` of `basin`, if it exists.
    pub fn stratum(&self, basin: usize, number: u32) -> Option<Arc<Stratum>> {
        self.basins
            .get(basin)?
            .strata
            .read()
            .get(number as usize)
            .cloned()
    }

    /// The strata of `basin` now, in order.
    pub fn of_basin(&self, basin: usize) -> Vec<Arc<Stratum>> {
        self.basins
            .get(basin)
            .map(|b| b.strata.read().clone())
            .unwrap_or_default()
    }

    /// How many strata each basin has now, in basin order.
    pub fn counts(&self) -> impl Iterator<Item = usize> + '_ {
        self.basins.iter().map(|basin| basin.strata.read().len())
    }

    /// Reserves grains for a blob of `len` bytes; `None` if no stratum
    /// has room and `may_grow` is false (otherwise a stratum is added).
    pub fn allocate(&self, len: u64, may_grow: bool) -> Result<Option<(GrainId, Arc<Stratum>)>> {
        if len > self.max_blob_bytes {
            return Err(Error::TooLarge {
                length: len,
                maximum: self.max_blob_bytes,
            });
        }
        let (basin_number, count) = self.layout().placement(len).ok_or(Error::TooLarge {
            length: len,
            maximum: self.max_blob_bytes,
        })?;
        let basin = &self.basins[usize::from(basin_number)];
        let found = |strata: &[Arc<Stratum>]| {
            strata.iter().find_map(|stratum| {
                let index = stratum.reserve(count)?;
                Some((stratum.clone(), index))
            })
        };
        let reserved = found(&basin.strata.read());
        let (stratum, index) = match reserved {
            Some(found) => found,
            None if !may_grow => return Ok(None),
            None => {
                let _grow = basin.grow.lock();
                // Another thread may have added a stratum meanwhile.
                let existing = basin.strata.read().clone();
                match found(&existing) {
                    Some(found) => found,
                    None => {
                        let number = existing.len() as u32;
                        let stratum = Arc::new(Stratum::create(
                            &*self.fs,
                            &self.directory,
                            basin_number,
                            number,
                            self.sealer.as_ref(),
                        )?);
                        let index = stratum
                            .reserve(count)
                            .expect("a new stratum has room for any blob");
                        basin.strata.write().push(stratum.clone());
                        (stratum, index)
                    }
                }
            }
        };
        let id = GrainId::new(basin_number, stratum.number(), index, count)
            .ok_or_else(|| Error::InvalidGrainId("stratum numbers exhausted".into()))?;
        Ok(Some((id, stratum)))
    }

    /// Makes reserved (never committed) grains available again.
    pub fn release(&self, id: GrainId) {
        if let Ok(Some(stratum)) = self.stratum_of(id) {
            stratum.release(id.index(), id.count());
        }
    }

    /// True if `id` names exactly a committed blob.
    pub fn is_live(&self, id: GrainId) -> Result<bool> {
        Ok(match self.stratum_of(id)? {
            Some(stratum) => stratum.is_live_blob(id.index(), id.count()),
            None => false,
        })
    }
}
