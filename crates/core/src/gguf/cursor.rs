//! A bounds-checked little-endian reader over the bytes of a GGUF file.
//!
//! Every read checks the bytes left first, so a hostile length or count can never make the
//! reader slice past the end or allocate more than the file could hold. Failures carry a
//! reason only; the parser adds the context (which header field, key or tensor).

/// Why a read failed, in words; the parser wraps it into [`crate::Error::Gguf`] with a context.
pub(super) type Reason = String;

/// A position in a byte slice, advanced by each read.
pub(super) struct Cursor<'a> {
    bytes: &'a [u8],
    position: usize,
    /// The length of the whole file, of which `bytes` may be only the first part.
    file_bytes: u64,
    /// A read or a count needed bytes past `bytes` that the file has.
    past_prefix: bool,
}

impl<'a> Cursor<'a> {
    /// A cursor over a whole file.
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, position: 0, file_bytes: bytes.len() as u64, past_prefix: false }
    }

    /// A cursor over the first bytes of a file of `file_bytes` bytes.
    pub(super) fn prefix(bytes: &'a [u8], file_bytes: u64) -> Self {
        Cursor { bytes, position: 0, file_bytes: file_bytes.max(bytes.len() as u64), past_prefix: false }
    }

    /// Whether `count` more bytes are at hand. When they are not but the file has them, the
    /// cursor remembers it: [`Cursor::ran_past_prefix`].
    pub(super) fn fits(&mut self, count: u64) -> bool {
        if count <= self.remaining() as u64 {
            return true;
        }
        if (self.position as u64).checked_add(count).is_some_and(|end| end <= self.file_bytes) {
            self.past_prefix = true;
        }
        false
    }

    /// A read failed for want of bytes the file has past the prefix: a longer prefix may parse.
    pub(super) fn ran_past_prefix(&self) -> bool {
        self.past_prefix
    }

    /// Byte offset of the next read from the start of the file.
    pub(super) fn position(&self) -> usize {
        self.position
    }

    /// The length of the whole file.
    pub(super) fn file_bytes(&self) -> u64 {
        self.file_bytes
    }

    /// Bytes at hand between the next read and the end of the prefix (the file's end when the
    /// cursor has the whole file).
    pub(super) fn remaining(&self) -> usize {
        self.bytes.len() - self.position
    }

    /// The next `count` bytes. `count` is a `u64` because lengths in the file are: comparing
    /// before converting keeps a 2^60 length from wrapping on 32-bit targets.
    pub(super) fn take(&mut self, count: u64) -> Result<&'a [u8], Reason> {
        if !self.fits(count) {
            return Err(format!(
                "truncated: {count} bytes needed at offset {}, but the file ends at {} bytes",
                self.position,
                self.bytes.len()
            ));
        }
        let start = self.position;
        self.position += count as usize;
        Ok(&self.bytes[start..self.position])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Reason> {
        let bytes = self.take(N as u64)?;
        let mut array = [0; N];
        array.copy_from_slice(bytes);
        Ok(array)
    }

    pub(super) fn u8(&mut self) -> Result<u8, Reason> {
        Ok(self.array::<1>()?[0])
    }

    pub(super) fn i8(&mut self) -> Result<i8, Reason> {
        Ok(i8::from_le_bytes(self.array()?))
    }

    pub(super) fn u16(&mut self) -> Result<u16, Reason> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(super) fn i16(&mut self) -> Result<i16, Reason> {
        Ok(i16::from_le_bytes(self.array()?))
    }

    pub(super) fn u32(&mut self) -> Result<u32, Reason> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(super) fn i32(&mut self) -> Result<i32, Reason> {
        Ok(i32::from_le_bytes(self.array()?))
    }

    pub(super) fn u64(&mut self) -> Result<u64, Reason> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(super) fn i64(&mut self) -> Result<i64, Reason> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    pub(super) fn f32(&mut self) -> Result<f32, Reason> {
        Ok(f32::from_le_bytes(self.array()?))
    }

    pub(super) fn f64(&mut self) -> Result<f64, Reason> {
        Ok(f64::from_le_bytes(self.array()?))
    }

    /// A GGUF bool: one byte that must be 0 or 1.
    pub(super) fn bool(&mut self) -> Result<bool, Reason> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(format!("a bool must be 0 or 1, found {other} at offset {}", self.position - 1)),
        }
    }

    /// A GGUF string: a u64 byte length, then that many bytes of UTF-8 (no terminator).
    pub(super) fn string(&mut self) -> Result<&'a str, Reason> {
        let length_at = self.position;
        let length = self.u64()?;
        let bytes = self.take(length).map_err(|reason| {
            format!("string of {length} bytes (length at offset {length_at}) does not fit: {reason}")
        })?;
        std::str::from_utf8(bytes)
            .map_err(|err| format!("string at offset {} is not valid UTF-8: {err}", length_at + 8))
    }

    /// `count` values of `size` bytes each, decoded by `decode` from their little-endian bytes.
    /// The whole run is bounds-checked once, before anything is allocated.
    pub(super) fn values<T, const N: usize>(
        &mut self,
        count: u64,
        decode: fn([u8; N]) -> T,
    ) -> Result<Vec<T>, Reason> {
        let bytes = count
            .checked_mul(N as u64)
            .ok_or_else(|| format!("{count} values of {N} bytes overflow a 64-bit size"))?;
        let run = self.take(bytes)?;
        Ok(run
            .chunks_exact(N)
            .map(|chunk| {
                let mut array = [0; N];
                array.copy_from_slice(chunk);
                decode(array)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_and_stops_at_the_end() {
        let bytes = [1, 0, 0, 0, 0xff, 0xfe];
        let mut cursor = Cursor::new(&bytes);
        assert_eq!(cursor.u32().unwrap(), 1);
        assert_eq!(cursor.i16().unwrap(), -257);
        let err = cursor.u8().unwrap_err();
        assert!(err.contains("truncated") && err.contains("offset 6"), "{err}");
    }

    #[test]
    fn a_huge_length_is_an_error_not_an_allocation() {
        let mut bytes = u64::MAX.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"abc");
        let err = Cursor::new(&bytes).string().unwrap_err();
        assert!(err.contains(&format!("string of {} bytes", u64::MAX)), "{err}");
        let err = Cursor::new(&bytes).values(1 << 62, u64::from_le_bytes).unwrap_err();
        assert!(err.contains("overflow"), "{err}");
    }
}
