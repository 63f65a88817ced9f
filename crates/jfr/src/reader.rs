//! The JFR binary format: chunks, the metadata event (the type system),
//! constant pools and events, read from a byte slice with every count,
//! offset and nesting level checked against the bytes that are there.
//!
//! ```text
//! chunk   := header(68 bytes) event*          (a file is one or more chunks)
//! header  := "FLR\0" major:u16 minor:u16 size:i64 cp_offset:i64 meta_offset:i64
//!            start_nanos:i64 duration_nanos:i64 start_ticks:i64 ticks_per_second:i64
//!            features:i32                     (bit 0: compressed integers)
//! event   := size type_id field*              (type 0: metadata, 1: constant pool)
//! ```
//!
//! With compressed integers (every recording the JDK 11+ or async-profiler
//! writes), `short`, `char`, `int` and `long` are LEB128-style varints of
//! up to nine bytes; without, they are big-endian. Values are read by the
//! field layout the metadata event declares, so fields a recorder adds are
//! skipped, never misread.

use std::collections::HashMap;

use crate::JfrError;

/// The chunk header size in bytes.
pub(crate) const HEADER_SIZE: usize = 68;
const MAGIC: &[u8; 4] = b"FLR\0";
/// How deep metadata elements and inline objects may nest (real
/// recordings use 5 and 3).
const MAX_DEPTH: usize = 32;
/// The most classes and fields per class the metadata may declare.
const MAX_CLASSES: usize = 100_000;
const MAX_FIELDS: usize = 4_096;

pub(crate) type Result<T> = std::result::Result<T, JfrError>;

/// The scalar values of one object's fields, in declaration order.
pub(crate) type Record = Vec<Scalar>;

/// A bounded reader over one region of the input.
#[derive(Clone)]
pub(crate) struct Buf<'a> {
    data: &'a [u8],
    pub(crate) pos: usize,
    end: usize,
    compressed: bool,
}

/// A string value: inline, or a key into the `java.lang.String` pool.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum JStr {
    Null,
    Inline(String),
    Pool(i64),
}

impl<'a> Buf<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Buf {
            data,
            pos: 0,
            end: data.len(),
            compressed: true,
        }
    }

    fn truncated(&self, what: &'static str) -> JfrError {
        JfrError::Truncated {
            what,
            offset: self.pos,
        }
    }

    fn invalid(&self, msg: impl Into<String>) -> JfrError {
        JfrError::Invalid {
            offset: self.pos,
            msg: msg.into(),
        }
    }

    fn remaining(&self) -> usize {
        self.end.saturating_sub(self.pos)
    }

    fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.truncated(what));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.bytes(1, what)?[0])
    }

    fn be<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N, what)?);
        Ok(a)
    }

    fn be_i64(&mut self, what: &'static str) -> Result<i64> {
        Ok(i64::from_be_bytes(self.be(what)?))
    }

    /// JFR's compressed integer: seven bits a byte, low bits first, with
    /// a continuation bit; the ninth byte carries eight bits.
    fn varlong(&mut self, what: &'static str) -> Result<i64> {
        let mut v: u64 = 0;
        for i in 0..8 {
            let b = self.u8(what)?;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v as i64);
            }
        }
        let b = self.u8(what)?;
        Ok((v | u64::from(b) << 56) as i64)
    }

    pub(crate) fn long(&mut self, what: &'static str) -> Result<i64> {
        if self.compressed {
            self.varlong(what)
        } else {
            self.be_i64(what)
        }
    }

    pub(crate) fn int(&mut self, what: &'static str) -> Result<i64> {
        if self.compressed {
            Ok(i64::from(self.varlong(what)? as i32))
        } else {
            Ok(i64::from(i32::from_be_bytes(self.be(what)?)))
        }
    }

    fn short(&mut self, what: &'static str) -> Result<i64> {
        if self.compressed {
            Ok(i64::from(self.varlong(what)? as i16))
        } else {
            Ok(i64::from(i16::from_be_bytes(self.be(what)?)))
        }
    }

    /// A count that must fit in the bytes left (every counted item takes
    /// at least `min_item` bytes).
    fn count(&mut self, what: &'static str, min_item: usize) -> Result<usize> {
        let at = self.pos;
        let n = self.int(what)?;
        let n = usize::try_from(n).map_err(|_| JfrError::Invalid {
            offset: at,
            msg: format!("{what} is negative ({n})"),
        })?;
        if n.saturating_mul(min_item) > self.remaining() {
            return Err(JfrError::Invalid {
                offset: at,
                msg: format!(
                    "{what} is {n}, more than the {} bytes left can hold",
                    self.remaining()
                ),
            });
        }
        Ok(n)
    }

    pub(crate) fn string(&mut self, what: &'static str) -> Result<JStr> {
        let at = self.pos;
        match self.u8(what)? {
            0 => Ok(JStr::Null),
            1 => Ok(JStr::Inline(String::new())),
            2 => Ok(JStr::Pool(self.long(what)?)),
            3 => {
                let n = self.count(what, 1)?;
                let b = self.bytes(n, what)?;
                Ok(JStr::Inline(String::from_utf8_lossy(b).into_owned()))
            }
            4 => {
                let n = self.count(what, 1)?;
                let mut units = Vec::with_capacity(n);
                for _ in 0..n {
                    units.push(self.short(what)? as u16);
                }
                Ok(JStr::Inline(String::from_utf16_lossy(&units)))
            }
            5 => {
                let n = self.count(what, 1)?;
                let b = self.bytes(n, what)?;
                Ok(JStr::Inline(b.iter().map(|&c| char::from(c)).collect()))
            }
            e => Err(JfrError::Invalid {
                offset: at,
                msg: format!("unknown string encoding {e} in {what}"),
            }),
        }
    }
}

/// The chunk header fields the conversion uses.
#[derive(Clone, Debug)]
pub(crate) struct ChunkHeader {
    pub(crate) size: usize,
    cp_offset: usize,
    meta_offset: usize,
    pub(crate) start_nanos: i64,
    pub(crate) duration_nanos: i64,
    compressed: bool,
}

/// Primitive kinds and inline objects, as the metadata declares them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Kind {
    Byte,
    Bool,
    Short,
    Char,
    Int,
    Long,
    Float,
    Double,
    Str,
    /// An inline object of this class (index into `Types::classes`).
    Object(usize),
}

#[derive(Clone, Debug)]
pub(crate) struct Field {
    pub(crate) name: String,
    kind: Kind,
    /// The value is a key into the constant pool of the field's type.
    cp: bool,
    array: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct Class {
    pub(crate) name: String,
    pub(crate) fields: Vec<Field>,
    /// Whether a value of this class reads no bytes at all (only inline
    /// objects of such classes): skipped without a loop.
    empty: bool,
    /// The primitive kind of classes like `int` or `java.lang.String`.
    primitive: Option<Kind>,
}

/// The type system of one chunk.
#[derive(Debug, Default)]
pub(crate) struct Types {
    pub(crate) classes: Vec<Class>,
    pub(crate) by_id: HashMap<i64, usize>,
}

impl Types {
    pub(crate) fn by_name(&self, name: &str) -> Option<usize> {
        self.classes.iter().position(|c| c.name == name)
    }
}

/// One scalar field value: integers, booleans and pool keys as `Int`,
/// strings as `Str`; arrays, inline objects and floats as `Other`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Scalar {
    Int(i64),
    Str(JStr),
    Other,
}

impl Scalar {
    pub(crate) fn int(&self) -> Option<i64> {
        match self {
            Scalar::Int(v) => Some(*v),
            _ => None,
        }
    }
}

/// Reads the chunk header at `pos`; the chunk must fit in the input.
/// Offsets in errors are relative to `pos`, like every offset in a chunk.
pub(crate) fn chunk_header(data: &[u8], pos: usize) -> Result<ChunkHeader> {
    let data = data.get(pos..).unwrap_or_default();
    let mut b = Buf::new(data);
    b.compressed = false;
    let magic = b.bytes(4, "the chunk magic")?;
    if magic != MAGIC {
        return Err(JfrError::NotJfr { offset: 0 });
    }
    let major = u16::from_be_bytes(b.be("the chunk version")?);
    let _minor = u16::from_be_bytes(b.be("the chunk version")?);
    if !(1..=2).contains(&major) {
        return Err(b.invalid(format!("unsupported JFR version {major}")));
    }
    let size = b.be_i64("the chunk size")?;
    let cp = b.be_i64("the constant pool offset")?;
    let meta = b.be_i64("the metadata offset")?;
    let start_nanos = b.be_i64("the chunk start time")?;
    let duration_nanos = b.be_i64("the chunk duration")?;
    let _start_ticks = b.be_i64("the chunk start ticks")?;
    let _ticks_per_second = b.be_i64("the chunk tick rate")?;
    let features = i32::from_be_bytes(b.be("the chunk features")?);
    let left = data.len();
    let in_chunk = |v: i64, what: &str| -> Result<usize> {
        usize::try_from(v)
            .ok()
            .filter(|&v| v >= HEADER_SIZE && v <= left)
            .ok_or_else(|| JfrError::Invalid {
                offset: 0,
                msg: format!(
                    "{what} {v} is outside the chunk (the recording has {left} bytes from here: truncated?)"
                ),
            })
    };
    let size = in_chunk(size, "chunk size")?;
    let cp_offset = in_chunk(cp, "constant pool offset")?;
    let meta_offset = in_chunk(meta, "metadata offset")?;
    if cp_offset >= size || meta_offset >= size {
        return Err(JfrError::Invalid {
            offset: 0,
            msg: "the constant pool or metadata offset is past the chunk end".into(),
        });
    }
    Ok(ChunkHeader {
        size,
        cp_offset,
        meta_offset,
        start_nanos,
        duration_nanos,
        compressed: features & 1 != 0,
    })
}

/// One chunk: its header, types and a reader over its bytes.
pub(crate) struct Chunk<'a> {
    pub(crate) header: ChunkHeader,
    pub(crate) types: Types,
    data: &'a [u8],
}

struct Element {
    name: usize,
    attrs: Vec<(usize, usize)>,
    children: Vec<Element>,
}

impl<'a> Chunk<'a> {
    /// Reads the chunk at `pos`: header and metadata.
    pub(crate) fn read(data: &'a [u8], pos: usize) -> Result<Self> {
        let header = chunk_header(data, pos)?;
        let data = &data[pos..pos + header.size];
        let mut c = Chunk {
            header,
            types: Types::default(),
            data,
        };
        c.types = c.read_metadata()?;
        Ok(c)
    }

    /// A reader over the chunk, positioned at `pos` (relative to the chunk
    /// start, as is every offset in it); positions are reported as offsets
    /// in the chunk.
    pub(crate) fn buf(&self, pos: usize) -> Buf<'a> {
        Buf {
            data: self.data,
            pos,
            end: self.data.len(),
            compressed: self.header.compressed,
        }
    }

    /// Reads an event's size and type at `pos`; returns (type id, a reader
    /// over the rest of the event, the next event's position).
    pub(crate) fn event_at(&self, pos: usize) -> Result<(i64, Buf<'a>, usize)> {
        let mut b = self.buf(pos);
        let size = b.int("an event size")?;
        let size = usize::try_from(size)
            .ok()
            .filter(|&s| s > 0 && s <= self.data.len() - pos)
            .ok_or_else(|| JfrError::Invalid {
                offset: pos,
                msg: format!("event size {size} does not fit in the chunk"),
            })?;
        let next = pos + size;
        b.end = next;
        let ty = b.long("an event type")?;
        Ok((ty, b, next))
    }

    fn read_metadata(&self) -> Result<Types> {
        let (ty, mut b, _) = self.event_at(self.header.meta_offset)?;
        if ty != 0 {
            return Err(b.invalid(format!(
                "the metadata offset points at an event of type {ty}, not metadata"
            )));
        }
        b.long("the metadata start time")?;
        b.long("the metadata duration")?;
        b.long("the metadata id")?;
        let n = b.count("the metadata string count", 1)?;
        let mut strings = Vec::with_capacity(n);
        for _ in 0..n {
            strings.push(match b.string("a metadata string")? {
                JStr::Null => String::new(),
                JStr::Inline(s) => s,
                JStr::Pool(_) => return Err(b.invalid("a metadata string refers to a pool")),
            });
        }
        let root = read_element(&mut b, strings.len(), 0)?;
        types_from(&root, &strings).map_err(|msg| JfrError::Invalid {
            offset: self.header.meta_offset,
            msg: format!("metadata: {msg}"),
        })
    }

    /// Visits every constant pool of the chunk (following the chain of
    /// checkpoint events from the header's offset backwards): `f` gets the
    /// class index of each pool, its entry count and the reader positioned
    /// at the first entry, and must consume all entries.
    pub(crate) fn constant_pools(
        &self,
        mut f: impl FnMut(usize, usize, &mut Buf<'a>) -> Result<()>,
    ) -> Result<()> {
        let mut pos = self.header.cp_offset;
        let mut visited = 0usize;
        loop {
            visited += 1;
            if visited > self.data.len() {
                return Err(JfrError::Invalid {
                    offset: pos,
                    msg: "constant pool chain does not end".into(),
                });
            }
            let (ty, mut b, _) = self.event_at(pos)?;
            if ty != 1 {
                return Err(b.invalid(format!(
                    "expected a constant pool event, found an event of type {ty}"
                )));
            }
            b.long("the constant pool start time")?;
            b.long("the constant pool duration")?;
            let delta = b.long("the constant pool delta")?;
            b.u8("the constant pool flush flag")?;
            let pools = b.count("the constant pool count", 2)?;
            for _ in 0..pools {
                let at = b.pos;
                let id = b.long("a constant pool type")?;
                let class = *self.types.by_id.get(&id).ok_or(JfrError::Invalid {
                    offset: at,
                    msg: format!("constant pool of undeclared type {id}"),
                })?;
                let n = b.count("a constant pool size", 1)?;
                f(class, n, &mut b)?;
            }
            if delta == 0 {
                return Ok(());
            }
            // Each checkpoint points back at the previous one.
            let next = i64::try_from(pos)
                .ok()
                .and_then(|p| p.checked_add(delta))
                .and_then(|p| usize::try_from(p).ok())
                .filter(|&p| p >= HEADER_SIZE && p < pos)
                .ok_or_else(|| JfrError::Invalid {
                    offset: pos,
                    msg: format!("constant pool delta {delta} points outside the chunk"),
                })?;
            pos = next;
        }
    }
}

fn read_element(b: &mut Buf<'_>, nstrings: usize, depth: usize) -> Result<Element> {
    if depth > MAX_DEPTH {
        return Err(b.invalid("metadata elements nest too deeply"));
    }
    let index = |b: &mut Buf<'_>| -> Result<usize> {
        let at = b.pos;
        let i = b.int("a metadata string index")?;
        usize::try_from(i)
            .ok()
            .filter(|&i| i < nstrings)
            .ok_or(JfrError::Invalid {
                offset: at,
                msg: format!("metadata string index {i} is out of range"),
            })
    };
    let name = index(b)?;
    let nattr = b.count("a metadata attribute count", 2)?;
    let mut attrs = Vec::with_capacity(nattr);
    for _ in 0..nattr {
        attrs.push((index(b)?, index(b)?));
    }
    let nchildren = b.count("a metadata element count", 3)?;
    let mut children = Vec::with_capacity(nchildren);
    for _ in 0..nchildren {
        children.push(read_element(b, nstrings, depth + 1)?);
    }
    Ok(Element {
        name,
        attrs,
        children,
    })
}

fn primitive(name: &str) -> Option<Kind> {
    Some(match name {
        "byte" => Kind::Byte,
        "boolean" => Kind::Bool,
        "short" => Kind::Short,
        "char" => Kind::Char,
        "int" => Kind::Int,
        "long" => Kind::Long,
        "float" => Kind::Float,
        "double" => Kind::Double,
        "java.lang.String" => Kind::Str,
        _ => return None,
    })
}

/// A class as declared: (class id, name, [(field name, type id, constant
/// pool, array)]).
type RawClass = (i64, String, Vec<(String, i64, bool, bool)>);

fn types_from(root: &Element, s: &[String]) -> std::result::Result<Types, String> {
    let attr = |e: &Element, key: &str| -> Option<String> {
        e.attrs
            .iter()
            .find(|(k, _)| s[*k] == key)
            .map(|(_, v)| s[*v].clone())
    };
    let id_of = |v: Option<String>, what: &str| -> std::result::Result<i64, String> {
        v.as_deref()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{what} has no numeric id"))
    };
    let mut raw: Vec<RawClass> = Vec::new();
    for md in root.children.iter().filter(|e| s[e.name] == "metadata") {
        for c in md.children.iter().filter(|e| s[e.name] == "class") {
            if raw.len() >= MAX_CLASSES {
                return Err(format!("more than {MAX_CLASSES} classes"));
            }
            let name = attr(c, "name").unwrap_or_default();
            let id = id_of(attr(c, "id"), &format!("class {name:?}"))?;
            let mut fields = Vec::new();
            for f in c.children.iter().filter(|e| s[e.name] == "field") {
                if fields.len() >= MAX_FIELDS {
                    return Err(format!("class {name} has more than {MAX_FIELDS} fields"));
                }
                let fname = attr(f, "name").unwrap_or_default();
                let ty = id_of(attr(f, "class"), &format!("field {name}.{fname}"))?;
                let cp = attr(f, "constantPool").as_deref() == Some("true");
                let array = match attr(f, "dimension").as_deref() {
                    None | Some("0") => false,
                    Some("1") => true,
                    Some(d) => return Err(format!("field {name}.{fname} has dimension {d}")),
                };
                fields.push((fname, ty, cp, array));
            }
            raw.push((id, name, fields));
        }
    }
    let mut by_id = HashMap::with_capacity(raw.len());
    for (i, (id, name, _)) in raw.iter().enumerate() {
        if by_id.insert(*id, i).is_some() {
            return Err(format!("class id {id} ({name}) is declared twice"));
        }
    }
    let mut classes = Vec::with_capacity(raw.len());
    for (_, name, fields) in &raw {
        let mut out = Vec::with_capacity(fields.len());
        for (fname, ty, cp, array) in fields {
            let &ci = by_id
                .get(ty)
                .ok_or_else(|| format!("field {name}.{fname} has undeclared type {ty}"))?;
            let kind = primitive(&raw[ci].1).unwrap_or(Kind::Object(ci));
            out.push(Field {
                name: fname.clone(),
                kind,
                cp: *cp,
                array: *array,
            });
        }
        classes.push(Class {
            name: name.clone(),
            fields: out,
            empty: false,
            primitive: primitive(name),
        });
    }
    mark_empty(&mut classes)?;
    Ok(Types { classes, by_id })
}

/// Rejects classes that contain themselves inline (their values would
/// never end) and marks the classes whose values read no bytes.
fn mark_empty(classes: &mut [Class]) -> std::result::Result<(), String> {
    // 0 = unvisited, 1 = on the path, 2 = done.
    fn visit(
        i: usize,
        classes: &[Class],
        state: &mut [u8],
        empty: &mut [bool],
        depth: usize,
    ) -> std::result::Result<(), String> {
        match state[i] {
            2 => return Ok(()),
            1 => return Err(format!("class {} contains itself inline", classes[i].name)),
            _ => {}
        }
        if depth > MAX_DEPTH {
            return Err("inline classes nest too deeply".into());
        }
        state[i] = 1;
        let mut e = classes[i].primitive.is_none();
        for f in &classes[i].fields {
            match f.kind {
                Kind::Object(c) if !f.cp && !f.array => {
                    visit(c, classes, state, empty, depth + 1)?;
                    e &= empty[c];
                }
                _ => e = false,
            }
        }
        empty[i] = e;
        state[i] = 2;
        Ok(())
    }
    let mut state = vec![0u8; classes.len()];
    let mut empty = vec![false; classes.len()];
    for i in 0..classes.len() {
        visit(i, classes, &mut state, &mut empty, 0)?;
    }
    for (c, e) in classes.iter_mut().zip(empty) {
        c.empty = e;
    }
    Ok(())
}

impl<'a> Buf<'a> {
    fn primitive_value(&mut self, k: Kind) -> Result<Scalar> {
        Ok(match k {
            Kind::Byte => Scalar::Int(i64::from(self.u8("a byte")? as i8)),
            Kind::Bool => Scalar::Int(i64::from(self.u8("a boolean")? != 0)),
            Kind::Short | Kind::Char => Scalar::Int(self.short("a short")?),
            Kind::Int => Scalar::Int(self.int("an int")?),
            Kind::Long => Scalar::Int(self.long("a long")?),
            Kind::Float => {
                self.bytes(4, "a float")?;
                Scalar::Other
            }
            Kind::Double => {
                self.bytes(8, "a double")?;
                Scalar::Other
            }
            Kind::Str => Scalar::Str(self.string("a string")?),
            Kind::Object(_) => Scalar::Other,
        })
    }

    /// Reads one field: scalars are returned, arrays and inline objects
    /// skipped.
    pub(crate) fn field(&mut self, t: &Types, f: &Field, depth: usize) -> Result<Scalar> {
        if f.array {
            let min = if f.cp { 1 } else { self.min_size(t, f.kind) };
            let n = self.count("an array length", min)?;
            if min == 0 {
                return Ok(Scalar::Other);
            }
            for _ in 0..n {
                self.single(t, f, depth)?;
            }
            return Ok(Scalar::Other);
        }
        self.single(t, f, depth)
    }

    fn min_size(&self, t: &Types, k: Kind) -> usize {
        match k {
            Kind::Object(c) if t.classes[c].empty => 0,
            Kind::Float => 4,
            Kind::Double => 8,
            _ => 1,
        }
    }

    fn single(&mut self, t: &Types, f: &Field, depth: usize) -> Result<Scalar> {
        if f.cp {
            return Ok(Scalar::Int(self.long("a constant pool key")?));
        }
        match f.kind {
            Kind::Object(c) => {
                self.skip_object(t, c, depth + 1)?;
                Ok(Scalar::Other)
            }
            k => self.primitive_value(k),
        }
    }

    fn skip_object(&mut self, t: &Types, c: usize, depth: usize) -> Result<()> {
        let class = &t.classes[c];
        if class.empty {
            return Ok(());
        }
        if let Some(k) = class.primitive {
            self.primitive_value(k)?;
            return Ok(());
        }
        if depth > MAX_DEPTH {
            return Err(self.invalid("inline objects nest too deeply"));
        }
        for f in &class.fields {
            self.field(t, f, depth)?;
        }
        Ok(())
    }

    /// Reads a value of class `c` and returns its fields' scalars (a
    /// primitive class, like `java.lang.String`, gives one value).
    pub(crate) fn record(&mut self, t: &Types, c: usize) -> Result<Vec<Scalar>> {
        let class = &t.classes[c];
        if let Some(k) = class.primitive {
            return Ok(vec![self.primitive_value(k)?]);
        }
        let mut out = Vec::with_capacity(class.fields.len());
        for f in &class.fields {
            out.push(self.field(t, f, 0)?);
        }
        Ok(out)
    }

    /// Reads a value of class `c` whose field `array_field` is an array
    /// of inline objects: returns the scalars of the other fields and,
    /// for each element, its scalars.
    pub(crate) fn record_with_array(
        &mut self,
        t: &Types,
        c: usize,
        array_field: usize,
    ) -> Result<(Record, Vec<Record>)> {
        let class = &t.classes[c];
        let mut out = Vec::with_capacity(class.fields.len());
        let mut elems = Vec::new();
        for (i, f) in class.fields.iter().enumerate() {
            match f.kind {
                Kind::Object(ec) if i == array_field && f.array && !f.cp => {
                    let min = self.min_size(t, f.kind).max(1);
                    let n = self.count("an array length", min)?;
                    elems.reserve(n);
                    for _ in 0..n {
                        elems.push(self.record(t, ec)?);
                    }
                    out.push(Scalar::Other);
                }
                _ => out.push(self.field(t, f, 0)?),
            }
        }
        Ok((out, elems))
    }

    /// Reads a pool entry's key.
    pub(crate) fn key(&mut self) -> Result<i64> {
        self.long("a constant pool key")
    }
}
