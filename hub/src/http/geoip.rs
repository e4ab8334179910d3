//! Country and city of a visitor's address, from a GeoIP database file in
//! MaxMind's format (`[geoip] database`), for the widget's session data.

use std::net::IpAddr;
use std::path::Path;

use maxminddb::{Reader, geoip2};
use serde_json::{Value, json};

/// An opened database; lookups read memory only.
pub struct GeoIp {
    reader: Reader<Vec<u8>>,
}

impl GeoIp {
    pub fn open(path: &Path) -> Result<GeoIp, String> {
        Reader::open_readfile(path)
            .map(|reader| GeoIp { reader })
            .map_err(|e| format!("{}: not a GeoIP database: {e}", path.display()))
    }

    #[cfg(test)]
    fn from_bytes(bytes: Vec<u8>) -> Result<GeoIp, String> {
        Reader::from_source(bytes)
            .map(|reader| GeoIp { reader })
            .map_err(|e| e.to_string())
    }

    /// The webhooks' `session.geoip` for `ip` (English names, coordinates as
    /// strings as the spec's samples have them); `None` when the database
    /// knows nothing of it.
    pub fn lookup(&self, ip: IpAddr) -> Option<Value> {
        let found = self.reader.lookup(ip).ok()?;
        let city: geoip2::City = found.decode().ok()??;
        let region = city.subdivisions.first();
        let text = |v: Option<&str>| v.map(str::to_owned);
        let number = |v: Option<f64>| v.map(|n| n.to_string());
        let geo = json!({
            "country_code": text(city.country.iso_code),
            "country": text(city.country.names.english),
            "region_code": text(region.and_then(|r| r.iso_code)),
            "region": text(region.and_then(|r| r.names.english)),
            "city": text(city.city.names.english),
            "latitude": number(city.location.latitude),
            "longitude": number(city.location.longitude),
        });
        let known: serde_json::Map<String, Value> = geo
            .as_object()?
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        (!known.is_empty()).then_some(Value::Object(known))
    }
}

/// A MaxMind-format database of one IPv4 network, for tests (the hub's own
/// and the end-to-end suite's): `network/prefix` → a City record.
pub mod testing {
    use std::net::Ipv4Addr;

    /// The record of [`database`]'s one network.
    pub struct Place<'a> {
        pub country_code: &'a str,
        pub country: &'a str,
        pub region_code: &'a str,
        pub region: &'a str,
        pub city: &'a str,
        pub latitude: f64,
        pub longitude: f64,
    }

    /// The bytes of a database in which `network/prefix` is `place`.
    pub fn database(network: Ipv4Addr, prefix: u8, place: &Place<'_>) -> Vec<u8> {
        let bits = u32::from(network);
        let node_count = u32::from(prefix);
        let data_record = node_count + 16;
        let mut out = Vec::new();
        for depth in 0..node_count {
            let bit = (bits >> (31 - depth)) & 1;
            let next = if depth + 1 == node_count {
                data_record
            } else {
                depth + 1
            };
            let (left, right) = if bit == 0 {
                (next, node_count)
            } else {
                (node_count, next)
            };
            out.extend_from_slice(&left.to_be_bytes()[1..]);
            out.extend_from_slice(&right.to_be_bytes()[1..]);
        }
        out.extend_from_slice(&[0; 16]);
        let names = |name: &str| map(&[("en", string(name))]);
        out.extend(map(&[
            ("city", map(&[("names", names(place.city))])),
            (
                "country",
                map(&[
                    ("iso_code", string(place.country_code)),
                    ("names", names(place.country)),
                ]),
            ),
            (
                "location",
                map(&[
                    ("latitude", double(place.latitude)),
                    ("longitude", double(place.longitude)),
                ]),
            ),
            (
                "subdivisions",
                array(&[map(&[
                    ("iso_code", string(place.region_code)),
                    ("names", names(place.region)),
                ])]),
            ),
        ]));
        out.extend_from_slice(b"\xab\xcd\xefMaxMind.com");
        out.extend(map(&[
            ("binary_format_major_version", uint16(2)),
            ("binary_format_minor_version", uint16(0)),
            ("build_epoch", uint64(1_795_564_800)),
            ("database_type", string("GeoIP2-City")),
            ("description", map(&[("en", string("hub test data"))])),
            ("ip_version", uint16(4)),
            ("languages", array(&[string("en")])),
            ("node_count", uint32(node_count)),
            ("record_size", uint16(24)),
        ]));
        out
    }

    // The data section's encoding: a control byte (type in the top three
    // bits, size in the low five; types past 7 in an extra byte), then the value.

    fn control(kind: u8, size: usize) -> Vec<u8> {
        let size = u8::try_from(size).unwrap_or(u8::MAX).min(28);
        if kind <= 7 {
            vec![(kind << 5) | size]
        } else {
            vec![size, kind - 7]
        }
    }

    fn string(s: &str) -> Vec<u8> {
        let mut out = control(2, s.len());
        out.extend_from_slice(s.as_bytes());
        out
    }

    fn double(v: f64) -> Vec<u8> {
        let mut out = control(3, 8);
        out.extend_from_slice(&v.to_be_bytes());
        out
    }

    fn uint16(v: u16) -> Vec<u8> {
        let mut out = control(5, 2);
        out.extend_from_slice(&v.to_be_bytes());
        out
    }

    fn uint32(v: u32) -> Vec<u8> {
        let mut out = control(6, 4);
        out.extend_from_slice(&v.to_be_bytes());
        out
    }

    fn uint64(v: u64) -> Vec<u8> {
        let mut out = control(9, 8);
        out.extend_from_slice(&v.to_be_bytes());
        out
    }

    fn map(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut out = control(7, entries.len());
        for (k, v) in entries {
            out.extend(string(k));
            out.extend_from_slice(v);
        }
        out
    }

    fn array(items: &[Vec<u8>]) -> Vec<u8> {
        let mut out = control(11, items.len());
        for item in items {
            out.extend_from_slice(item);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{Place, database};
    use super::*;

    #[test]
    fn an_address_in_the_database_gets_its_country_region_and_city() {
        let place = Place {
            country_code: "DE",
            country: "Germany",
            region_code: "BE",
            region: "Berlin",
            city: "Berlin",
            latitude: 52.5,
            longitude: 13.25,
        };
        let db = database("203.0.113.0".parse().expect("ip"), 24, &place);
        let geo = GeoIp::from_bytes(db).expect("a database the reader takes");
        assert_eq!(
            geo.lookup("203.0.113.7".parse().expect("ip")),
            Some(
                json!({ "country_code": "DE", "country": "Germany", "region_code": "BE",
                         "region": "Berlin", "city": "Berlin", "latitude": "52.5",
                         "longitude": "13.25" })
            )
        );
        assert_eq!(geo.lookup("198.51.100.1".parse().expect("ip")), None);
        assert!(GeoIp::open(Path::new("/nonexistent.mmdb")).is_err());
    }
}
