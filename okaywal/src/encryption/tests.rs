//! Sealing and opening with the right and the wrong key and place, a
//! new nonce per seal (one epoch per cipher, a count within it, seals of
//! another cipher's epoch opened too), key rotation, key files, seals as bytes, and the
//! errors of missing or wrong keys.

use super::*;

#[test]
fn sealed_bytes_open_only_with_the_same_key_and_place() {
    let cipher = Cipher::new(StaticKey::new([1; 32]));
    let mut bytes = b"hello hello hello".to_vec();
    let seal = cipher.seal(b"here", &mut bytes).unwrap();
    assert_ne!(&bytes[..], b"hello hello hello");
    let sealed = bytes.clone();

    let mut moved = sealed.clone();
    assert!(matches!(
        cipher.open(&seal, b"there", &mut moved),
        Err(OpenError::Damaged)
    ));
    let mut flipped = sealed.clone();
    flipped[3] ^= 1;
    assert!(matches!(
        cipher.open(&seal, b"here", &mut flipped),
        Err(OpenError::Damaged)
    ));
    let other = Cipher::new(StaticKey::new([2; 32]));
    let mut wrong = sealed.clone();
    assert!(matches!(
        other.open(&seal, b"here", &mut wrong),
        Err(OpenError::Damaged)
    ));

    cipher.open(&seal, b"here", &mut bytes).unwrap();
    assert_eq!(&bytes[..], b"hello hello hello");
}

#[test]
fn every_seal_has_a_new_nonce() {
    let cipher = Cipher::new(StaticKey::new([1; 32]));
    let mut seen = std::collections::HashSet::new();
    for _ in 0..10_000 {
        let mut bytes = [0_u8; 16];
        let seal = cipher.seal(b"same place", &mut bytes).unwrap();
        assert!(seen.insert(seal.nonce));
    }
}

#[test]
fn nonces_count_within_a_cipher_and_ciphers_have_their_own_epochs() {
    let first = Cipher::new(StaticKey::new([1; 32]));
    let clone = first.clone();
    let second = Cipher::new(StaticKey::new([1; 32]));
    let seal = |cipher: &Cipher| cipher.seal(b"place", &mut [0_u8; 4]).unwrap().nonce;
    let (a, b, c, d) = (seal(&first), seal(&clone), seal(&first), seal(&second));
    // One epoch for a cipher and its clones, and a count that steps by one
    // whichever clone seals.
    assert_eq!(a[..16], b[..16]);
    assert_eq!(a[..16], c[..16]);
    let count = |nonce: [u8; NONCE_BYTES]| u64::from_le_bytes(nonce[16..].try_into().unwrap());
    assert_eq!((count(a), count(b), count(c)), (0, 1, 2));
    // Another cipher over the same key: another epoch, so the same count
    // is another nonce.
    assert_ne!(a[..16], d[..16]);
    assert_eq!(count(d), 0);
}

#[test]
fn a_cipher_opens_what_another_cipher_sealed_with_the_same_key() {
    // What a new process does with files an earlier one wrote.
    let writer = Cipher::new(StaticKey::new([3; 32]));
    let reader = Cipher::new(StaticKey::new([3; 32]));
    let mut sealed = Vec::new();
    for n in 0..3_u8 {
        let mut bytes = vec![n; 100];
        let seal = writer.seal(&[n], &mut bytes).unwrap();
        sealed.push((seal, bytes));
    }
    // The reader seals too, so it has an epoch key of its own besides the
    // writer's it derives.
    reader.seal(b"own", &mut [0_u8; 8]).unwrap();
    let key = reader.current_key().unwrap();
    for (n, (seal, mut bytes)) in sealed.into_iter().enumerate() {
        key.open(&seal, &[n as u8], &mut bytes).unwrap();
        assert_eq!(bytes, vec![n as u8; 100]);
    }
}

#[test]
fn a_provider_that_changes_a_keys_bytes_is_not_served_an_old_derived_key() {
    let ring = Arc::new(Keyring::new(KeyId::new(1), Key::from_bytes([1; 32])));
    let cipher = Cipher::shared(ring.clone());
    let mut bytes = *b"sealed under the first bytes";
    let seal = cipher.seal(b"p", &mut bytes).unwrap();
    let mut copy = bytes;
    cipher.open(&seal, b"p", &mut copy).unwrap();
    // The same id now names other bytes: the epoch key derived from the
    // old ones must not open (nor seal) anything for it.
    ring.rotate(KeyId::new(1), Key::from_bytes([2; 32]));
    let mut copy = bytes;
    assert!(matches!(
        cipher.open(&seal, b"p", &mut copy),
        Err(OpenError::Damaged)
    ));
}

#[test]
fn key_checks_tell_wrong_and_missing_keys_apart() {
    let ring = Arc::new(Keyring::new(KeyId::new(4), Key::from_bytes([4; 32])));
    let check = Cipher::new(ring.clone()).key_check(b"segment").unwrap();
    assert_eq!(check.key_id, KeyId::new(4));
    Cipher::new(ring.clone())
        .verify_key_check(&check, b"segment", "wal-1")
        .unwrap();

    let wrong = Cipher::new(StaticKey::with_id(KeyId::new(4), Key::from_bytes([5; 32])));
    let error = wrong
        .verify_key_check(&check, b"segment", "wal-1")
        .unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
    assert_eq!(KeyError::of(&error), Some(&KeyError::Wrong(KeyId::new(4))));
    assert!(error.to_string().contains("wal-1"), "{error}");
    assert!(error.to_string().contains("key id 4"), "{error}");

    let missing = Cipher::new(StaticKey::new([4; 32]));
    let error = missing
        .verify_key_check(&check, b"segment", "wal-1")
        .unwrap_err();
    assert_eq!(
        KeyError::of(&error),
        Some(&KeyError::Missing(KeyId::new(4)))
    );
}

#[test]
fn rotation_keeps_old_keys_readable_until_retired() {
    let ring = Arc::new(Keyring::new(KeyId::new(1), Key::from_bytes([1; 32])));
    let cipher = Cipher::new(ring.clone());
    let mut old = b"old".to_vec();
    let old_seal = cipher.seal(b"", &mut old).unwrap();
    ring.rotate(KeyId::new(2), Key::from_bytes([2; 32]));
    let mut new = b"new".to_vec();
    let new_seal = cipher.seal(b"", &mut new).unwrap();
    assert_eq!((old_seal.key_id.get(), new_seal.key_id.get()), (1, 2));
    let mut copy = old.clone();
    cipher.open(&old_seal, b"", &mut copy).unwrap();
    assert_eq!(copy, b"old");
    assert!(!ring.retire(KeyId::new(2)), "the current key stays");
    assert!(ring.retire(KeyId::new(1)));
    assert!(matches!(
        cipher.open(&old_seal, b"", &mut old),
        Err(OpenError::Key(KeyError::Missing(id))) if id == KeyId::new(1)
    ));
}

#[test]
fn key_files_hold_raw_or_hex_keys_and_errors_hide_them() {
    let raw = Key::parse(&[0xab; 32]).unwrap();
    let hex = Key::parse(format!("{}\n", "ab".repeat(32)).as_bytes()).unwrap();
    assert_eq!(raw.secret(), hex.secret());
    let error = Key::parse(b"0123456789secret").unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    assert!(!error.to_string().contains("secret"));
    assert_eq!(format!("{raw:?}"), "Key(redacted)");
    let ring = Keyring::new(KeyId::new(1), raw);
    assert!(!format!("{ring:?}").contains("171"), "{ring:?}");
    assert!(Key::parse(&"zz".repeat(32).into_bytes()).is_err());
}

#[test]
fn seals_round_trip_through_bytes() {
    let cipher = Cipher::new(StaticKey::with_id(KeyId::new(77), Key::from_bytes([3; 32])));
    let seal = cipher.seal(b"", &mut [1, 2, 3]).unwrap();
    assert_eq!(Seal::from_bytes(&seal.to_bytes()), seal);
}
