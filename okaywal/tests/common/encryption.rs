//! Running a test on a plain and on an encrypted log: [`Encryption::BOTH`]
//! to loop over, [`Encryption::configure`] to apply to a configuration.

use okaywal::encryption::{Key, KeyId, StaticKey};
use okaywal::Configuration;

/// Whether a test's log is encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encryption {
    Off,
    On,
}

impl Encryption {
    /// Both, plain first.
    pub const BOTH: [Encryption; 2] = [Encryption::Off, Encryption::On];

    /// `config`, with the test key when encrypted.
    pub fn configure(self, config: Configuration) -> Configuration {
        match self {
            Encryption::Off => config,
            Encryption::On => config.encryption(test_key()),
        }
    }

    /// Whether the log is encrypted.
    pub fn on(self) -> bool {
        self == Encryption::On
    }
}

/// The key encrypted test logs use: id 1.
pub fn test_key() -> StaticKey {
    StaticKey::with_id(
        KeyId::new(1),
        Key::from_bytes(*b"okaywal test key, never a secret"),
    )
}
