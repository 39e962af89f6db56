//! GGUF metadata: the typed key/value pairs before the tensor infos, and typed lookups.

use std::collections::HashMap;

use crate::gguf::cursor::{Cursor, Reason};
use crate::gguf::gguf_error;
use crate::{Error, Result};

/// How deep arrays of arrays may nest. GGUF writers in the wild nest at most once; the limit
/// keeps a file of a million nested array headers from overflowing the parser's stack.
const MAX_ARRAY_NESTING: usize = 8;

/// One metadata value, as typed in the file.
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataValue {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7: one byte, 0 or 1.
    Bool(bool),
    /// Type 8: UTF-8 text.
    String(String),
    /// Type 9: an array of one element type.
    Array(MetadataArray),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

/// A metadata array: all elements share one type, so each is stored as a plain vector
/// (`tokenizer.ggml.tokens` is a `String` array, `tokenizer.ggml.scores` an `F32` array).
/// Arrays of arrays hold inner arrays that each carry their own element type.
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataArray {
    /// Elements of type 0.
    U8(Vec<u8>),
    /// Elements of type 1.
    I8(Vec<i8>),
    /// Elements of type 2.
    U16(Vec<u16>),
    /// Elements of type 3.
    I16(Vec<i16>),
    /// Elements of type 4.
    U32(Vec<u32>),
    /// Elements of type 5.
    I32(Vec<i32>),
    /// Elements of type 6.
    F32(Vec<f32>),
    /// Elements of type 7.
    Bool(Vec<bool>),
    /// Elements of type 8.
    String(Vec<String>),
    /// Elements of type 9: nested arrays.
    Array(Vec<MetadataArray>),
    /// Elements of type 10.
    U64(Vec<u64>),
    /// Elements of type 11.
    I64(Vec<i64>),
    /// Elements of type 12.
    F64(Vec<f64>),
}

/// GGUF value type ids (`gguf_type` in ggml).
mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// The fewest bytes one value of a type takes in the file: a string is at least its 8-byte
/// length, an array its 4-byte element type and 8-byte count. `None` for an unknown type.
fn min_value_bytes(type_id: u32) -> Option<u64> {
    Some(match type_id {
        type_id::U8 | type_id::I8 | type_id::BOOL => 1,
        type_id::U16 | type_id::I16 => 2,
        type_id::U32 | type_id::I32 | type_id::F32 => 4,
        type_id::U64 | type_id::I64 | type_id::F64 | type_id::STRING => 8,
        type_id::ARRAY => 12,
        _ => return None,
    })
}

fn unknown_type(type_id: u32) -> Reason {
    format!("unknown value type {type_id} (GGUF defines 0 to 12)")
}

/// Reads one value of `type_id`.
pub(super) fn read_value(cursor: &mut Cursor, type_id: u32) -> Result<MetadataValue, Reason> {
    Ok(match type_id {
        type_id::U8 => MetadataValue::U8(cursor.u8()?),
        type_id::I8 => MetadataValue::I8(cursor.i8()?),
        type_id::U16 => MetadataValue::U16(cursor.u16()?),
        type_id::I16 => MetadataValue::I16(cursor.i16()?),
        type_id::U32 => MetadataValue::U32(cursor.u32()?),
        type_id::I32 => MetadataValue::I32(cursor.i32()?),
        type_id::F32 => MetadataValue::F32(cursor.f32()?),
        type_id::BOOL => MetadataValue::Bool(cursor.bool()?),
        type_id::STRING => MetadataValue::String(cursor.string()?.to_owned()),
        type_id::ARRAY => MetadataValue::Array(read_array(cursor, 1)?),
        type_id::U64 => MetadataValue::U64(cursor.u64()?),
        type_id::I64 => MetadataValue::I64(cursor.i64()?),
        type_id::F64 => MetadataValue::F64(cursor.f64()?),
        other => return Err(unknown_type(other)),
    })
}

/// Reads an array (element type, count, elements) at nesting level `depth` (1 = outermost).
fn read_array(cursor: &mut Cursor, depth: usize) -> Result<MetadataArray, Reason> {
    if depth > MAX_ARRAY_NESTING {
        return Err(format!("arrays nested more than {MAX_ARRAY_NESTING} deep"));
    }
    let element_type = cursor.u32()?;
    let count_at = cursor.position();
    let count = cursor.u64()?;
    let min_bytes = min_value_bytes(element_type).ok_or_else(|| unknown_type(element_type))?;
    // The count is untrusted: the elements must fit in what is left before anything is allocated.
    if !count.checked_mul(min_bytes).is_some_and(|bytes| cursor.fits(bytes)) {
        return Err(format!(
            "array of {count} elements of type {element_type} (count at offset {count_at}) needs at \
             least {min_bytes} bytes each, but only {} bytes are left in the file",
            cursor.remaining()
        ));
    }
    // Cannot truncate: count * min_bytes <= remaining, which is a usize.
    let count_usize = count as usize;
    Ok(match element_type {
        type_id::U8 => MetadataArray::U8(cursor.values(count, u8::from_le_bytes)?),
        type_id::I8 => MetadataArray::I8(cursor.values(count, i8::from_le_bytes)?),
        type_id::U16 => MetadataArray::U16(cursor.values(count, u16::from_le_bytes)?),
        type_id::I16 => MetadataArray::I16(cursor.values(count, i16::from_le_bytes)?),
        type_id::U32 => MetadataArray::U32(cursor.values(count, u32::from_le_bytes)?),
        type_id::I32 => MetadataArray::I32(cursor.values(count, i32::from_le_bytes)?),
        type_id::F32 => MetadataArray::F32(cursor.values(count, f32::from_le_bytes)?),
        type_id::U64 => MetadataArray::U64(cursor.values(count, u64::from_le_bytes)?),
        type_id::I64 => MetadataArray::I64(cursor.values(count, i64::from_le_bytes)?),
        type_id::F64 => MetadataArray::F64(cursor.values(count, f64::from_le_bytes)?),
        type_id::BOOL => MetadataArray::Bool((0..count).map(|_| cursor.bool()).collect::<Result<_, _>>()?),
        type_id::STRING => {
            let mut strings = Vec::with_capacity(count_usize);
            for index in 0..count_usize {
                let string = cursor.string().map_err(|reason| format!("element {index}: {reason}"))?;
                strings.push(string.to_owned());
            }
            MetadataArray::String(strings)
        }
        type_id::ARRAY => {
            let mut arrays = Vec::with_capacity(count_usize);
            for index in 0..count_usize {
                let array =
                    read_array(cursor, depth + 1).map_err(|reason| format!("element {index}: {reason}"))?;
                arrays.push(array);
            }
            MetadataArray::Array(arrays)
        }
        other => return Err(unknown_type(other)),
    })
}

impl MetadataValue {
    /// The GGUF name of the value's type, with the element type and length for arrays
    /// (for error messages: "expected u32, found array of 3 string").
    pub fn type_name(&self) -> String {
        match self {
            MetadataValue::U8(_) => "u8".into(),
            MetadataValue::I8(_) => "i8".into(),
            MetadataValue::U16(_) => "u16".into(),
            MetadataValue::I16(_) => "i16".into(),
            MetadataValue::U32(_) => "u32".into(),
            MetadataValue::I32(_) => "i32".into(),
            MetadataValue::F32(_) => "f32".into(),
            MetadataValue::Bool(_) => "bool".into(),
            MetadataValue::String(_) => "string".into(),
            MetadataValue::Array(array) => array.type_name(),
            MetadataValue::U64(_) => "u64".into(),
            MetadataValue::I64(_) => "i64".into(),
            MetadataValue::F64(_) => "f64".into(),
        }
    }

    /// The value as an `i128` when it is an integer of any width, so that one range check
    /// serves every integer type a writer may have chosen.
    fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            MetadataValue::U8(v) => v.into(),
            MetadataValue::I8(v) => v.into(),
            MetadataValue::U16(v) => v.into(),
            MetadataValue::I16(v) => v.into(),
            MetadataValue::U32(v) => v.into(),
            MetadataValue::I32(v) => v.into(),
            MetadataValue::U64(v) => v.into(),
            MetadataValue::I64(v) => v.into(),
            _ => return None,
        })
    }
}

impl MetadataArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetadataArray::U8(v) => v.len(),
            MetadataArray::I8(v) => v.len(),
            MetadataArray::U16(v) => v.len(),
            MetadataArray::I16(v) => v.len(),
            MetadataArray::U32(v) => v.len(),
            MetadataArray::I32(v) => v.len(),
            MetadataArray::F32(v) => v.len(),
            MetadataArray::Bool(v) => v.len(),
            MetadataArray::String(v) => v.len(),
            MetadataArray::Array(v) => v.len(),
            MetadataArray::U64(v) => v.len(),
            MetadataArray::I64(v) => v.len(),
            MetadataArray::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// "array of N TYPE", e.g. "array of 49152 string".
    pub fn type_name(&self) -> String {
        let element = match self {
            MetadataArray::U8(_) => "u8",
            MetadataArray::I8(_) => "i8",
            MetadataArray::U16(_) => "u16",
            MetadataArray::I16(_) => "i16",
            MetadataArray::U32(_) => "u32",
            MetadataArray::I32(_) => "i32",
            MetadataArray::F32(_) => "f32",
            MetadataArray::Bool(_) => "bool",
            MetadataArray::String(_) => "string",
            MetadataArray::Array(_) => "array",
            MetadataArray::U64(_) => "u64",
            MetadataArray::I64(_) => "i64",
            MetadataArray::F64(_) => "f64",
        };
        format!("array of {} {element}", self.len())
    }
}

/// A Rust type a metadata value can be read as, for [`Metadata::require`] and
/// [`Metadata::optional`].
///
/// Integers convert from any GGUF integer type whose value fits (writers differ in the widths
/// they pick), `f32` also from `f64`; strings and arrays borrow from the metadata.
pub trait FromMetadata<'a>: Sized {
    /// The expected type, in words, for error messages.
    const EXPECTED: &'static str;

    /// The value as `Self`, or why not (`Err` holds the reason).
    fn from_metadata(value: &'a MetadataValue) -> Result<Self, Reason>;
}

fn wrong_type(expected: &str, value: &MetadataValue) -> Reason {
    format!("expected {expected}, found {}", value.type_name())
}

macro_rules! integer_from_metadata {
    ($($ty:ty => $name:literal),*) => {$(
        impl FromMetadata<'_> for $ty {
            const EXPECTED: &'static str = $name;

            fn from_metadata(value: &MetadataValue) -> Result<Self, Reason> {
                let integer = value.as_integer().ok_or_else(|| wrong_type($name, value))?;
                <$ty>::try_from(integer).map_err(|_| {
                    format!("value {integer} ({}) does not fit in {}", value.type_name(), $name)
                })
            }
        }
    )*};
}

integer_from_metadata!(u32 => "u32", u64 => "u64", i32 => "i32", i64 => "i64", usize => "usize");

impl FromMetadata<'_> for f32 {
    const EXPECTED: &'static str = "f32";

    fn from_metadata(value: &MetadataValue) -> Result<Self, Reason> {
        match *value {
            MetadataValue::F32(v) => Ok(v),
            MetadataValue::F64(v) => Ok(v as f32),
            _ => Err(wrong_type(Self::EXPECTED, value)),
        }
    }
}

impl FromMetadata<'_> for bool {
    const EXPECTED: &'static str = "bool";

    fn from_metadata(value: &MetadataValue) -> Result<Self, Reason> {
        match *value {
            MetadataValue::Bool(v) => Ok(v),
            _ => Err(wrong_type(Self::EXPECTED, value)),
        }
    }
}

impl<'a> FromMetadata<'a> for &'a str {
    const EXPECTED: &'static str = "string";

    fn from_metadata(value: &'a MetadataValue) -> Result<Self, Reason> {
        match value {
            MetadataValue::String(v) => Ok(v),
            _ => Err(wrong_type(Self::EXPECTED, value)),
        }
    }
}

impl<'a> FromMetadata<'a> for &'a MetadataArray {
    const EXPECTED: &'static str = "array";

    fn from_metadata(value: &'a MetadataValue) -> Result<Self, Reason> {
        match value {
            MetadataValue::Array(v) => Ok(v),
            _ => Err(wrong_type(Self::EXPECTED, value)),
        }
    }
}

macro_rules! slice_from_metadata {
    ($($ty:ty => $variant:ident, $name:literal),*) => {$(
        impl<'a> FromMetadata<'a> for &'a [$ty] {
            const EXPECTED: &'static str = $name;

            fn from_metadata(value: &'a MetadataValue) -> Result<Self, Reason> {
                match value {
                    MetadataValue::Array(MetadataArray::$variant(v)) => Ok(v),
                    _ => Err(wrong_type($name, value)),
                }
            }
        }
    )*};
}

slice_from_metadata!(
    String => String, "array of string",
    f32 => F32, "array of f32",
    i32 => I32, "array of i32",
    u32 => U32, "array of u32"
);

/// The metadata of a GGUF file: its entries in file order, with lookup by key.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, MetadataValue)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// Builds the metadata from entries in file order; a key given twice is an error.
    pub(super) fn from_entries(entries: Vec<(String, MetadataValue)>) -> Result<Self> {
        let mut index = HashMap::with_capacity(entries.len());
        for (position, (key, _)) in entries.iter().enumerate() {
            if let Some(first) = index.insert(key.clone(), position) {
                return Err(gguf_error(
                    format!("metadata key '{key}'"),
                    format!("appears twice (entries {first} and {position})"),
                ));
            }
        }
        Ok(Metadata { entries, index })
    }

    /// All entries, in the order of the file.
    pub fn entries(&self) -> &[(String, MetadataValue)] {
        &self.entries
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.index.get(key).map(|&position| &self.entries[position].1)
    }

    /// The value of `key` as a `T`; an error naming the key when it is missing or of another
    /// type.
    ///
    /// ```no_run
    /// # fn main() -> flint_core::Result<()> {
    /// let file = flint_core::gguf::GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
    /// let layers: u32 = file.metadata().require("llama.block_count")?;
    /// let tokens: &[String] = file.metadata().require("tokenizer.ggml.tokens")?;
    /// let sliding_window: Option<u32> = file.metadata().optional("llama.attention.sliding_window")?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn require<'a, T: FromMetadata<'a>>(&'a self, key: &str) -> Result<T> {
        let value = self.get(key).ok_or_else(|| {
            gguf_error(format!("metadata key '{key}'"), format!("missing (a {} was expected)", T::EXPECTED))
        })?;
        T::from_metadata(value).map_err(|reason| gguf_error(format!("metadata key '{key}'"), reason))
    }

    /// The value of `key` as a `T` if present; an error naming the key when it is present
    /// with another type.
    pub fn optional<'a, T: FromMetadata<'a>>(&'a self, key: &str) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.require(key).map(Some),
        }
    }

    /// Shorthand for `require::<&str>(key)`.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.require(key)
    }

    /// Shorthand for `require::<u32>(key)`.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.require(key)
    }

    /// Shorthand for `require::<f32>(key)`.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.require(key)
    }

    /// Shorthand for `require::<&MetadataArray>(key)`.
    pub fn get_array(&self, key: &str) -> Result<&MetadataArray> {
        self.require(key)
    }
}

/// Wraps a reason into the error for a metadata key.
pub(super) fn key_error(key: &str) -> impl FnOnce(Reason) -> Error + '_ {
    move |reason| gguf_error(format!("metadata key '{key}'"), reason)
}
