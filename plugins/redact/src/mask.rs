//! Rewrites a text with every enabled kind of personal data replaced by its
//! placeholder, in one left-to-right pass over the bytes.

use crate::{email, number};

/// Which kinds to mask (all by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kinds {
    pub cards: bool,
    pub emails: bool,
    pub phones: bool,
}

/// The masked text and how many items were replaced, or `None` when nothing was.
pub fn mask(text: &str, kinds: Kinds) -> Option<(String, usize)> {
    let bytes = text.as_bytes();
    let emails = if kinds.emails {
        email::find(text)
    } else {
        Vec::new()
    };
    let mut emails = emails.into_iter().peekable();
    let mut out = String::with_capacity(text.len());
    let (mut copied, mut i, mut count) = (0, 0, 0);
    // Matches start and end at ASCII bytes, so every cut is a char boundary and
    // stepping byte by byte never lands a match inside a multi-byte char.
    while i < bytes.len() {
        let next_email = emails.peek().map(|r| (r.start, r.end));
        let found = match next_email {
            Some((start, end)) if start == i => {
                emails.next();
                Some((end, "[email]"))
            }
            _ => {
                // Numbers stop where an address begins, so they never swallow one.
                let limit = next_email.map_or(bytes.len(), |(start, _)| start);
                number_at(&bytes[..limit], i, kinds)
            }
        };
        match found {
            Some((end, placeholder)) => {
                out.push_str(&text[copied..i]);
                out.push_str(placeholder);
                count += 1;
                copied = end;
                i = end;
            }
            None => i += 1,
        }
    }
    if count == 0 {
        return None;
    }
    out.push_str(&text[copied..]);
    Some((out, count))
}

fn number_at(bytes: &[u8], i: usize, kinds: Kinds) -> Option<(usize, &'static str)> {
    let b = bytes[i];
    if !(b.is_ascii_digit() || b == b'+' || b == b'(') || !number::may_start(bytes, i) {
        return None;
    }
    if kinds.cards
        && b.is_ascii_digit()
        && let Some(end) = number::card_at(bytes, i)
    {
        return Some((end, "[card]"));
    }
    if kinds.phones && number::may_start_phone(bytes, i) {
        return number::phone_at(bytes, i).map(|end| (end, "[phone]"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: Kinds = Kinds {
        cards: true,
        emails: true,
        phones: true,
    };

    fn masked(text: &str) -> String {
        mask(text, ALL).map_or_else(|| text.to_owned(), |(t, _)| t)
    }

    #[test]
    fn masks_each_kind() {
        assert_eq!(
            masked("Card 4111 1111 1111 1111, mail me at jo@x.com or call +1 (555) 123-4567."),
            "Card [card], mail me at [email] or call [phone]."
        );
        assert_eq!(
            mask("a 4111111111111111 b 4111111111111111", ALL),
            Some(("a [card] b [card]".to_owned(), 2))
        );
        assert_eq!(
            masked("Мой номер 8 (916) 123-45-67, спасибо"),
            "Мой номер [phone], спасибо"
        );
        assert_eq!(masked("tel:+79161234567"), "tel:[phone]");
        assert_eq!(
            masked(
                "card 4111 1111 1111 1111, mail bob@example.com, call +1 (555) 010-9999 on 2026-11-22"
            ),
            "card [card], mail [email], call [phone] on 2026-11-22"
        );
    }

    #[test]
    fn leaves_ordinary_numbers() {
        for text in [
            "Order #12345678 shipped",
            "order 123456 is late",
            "Delivery on 2026-11-22 at 10:30",
            "On 22.11.2026 10:30 please",
            "Card 4111 1111 1111 1112 declined?",
            "Server 192.168.100.200 is down",
            "pi is 3.14159265",
            "see https://shop.example/item/98765432",
            "Price: 1,299.99 USD",
            "ticket INC1234567",
            "Flight SU 1234 on 2026-11-22 10:30-12:45",
            "v1.2.3 build 20261122",
        ] {
            assert_eq!(mask(text, ALL), None, "{text}");
        }
    }

    #[test]
    fn digits_in_addresses_stay_with_the_address() {
        assert_eq!(masked("write 5551234567@sms.example.com"), "write [email]");
    }

    #[test]
    fn kinds_can_be_switched_off() {
        let text = "4111111111111111 jo@x.com 555-123-4567";
        let only = |cards, emails, phones| {
            mask(
                text,
                Kinds {
                    cards,
                    emails,
                    phones,
                },
            )
            .map(|(t, _)| t)
        };
        assert_eq!(
            only(true, false, false).as_deref(),
            Some("[card] jo@x.com 555-123-4567")
        );
        assert_eq!(
            only(false, true, false).as_deref(),
            Some("4111111111111111 [email] 555-123-4567")
        );
        assert_eq!(
            only(false, false, true).as_deref(),
            Some("4111111111111111 jo@x.com [phone]")
        );
        assert_eq!(only(false, false, false), None);
    }

    #[test]
    fn never_cuts_inside_a_character() {
        let parts = [
            "ж", "4111", " ", "-", "@", "x.io", "(", ")", "+", "1", "é.", "€",
        ];
        // Every 4-part combination, so matches start and end next to multi-byte chars.
        for n in 0..parts.len().pow(4) {
            let mut text = String::new();
            let mut k = n;
            for _ in 0..4 {
                text.push_str(parts[k % parts.len()]);
                k /= parts.len();
            }
            let _ = mask(&text.repeat(3), ALL);
        }
    }

    #[test]
    fn long_digit_run_leaves_a_later_card_findable() {
        assert_eq!(masked("ref 555 4111 1111 1111 1111"), "ref 555 [card]");
    }
}
