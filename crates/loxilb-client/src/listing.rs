//! Reading `GET /config/loadbalancer/all` as a stream.
//!
//! A full loxilb lists 2,048 rules of up to 32 endpoints: 6 MB of JSON. Collecting that body,
//! then parsing it into wire entries, then converting those, held three copies of the table
//! at once (the largest part of the controller's peak memory, see docs/BENCHMARKS.md). Here
//! the body's chunks go to a parser on a blocking thread as they arrive, and each entry is
//! converted as soon as it is read: what is held is the converted result plus a few chunks.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read};
use std::marker::PhantomData;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::dto::LoadbalanceEntry;

/// What a listing gave: the converted entries, and how many `convert` passed over.
#[derive(Debug, Clone, PartialEq)]
pub struct Listing<T> {
    pub items: Vec<T>,
    pub skipped: usize,
}

impl<T> Default for Listing<T> {
    fn default() -> Self {
        Listing {
            items: Vec::new(),
            skipped: 0,
        }
    }
}

/// Blocking `Read` over body chunks sent from the async side; end of stream when the sender
/// is dropped.
pub(crate) struct ChunkReader {
    rx: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    current: bytes::Bytes,
}

impl ChunkReader {
    pub(crate) fn new(rx: tokio::sync::mpsc::Receiver<bytes::Bytes>) -> ChunkReader {
        ChunkReader {
            rx,
            current: bytes::Bytes::new(),
        }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        bytes::Buf::advance(&mut self.current, n);
        Ok(n)
    }
}

/// Parses `{"lbAttr":[...]}` (a `null` list reads as empty; other keys are ignored),
/// converting each entry as it is read.
pub(crate) fn parse<T>(
    reader: impl Read,
    convert: fn(LoadbalanceEntry) -> Option<T>,
) -> serde_json::Result<Listing<T>> {
    parse_buffered(BufReader::with_capacity(64 * 1024, reader), convert)
}

fn parse_buffered<T>(
    reader: impl BufRead,
    convert: fn(LoadbalanceEntry) -> Option<T>,
) -> serde_json::Result<Listing<T>> {
    let mut de = serde_json::Deserializer::from_reader(reader);
    let listing = ListSeed { convert }.deserialize(&mut de)?;
    de.end()?;
    Ok(listing)
}

struct ListSeed<T> {
    convert: fn(LoadbalanceEntry) -> Option<T>,
}

impl<'de, T> DeserializeSeed<'de> for ListSeed<T> {
    type Value = Listing<T>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Listing<T>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, T> Visitor<'de> for ListSeed<T> {
    type Value = Listing<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object with an lbAttr list")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Listing<T>, A::Error> {
        let mut listing = Listing::default();
        while let Some(key) = map.next_key::<String>()? {
            if key == "lbAttr" {
                listing = map.next_value_seed(EntriesSeed {
                    convert: self.convert,
                    out: PhantomData,
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(listing)
    }
}

struct EntriesSeed<T> {
    convert: fn(LoadbalanceEntry) -> Option<T>,
    out: PhantomData<T>,
}

impl<'de, T> DeserializeSeed<'de> for EntriesSeed<T> {
    type Value = Listing<T>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Listing<T>, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, T> Visitor<'de> for EntriesSeed<T> {
    type Value = Listing<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of load-balancer rules or null")
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Listing<T>, E> {
        Ok(Listing::default())
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Listing<T>, E> {
        self.visit_none()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Listing<T>, D::Error> {
        d.deserialize_seq(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Listing<T>, A::Error> {
        let mut listing = Listing {
            items: Vec::with_capacity(seq.size_hint().unwrap_or(0)),
            skipped: 0,
        };
        while let Some(entry) = seq.next_element::<LoadbalanceEntry>()? {
            match (self.convert)(entry) {
                Some(item) => listing.items.push(item),
                None => listing.skipped += 1,
            }
        }
        Ok(listing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(entry: LoadbalanceEntry) -> Option<String> {
        let name = entry.service_arguments.name;
        (!name.is_empty()).then_some(name)
    }

    #[test]
    fn converts_every_entry_and_counts_the_skipped() {
        let body = br#"{"other":{"x":[1,2]},"lbAttr":[
            {"serviceArguments":{"externalIP":"192.0.2.1","port":80,"protocol":"tcp","name":"a"},
             "endpoints":[{"endpointIP":"10.0.0.1","targetPort":80,"weight":1,"state":"active"}]},
            {"serviceArguments":{"externalIP":"192.0.2.2","port":81,"protocol":"tcp"},
             "endpoints":null},
            {"serviceArguments":{"externalIP":"192.0.2.3","port":82,"protocol":"tcp","name":"c"},
             "endpoints":[]}]}"#;
        let listing = parse(&body[..], names).unwrap();
        assert_eq!(listing.items, vec!["a".to_string(), "c".to_string()]);
        assert_eq!(listing.skipped, 1);
    }

    #[test]
    fn null_or_missing_list_is_empty() {
        for body in [&br#"{"lbAttr":null}"#[..], br#"{}"#] {
            let listing = parse(body, names).unwrap();
            assert!(listing.items.is_empty() && listing.skipped == 0);
        }
    }

    #[test]
    fn truncated_or_trailing_garbage_is_an_error() {
        assert!(parse(&br#"{"lbAttr":[{"serviceArguments":{"#[..], names).is_err());
        assert!(parse(&br#"{"lbAttr":[]} x"#[..], names).is_err());
        assert!(parse(&br#"[1]"#[..], names).is_err());
    }

    #[test]
    fn chunks_split_anywhere_read_the_same() {
        let body = br#"{"lbAttr":[{"serviceArguments":{"externalIP":"192.0.2.1","port":80,"protocol":"tcp","name":"a"},"endpoints":[]}]}"#;
        let whole = parse(&body[..], names).unwrap();
        for split in 1..body.len() {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            let first = bytes::Bytes::copy_from_slice(&body[..split]);
            let second = bytes::Bytes::copy_from_slice(&body[split..]);
            tx.try_send(first).unwrap();
            tx.try_send(second).unwrap();
            drop(tx);
            assert_eq!(
                parse(ChunkReader::new(rx), names).unwrap(),
                whole,
                "split at {split}"
            );
        }
    }
}
