//! Finds e-mail addresses by growing outwards from each `@`, which is cheaper
//! than trying every position and needs no regex engine.

use std::ops::Range;

/// Byte ranges of the addresses in `text`, in order and not overlapping.
pub fn find(text: &str) -> Vec<Range<usize>> {
    let bytes = text.as_bytes();
    let mut found: Vec<Range<usize>> = Vec::new();
    for (at, _) in text.match_indices('@') {
        let mut start = at;
        while start > 0 && is_local(bytes[start - 1]) {
            start -= 1;
        }
        // Dots before the address end a sentence; they are not part of it.
        while start < at && bytes[start] == b'.' {
            start += 1;
        }
        let mut end = at + 1;
        while end < bytes.len() && is_domain(bytes[end]) {
            end += 1;
        }
        while end > at + 1 && matches!(bytes[end - 1], b'.' | b'-') {
            end -= 1;
        }
        if start == at || !valid_domain(&text[at + 1..end]) {
            continue;
        }
        if found.last().is_some_and(|prev| prev.end > start) {
            continue;
        }
        found.push(start..end);
    }
    found
}

fn is_local(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'%' | b'+' | b'-' | b'\'')
}

fn is_domain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-')
}

/// At least two labels, no empty or hyphen-edged label, and a top-level label
/// of two or more letters (so `a@b.1` or `x@localhost` are left alone).
fn valid_domain(domain: &str) -> bool {
    let labels: Vec<&str> = domain.split('.').collect();
    let Some(tld) = labels.last() else {
        return false;
    };
    labels.len() >= 2
        && labels
            .iter()
            .all(|l| !l.is_empty() && !l.starts_with('-') && !l.ends_with('-'))
        && tld.len() >= 2
        && tld.bytes().all(|b| b.is_ascii_alphabetic())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emails(text: &str) -> Vec<&str> {
        find(text).into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn finds_addresses_in_sentences() {
        assert_eq!(
            emails("Mail john.doe+shop@mail.example.com. Or a_b@x.io!"),
            ["john.doe+shop@mail.example.com", "a_b@x.io"]
        );
        assert_eq!(emails("(ann@ex-ample.org)"), ["ann@ex-ample.org"]);
        assert_eq!(
            emails("почта: ivan@почта.рф или ivan@mail.ru"),
            ["ivan@mail.ru"]
        );
        assert_eq!(emails("...bob@site.com"), ["bob@site.com"]);
    }

    #[test]
    fn leaves_non_addresses() {
        for text in [
            "@channel hello",
            "me@localhost",
            "a@b.1",
            "price 5@3.50",
            "user@-bad.com",
            "trailing@",
            "x@.com",
        ] {
            assert!(find(text).is_empty(), "{text}");
        }
    }
}
