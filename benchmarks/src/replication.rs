//! The arithmetic and encodings of the replication section (`--only
//! raft`), kept apart from its processes and HTTP client so that they are
//! compiled and tested without the `raft` feature.

/// Standard base64 (RFC 4648, with padding), as etcd's JSON gateway takes
/// byte strings.
#[must_use]
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let sextets = [n >> 18, n >> 12, n >> 6, n];
        for (i, sextet) in sextets.iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(sextet & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The body of etcd's `POST /v3/kv/put` (the gateway's JSON form of
/// `PutRequest`): key and value base64-encoded. Base64 needs no JSON
/// escaping, so the body is built as text.
#[must_use]
pub fn etcd_put_body(key: &[u8], value: &[u8]) -> String {
    format!(
        "{{\"key\":\"{}\",\"value\":\"{}\"}}",
        base64(key),
        base64(value)
    )
}

/// The median of `values` (the mean of the middle two for an even count);
/// `None` when there are none. NaNs sort last.
#[must_use]
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    Some(if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    })
}

/// `numerator ÷ denominator`, when both are known and the denominator is
/// positive.
#[must_use]
pub fn ratio(numerator: Option<f64>, denominator: Option<f64>) -> Option<f64> {
    match (numerator, denominator) {
        (Some(n), Some(d)) if d > 0.0 && n.is_finite() && d.is_finite() => Some(n / d),
        _ => None,
    }
}

/// The system calls the sync count is made of.
pub const SYNC_CALLS: [&str; 3] = ["fsync", "fdatasync", "sync_file_range"];

/// The calls of [`SYNC_CALLS`] in the summary that `strace -c` writes
/// (its `total` row left out). strace writes nothing when no traced call
/// was made: empty text counts 0. `None` when the text is something else
/// (no header line).
#[must_use]
pub fn strace_sync_calls(summary: &str) -> Option<u64> {
    if summary.trim().is_empty() {
        return Some(0);
    }
    let mut header = false;
    let mut calls = 0;
    for line in summary.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.first() == Some(&"%") && fields.contains(&"calls") {
            header = true;
            continue;
        }
        // `% time  seconds  usecs/call  calls  [errors]  syscall`: the
        // errors column is blank when there were none, so the count is
        // always the fourth field and the name the last.
        let (Some(name), Some(count)) = (fields.last(), fields.get(3)) else {
            continue;
        };
        if fields.len() >= 5 && SYNC_CALLS.contains(name) {
            if let Ok(count) = count.parse::<u64>() {
                calls += count;
            }
        }
    }
    header.then_some(calls)
}

/// Syncs per acknowledged write per node: `syncs ÷ writes ÷ nodes`.
#[must_use]
pub fn syncs_per_write_per_node(syncs: u64, writes: u64, nodes: usize) -> Option<f64> {
    (writes > 0 && nodes > 0).then(|| syncs as f64 / writes as f64 / nodes as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648() {
        // The test vectors of RFC 4648, section 10.
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain:?}");
        }
        assert_eq!(base64(&[0xff, 0xfe, 0xfd, 0x00]), "//79AA==");
        assert_eq!(base64(&[0xfb, 0xff]), "+/8=");
        assert_eq!(base64(&[0; 4096]).len(), 5464);
    }

    #[test]
    fn etcd_put_body_is_the_gateway_json() {
        assert_eq!(
            etcd_put_body(b"foo", b"bar"),
            r#"{"key":"Zm9v","value":"YmFy"}"#
        );
        assert_eq!(
            etcd_put_body(b"k", &[0xff, 0x00]),
            r#"{"key":"aw==","value":"/wA="}"#
        );
    }

    #[test]
    fn medians_and_ratios() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[5.0]), Some(5.0));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[10.0, 1.0, 1000.0, 2.0, 3.0, 4.0]), Some(3.5));
        assert_eq!(ratio(Some(3.0), Some(2.0)), Some(1.5));
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(2.0)), None);
        assert_eq!(ratio(Some(3.0), None), None);
        assert_eq!(syncs_per_write_per_node(600, 100, 3), Some(2.0));
        assert_eq!(syncs_per_write_per_node(5, 0, 3), None);
    }

    #[test]
    fn strace_summaries_are_read() {
        let summary = "\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 98.51    1.234567         617      2001           fdatasync
  1.49    0.018700         935        20         2 fsync
------ ----------- ----------- --------- --------- ----------------
100.00    1.253267         622      2021         2 total
";
        assert_eq!(strace_sync_calls(summary), Some(2021));
        let empty = "\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
------ ----------- ----------- --------- --------- ----------------
100.00    0.000000           0         0           total
";
        assert_eq!(strace_sync_calls(empty), Some(0));
        assert_eq!(strace_sync_calls(""), Some(0));
        assert_eq!(
            strace_sync_calls("strace: attach: ptrace(PTRACE_SEIZE, 1): Operation not permitted"),
            None
        );
    }
}
