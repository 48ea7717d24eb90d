//! What a profiling session recorded, read from the serialized `tensorflow.profiler.XSpace` the plugin returns
//! (and that `jax.profiler` writes as `*.xplane.pb`, so both sides of a comparison read the same way).
//!
//! An `XSpace` holds planes (`/host:CPU`, `/device:GPU:0`, …); a plane holds lines (a thread, a CUDA stream);
//! a line holds timed events. Events name their metadata by id, and their statistics (`hlo_op`,
//! `hlo_module`, `correlation_id`, …) name theirs the same way; [`Trace::decode`] resolves both, so each
//! [`Event`] carries its own name and statistics as text. Only the fields read here are decoded; the rest of
//! the message is skipped by wire type, so newer producers read fine.

use std::collections::HashMap;

/// A decoded `XSpace`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    pub planes: Vec<Plane>,
}

/// One `XPlane`: a device or the host.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plane {
    pub name: String,
    pub lines: Vec<Line>,
}

/// One `XLine`: a thread or a stream, its events in time order as recorded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Line {
    pub name: String,
    pub timestamp_ns: i64,
    pub events: Vec<Event>,
}

/// One timed `XEvent` (a kernel, a memory copy, a host span).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Event {
    /// The metadata's name (a kernel's name on a device plane).
    pub name: String,
    /// Start, from the line's timestamp.
    pub offset_ps: i64,
    pub duration_ps: i64,
    /// The event's statistics, then its metadata's, as (name, value as text).
    pub stats: Vec<(String, String)>,
}

impl Event {
    /// The value of the statistic `name`, if the event has it.
    pub fn stat(&self, name: &str) -> Option<&str> {
        self.stats.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Why a buffer is not an `XSpace`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a profiler XSpace: {0}")]
pub struct TraceError(String);

impl Trace {
    /// Decodes a serialized `XSpace`.
    pub fn decode(bytes: &[u8]) -> Result<Trace, TraceError> {
        let mut planes = Vec::new();
        for field in Fields(bytes) {
            if let (1, Value::Bytes(b)) = field? {
                planes.push(decode_plane(b)?);
            }
        }
        Ok(Trace { planes })
    }

    /// Every event of the planes whose name starts with `prefix` (`/device:GPU:` for a GPU's kernels).
    pub fn events_on<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a Plane, &'a Line, &'a Event)> + 'a {
        self.planes
            .iter()
            .filter(move |p| p.name.starts_with(prefix))
            .flat_map(|p| p.lines.iter().flat_map(move |l| l.events.iter().map(move |e| (p, l, e))))
    }
}

/// An event's or statistic's metadata: its name, and (events only) the statistics every occurrence shares.
#[derive(Default)]
struct Metadata {
    name: String,
    stats: Vec<RawStat>,
}

/// A statistic before its name is resolved.
struct RawStat {
    metadata_id: i64,
    value: StatValue,
}

enum StatValue {
    Text(String),
    /// The name of another statistic's metadata (how repeated strings are interned).
    Ref(i64),
}

fn decode_plane(bytes: &[u8]) -> Result<Plane, TraceError> {
    let mut plane = Plane::default();
    let mut raw_lines = Vec::new();
    let mut events: HashMap<i64, Metadata> = HashMap::new();
    let mut stats: HashMap<i64, Metadata> = HashMap::new();
    for field in Fields(bytes) {
        match field? {
            (2, Value::Bytes(b)) => plane.name = text(b),
            (3, Value::Bytes(b)) => raw_lines.push(b),
            (4, Value::Bytes(b)) => {
                let (id, m) = decode_map_entry(b, decode_event_metadata)?;
                events.insert(id, m);
            }
            (5, Value::Bytes(b)) => {
                let (id, m) = decode_map_entry(b, decode_stat_metadata)?;
                stats.insert(id, m);
            }
            _ => {}
        }
    }
    let names = Names { events: &events, stats: &stats };
    for b in raw_lines {
        plane.lines.push(decode_line(b, &names)?);
    }
    Ok(plane)
}

struct Names<'a> {
    events: &'a HashMap<i64, Metadata>,
    stats: &'a HashMap<i64, Metadata>,
}

impl Names<'_> {
    fn stat(&self, s: &RawStat) -> (String, String) {
        let name = self.stats.get(&s.metadata_id).map_or_else(|| format!("stat {}", s.metadata_id), |m| m.name.clone());
        let value = match &s.value {
            StatValue::Text(t) => t.clone(),
            StatValue::Ref(id) => self.stats.get(id).map_or_else(String::new, |m| m.name.clone()),
        };
        (name, value)
    }
}

fn decode_line(bytes: &[u8], names: &Names<'_>) -> Result<Line, TraceError> {
    let mut line = Line::default();
    let mut display_name = String::new();
    for field in Fields(bytes) {
        match field? {
            (2, Value::Bytes(b)) => line.name = text(b),
            (11, Value::Bytes(b)) => display_name = text(b),
            (3, Value::Varint(v)) => line.timestamp_ns = v as i64,
            (4, Value::Bytes(b)) => line.events.push(decode_event(b, names)?),
            _ => {}
        }
    }
    if !display_name.is_empty() {
        line.name = display_name;
    }
    Ok(line)
}

fn decode_event(bytes: &[u8], names: &Names<'_>) -> Result<Event, TraceError> {
    let mut event = Event::default();
    let mut metadata_id = 0;
    let mut own = Vec::new();
    for field in Fields(bytes) {
        match field? {
            (1, Value::Varint(v)) => metadata_id = v as i64,
            (2, Value::Varint(v)) => event.offset_ps = v as i64,
            (3, Value::Varint(v)) => event.duration_ps = v as i64,
            (4, Value::Bytes(b)) => own.push(decode_stat(b)?),
            _ => {}
        }
    }
    let metadata = names.events.get(&metadata_id);
    event.name = metadata.map_or_else(String::new, |m| m.name.clone());
    let shared = metadata.map_or(&[][..], |m| &m.stats[..]);
    event.stats = own.iter().chain(shared).map(|s| names.stat(s)).collect();
    Ok(event)
}

fn decode_event_metadata(bytes: &[u8]) -> Result<Metadata, TraceError> {
    let mut m = Metadata::default();
    let mut display_name = String::new();
    for field in Fields(bytes) {
        match field? {
            (2, Value::Bytes(b)) => m.name = text(b),
            (4, Value::Bytes(b)) => display_name = text(b),
            (5, Value::Bytes(b)) => m.stats.push(decode_stat(b)?),
            _ => {}
        }
    }
    // Kernel names are mangled in `name`; `display_name`, when present, is the readable one.
    if !display_name.is_empty() {
        m.name = display_name;
    }
    Ok(m)
}

fn decode_stat_metadata(bytes: &[u8]) -> Result<Metadata, TraceError> {
    let mut m = Metadata::default();
    for field in Fields(bytes) {
        if let (2, Value::Bytes(b)) = field? {
            m.name = text(b);
        }
    }
    Ok(m)
}

fn decode_stat(bytes: &[u8]) -> Result<RawStat, TraceError> {
    let mut stat = RawStat { metadata_id: 0, value: StatValue::Text(String::new()) };
    for field in Fields(bytes) {
        match field? {
            (1, Value::Varint(v)) => stat.metadata_id = v as i64,
            (2, Value::Fixed64(v)) => stat.value = StatValue::Text(f64::from_bits(v).to_string()),
            (3, Value::Varint(v)) => stat.value = StatValue::Text(v.to_string()),
            (4, Value::Varint(v)) => stat.value = StatValue::Text((v as i64).to_string()),
            (5, Value::Bytes(b)) => stat.value = StatValue::Text(text(b)),
            (6, Value::Bytes(b)) => stat.value = StatValue::Text(format!("<{} bytes>", b.len())),
            (7, Value::Varint(v)) => stat.value = StatValue::Ref(v as i64),
            _ => {}
        }
    }
    Ok(stat)
}

/// A `map<int64, M>` entry: key is field 1, value field 2.
fn decode_map_entry(
    bytes: &[u8],
    value: impl Fn(&[u8]) -> Result<Metadata, TraceError>,
) -> Result<(i64, Metadata), TraceError> {
    let mut key = 0;
    let mut m = Metadata::default();
    for field in Fields(bytes) {
        match field? {
            (1, Value::Varint(v)) => key = v as i64,
            (2, Value::Bytes(b)) => m = value(b)?,
            _ => {}
        }
    }
    Ok((key, m))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One field's value by wire type.
enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32,
}

/// The fields of one protobuf message, in order.
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Value<'a>), TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        Some(self.field())
    }
}

impl<'a> Fields<'a> {
    fn field(&mut self) -> Result<(u32, Value<'a>), TraceError> {
        let key = self.varint()?;
        let number = (key >> 3) as u32;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => Value::Fixed64(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes"))),
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| TraceError("length too large".into()))?;
                Value::Bytes(self.take(len)?)
            }
            5 => {
                self.take(4)?;
                Value::Fixed32
            }
            w => return Err(TraceError(format!("wire type {w} of field {number}"))),
        };
        Ok((number, value))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], TraceError> {
        if n > self.0.len() {
            self.0 = &[];
            return Err(TraceError(format!("a field of {n} bytes runs past the end")));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn varint(&mut self) -> Result<u64, TraceError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some((&b, rest)) = self.0.split_first() else {
                return Err(TraceError("a varint runs past the end".into()));
            };
            self.0 = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        self.0 = &[];
        Err(TraceError("a varint longer than 10 bytes".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }
    fn int(field: u32, v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        varint(u64::from(field) << 3, &mut out);
        varint(v, &mut out);
        out
    }
    fn bytes(field: u32, b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        varint((u64::from(field) << 3) | 2, &mut out);
        varint(b.len() as u64, &mut out);
        out.extend_from_slice(b);
        out
    }

    /// A hand-encoded XSpace as protobuf writes it: one plane, one line, one kernel with an interned
    /// statistic (`hlo_op` by reference) and a direct one, plus an unknown field that must be skipped.
    #[test]
    fn decodes_names_times_and_statistics() {
        let stat_meta = |id: u64, name: &str| {
            bytes(5, &[int(1, id), bytes(2, &[int(1, id), bytes(2, name.as_bytes())].concat())].concat())
        };
        let kernel_meta =
            [int(1, 7), bytes(2, &[int(1, 7), bytes(2, b"_Z6kernel"), bytes(4, b"loop_add_fusion")].concat())].concat();
        let event = [
            int(1, 7),
            int(2, 1_000),
            int(3, 25_000),
            bytes(4, &[int(1, 1), int(7, 3)].concat()),
            bytes(4, &[int(1, 2), int(3, 42)].concat()),
            int(15, 9),
        ]
        .concat();
        let line = [bytes(2, b"Stream #7"), int(3, 123), bytes(4, &event)].concat();
        let plane = [
            int(1, 0),
            bytes(2, b"/device:GPU:0"),
            bytes(3, &line),
            bytes(4, &kernel_meta),
            stat_meta(1, "hlo_op"),
            stat_meta(2, "correlation_id"),
            stat_meta(3, "fusion.12"),
        ]
        .concat();
        let trace = Trace::decode(&bytes(1, &plane)).unwrap();
        let (p, l, e) = trace.events_on("/device:GPU:").next().unwrap();
        assert_eq!((p.name.as_str(), l.name.as_str(), l.timestamp_ns), ("/device:GPU:0", "Stream #7", 123));
        assert_eq!((e.name.as_str(), e.offset_ps, e.duration_ps), ("loop_add_fusion", 1_000, 25_000));
        assert_eq!(e.stat("hlo_op"), Some("fusion.12"));
        assert_eq!(e.stat("correlation_id"), Some("42"));
        assert_eq!(trace.events_on("/host:").count(), 0);
    }

    #[test]
    fn truncated_input_is_an_error() {
        let plane = bytes(1, &bytes(2, b"/device:GPU:0"));
        assert!(Trace::decode(&plane[..plane.len() - 2]).is_err());
        assert!(Trace::decode(&[0x80]).is_err());
        assert_eq!(Trace::decode(&[]).unwrap(), Trace::default());
    }
}
