//! Card and phone numbers: digit groups scanned by hand, with the checks that
//! keep dates, times, IP addresses and decimals from being taken for them.

/// The byte just before `i` allows a number to start at `i`: not inside a word,
/// a reference (`#123`, `/123`) or the tail of another number (`1.5`, `2026-11`).
pub fn may_start(bytes: &[u8], i: usize) -> bool {
    let Some(&prev) = i.checked_sub(1).and_then(|p| bytes.get(p)) else {
        return true;
    };
    if prev.is_ascii_alphanumeric()
        || matches!(prev, b'#' | b'/' | b'_' | b'@' | b'+' | b'&' | b'=')
    {
        return false;
    }
    let before = i.checked_sub(2).and_then(|p| bytes.get(p));
    !(matches!(prev, b'.' | b',' | b'-' | b':') && before.is_some_and(u8::is_ascii_digit))
}

/// A phone number may not start on a digit group that only a space parts from
/// the digits before it: that group belongs to a longer number that was refused.
pub fn may_start_phone(bytes: &[u8], i: usize) -> bool {
    let spaced = i >= 2 && bytes[i - 1] == b' ' && bytes[i - 2].is_ascii_digit();
    may_start(bytes, i) && !(spaced && bytes[i].is_ascii_digit())
}

/// Where a card number starting at `i` ends: 13–19 digits, single spaces or
/// dashes between groups, Luhn-valid. The longest such run wins.
pub fn card_at(bytes: &[u8], i: usize) -> Option<usize> {
    let mut digits: Vec<u8> = Vec::with_capacity(19);
    // (digits so far, end) after each group.
    let mut ends: Vec<(usize, usize)> = Vec::new();
    let mut pos = i;
    loop {
        let start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            digits.push(bytes[pos] - b'0');
            pos += 1;
        }
        if pos == start {
            break;
        }
        ends.push((digits.len(), pos));
        let sep = bytes.get(pos).copied();
        let next = bytes.get(pos + 1).copied();
        if digits.len() >= 19
            || !matches!(sep, Some(b' ' | b'-'))
            || !next.is_some_and(|b| b.is_ascii_digit())
        {
            break;
        }
        pos += 1;
    }
    ends.into_iter().rev().find_map(|(count, end)| {
        ((13..=19).contains(&count) && luhn(&digits[..count]) && may_end(bytes, end)).then_some(end)
    })
}

/// The Luhn checksum every payment card number satisfies.
fn luhn(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(k, &d)| {
            let d = u32::from(d);
            // Every second digit from the right counts double, digit-summed.
            let doubled = d * 2;
            match k % 2 {
                1 if doubled > 9 => doubled - 9,
                1 => doubled,
                _ => d,
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// A number ends at `end` only if no word, address or decimal goes on there.
fn may_end(bytes: &[u8], end: usize) -> bool {
    match bytes.get(end) {
        None => true,
        Some(&b) => !(b.is_ascii_alphanumeric() || matches!(b, b'@' | b'_')),
    }
}

/// One run of digits of a phone number and the plain separator before it.
#[derive(Clone, Copy)]
struct Group {
    digits: usize,
    sep: Option<u8>,
    /// Just past the digits, or past the `)` of a parenthesised group.
    end: usize,
}

/// Where a phone number starting at `i` ends: an optional `+`, then 7–15 digits
/// in groups split by a space, dash or dot, one of which may be in parentheses.
pub fn phone_at(bytes: &[u8], i: usize) -> Option<usize> {
    let plus = bytes.get(i) == Some(&b'+');
    let mut pos = if plus { i + 1 } else { i };
    let mut groups: Vec<Group> = Vec::new();
    let mut had_paren = false;
    loop {
        let mut p = pos;
        let mut sep = None;
        if !groups.is_empty() && matches!(bytes.get(p), Some(b' ' | b'-' | b'.')) {
            sep = bytes.get(p).copied();
            p += 1;
        }
        let opens = !had_paren && bytes.get(p) == Some(&b'(');
        if opens {
            p += 1;
        }
        let first_digit = p;
        while p < bytes.len() && bytes[p].is_ascii_digit() {
            p += 1;
        }
        if p == first_digit {
            break;
        }
        if opens {
            // An area code in parentheses is closed right after its digits.
            if bytes.get(p) != Some(&b')') {
                break;
            }
            p += 1;
            had_paren = true;
        }
        groups.push(Group {
            digits: p - first_digit - usize::from(opens),
            sep,
            end: p,
        });
        pos = p;
    }
    // A trailing `10:30` is the time of day after a date, not part of a number.
    if let Some(last) = groups.last()
        && bytes.get(last.end) == Some(&b':')
        && bytes.get(last.end + 1).is_some_and(u8::is_ascii_digit)
    {
        groups.pop();
    }
    let end = groups.last()?.end;
    let digits: usize = groups.iter().map(|g| g.digits).sum();
    let plain = !plus && !had_paren;
    let ok = (7..=15).contains(&digits)
        && may_end(bytes, end)
        && !(plain && looks_like_other(bytes, &groups));
    ok.then_some(end)
}

/// Dates (`2026-11-22`, `22.11.2026`, `20261122`), IPv4 addresses and decimals
/// are digit groups too; a `+` or parentheses would have told them apart.
fn looks_like_other(bytes: &[u8], groups: &[Group]) -> bool {
    let sizes: Vec<usize> = groups.iter().map(|g| g.digits).collect();
    let seps: Vec<Option<u8>> = groups.iter().skip(1).map(|g| g.sep).collect();
    let date = match sizes.as_slice() {
        [a, b, c, ..] => {
            let same_sep = seps[0] == seps[1] && matches!(seps[0], Some(b'-' | b'.'));
            let short = |n: &usize| (1..=2).contains(n);
            same_sep && ((*a == 4 && short(b) && short(c)) || (short(a) && short(b) && *c == 4))
        }
        _ => false,
    };
    let dotted = seps.iter().all(|s| *s == Some(b'.'));
    let ip = sizes.len() == 4 && dotted && sizes.iter().all(|n| *n <= 3);
    let decimal = sizes.len() == 2 && dotted;
    let compact_date = match groups {
        [g] if g.digits == 8 => compact_date(&bytes[g.end - 8..g.end]),
        _ => false,
    };
    date || compact_date || ip || decimal
}

/// `YYYYMMDD` of this or the last century with a possible month and day.
fn compact_date(d: &[u8]) -> bool {
    let num =
        |r: std::ops::Range<usize>| d[r].iter().fold(0u32, |n, &b| n * 10 + u32::from(b - b'0'));
    (1900..2100).contains(&num(0..4))
        && (1..=12).contains(&num(4..6))
        && (1..=31).contains(&num(6..8))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(s: &str) -> Option<&str> {
        card_at(s.as_bytes(), 0).map(|end| &s[..end])
    }

    fn phone(s: &str) -> Option<&str> {
        phone_at(s.as_bytes(), 0).map(|end| &s[..end])
    }

    #[test]
    fn luhn_checksum() {
        let digits = |s: &str| s.bytes().map(|b| b - b'0').collect::<Vec<_>>();
        assert!(luhn(&digits("4111111111111111")));
        assert!(luhn(&digits("378282246310005")));
        assert!(!luhn(&digits("4111111111111112")));
    }

    #[test]
    fn cards() {
        assert_eq!(card("4111 1111 1111 1111 ok"), Some("4111 1111 1111 1111"));
        assert_eq!(card("4111-1111-1111-1111"), Some("4111-1111-1111-1111"));
        assert_eq!(card("3782 822463 10005."), Some("3782 822463 10005"));
        assert_eq!(card("4111111111111111 2"), Some("4111111111111111"));
        assert_eq!(card("4111111111111112"), None);
        assert_eq!(card("4111  1111 1111 1111"), None);
        assert_eq!(card("4111111111111111abc"), None);
        assert_eq!(card("123456789012"), None);
    }

    #[test]
    fn phones() {
        for p in [
            "+1 (555) 123-4567",
            "(555) 123-4567",
            "555.123.4567",
            "8 (800) 555-35-35",
            "+49 30 1234567",
            "+442079460958",
            "5551234",
            "612 345 678",
            "20123456",
        ] {
            assert_eq!(phone(p), Some(p), "{p}");
        }
        assert_eq!(phone("5551234 10:30"), Some("5551234"));
        assert_eq!(phone("555-1234, thanks"), Some("555-1234"));
        assert_eq!(phone("555-123, thanks"), None);
        assert_eq!(phone("555-123-4567, thanks"), Some("555-123-4567"));
        assert_eq!(phone("+1 555 123 4567 2 times"), Some("+1 555 123 4567 2"));
    }

    #[test]
    fn not_phones() {
        for s in [
            "2026-11-22",
            "2026-11-22 10:30",
            "22.11.2026",
            "22.11.2026 10:30",
            "192.168.100.200",
            "3.14159265",
            "123456",
            "1234567890123456",
            "(555 123-4567",
            "5551234567x",
            "5551234567@mail.com",
            "20261122",
        ] {
            assert_eq!(phone(s), None, "{s}");
        }
    }

    #[test]
    fn starts() {
        let b = b"a1 #1 /1 x-1 2-1 (1 ,1";
        let at = |needle: &str| {
            let i = b
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap();
            may_start(b, i + needle.len() - 1)
        };
        assert!(!at("a1"));
        assert!(!at("#1"));
        assert!(!at("/1"));
        assert!(at("x-1"));
        assert!(!at("2-1"));
        assert!(at("(1"));
        assert!(at(",1"));
        assert!(may_start(b, 0));
        assert!(may_start_phone(b"12 +7", 3));
        assert!(!may_start_phone(b"12 34", 3));
        assert!(may_start_phone(b"ab 34", 3));
    }
}
