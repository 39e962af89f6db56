//! Reading a model file from the JS wrapper's model source, piece by piece: the header from the
//! first bytes, the vectors, then each matrix's rows as the upload asks for them. The page
//! never holds the whole file, so a model larger than wasm32's 4 GiB loads.

use flint_core::engine::LoadedModelUpload;
use flint_core::gguf::GgufFile;
use flint_core::gpu::GpuContext;
use flint_core::model::tensors_read_first;
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;

use crate::error::{Error, Result};

#[wasm_bindgen]
extern "C" {
    /// A model file the JS wrapper opened (`openSource` in `js/flint.js`): its `size` in bytes
    /// and `read(offset, length)`, a promise of a `Uint8Array` of the `length` bytes at `offset`
    /// (from an `ArrayBuffer`, a `Blob`, or a download kept in the Cache API or a `Blob`).
    pub type ModelSource;

    #[wasm_bindgen(method, getter)]
    fn size(this: &ModelSource) -> f64;

    #[wasm_bindgen(method, catch, js_name = read)]
    fn read_promise(this: &ModelSource, offset: f64, length: f64) -> Result<js_sys::Promise, JsValue>;
}

/// The first read of a header; a longer header (a large vocabulary) is read on in steps four
/// times larger.
const FIRST_HEADER_BYTES: u64 = 4 << 20;

/// The most bytes of a tensor read at once: what the page and wasm memory hold of the file at
/// a time.
const PIECE_BYTES: usize = 16 << 20;

/// Bytes written between waits for the GPU to take them in, so that the queue's copies do not
/// pile up in the browser's memory faster than the GPU process drains them.
const SETTLE_BYTES: u64 = 64 << 20;

/// What a JS exception says.
fn js_message(value: &JsValue) -> String {
    match value.dyn_ref::<js_sys::Error>() {
        Some(error) => String::from(error.message()),
        None => value.as_string().unwrap_or_else(|| format!("{value:?}")),
    }
}

impl ModelSource {
    /// The file's size in bytes.
    pub(crate) fn bytes(&self) -> Result<u64> {
        let size = self.size();
        if !(size.is_finite() && size >= 0.0 && size.fract() == 0.0) {
            return Err(Error::Source(format!("its size is {size}, not a number of bytes")));
        }
        Ok(size as u64)
    }

    /// The `length` bytes at `offset`.
    async fn read(&self, offset: u64, length: usize) -> Result<Vec<u8>> {
        let failed = |why: String| Error::Source(format!("reading {length} bytes at {offset}: {why}"));
        let promise = self.read_promise(offset as f64, length as f64).map_err(|e| failed(js_message(&e)))?;
        let value =
            wasm_bindgen_futures::JsFuture::from(promise).await.map_err(|e| failed(js_message(&e)))?;
        let array = value
            .dyn_into::<js_sys::Uint8Array>()
            .map_err(|value| failed(format!("read gave {value:?}, not a Uint8Array")))?;
        if array.length() as usize != length {
            return Err(failed(format!("read gave {} bytes", array.length())));
        }
        Ok(array.to_vec())
    }

    /// The file's header, read from its first bytes, with the bytes of the tensors a model
    /// reads while it is built ([`tensors_read_first`]).
    pub(crate) async fn open(&self) -> Result<GgufFile> {
        let size = self.bytes()?;
        let mut prefix = Vec::new();
        let mut want = FIRST_HEADER_BYTES.min(size);
        let mut file = loop {
            let more = self.read(prefix.len() as u64, (want - prefix.len() as u64) as usize).await?;
            prefix.extend_from_slice(&more);
            if let Some(file) = GgufFile::from_header(&prefix, size)? {
                break file;
            }
            // `from_header` asks for more only when the file has more.
            want = (want * 4).min(size);
        };
        let first: Vec<(String, u64, usize)> = tensors_read_first(&file)
            .map(|tensor| (tensor.name().to_string(), tensor.file_offset(), tensor.bytes()))
            .collect();
        for (name, offset, bytes) in first {
            let bytes = self.read(offset, bytes).await?;
            file.insert_tensor_bytes(&name, bytes)?;
        }
        Ok(file)
    }

    /// Writes every weight of `upload` from the file, piece by piece in the file's order,
    /// calling `progress(bytes read, file size)` after each piece.
    pub(crate) async fn upload(
        &self,
        ctx: &GpuContext,
        upload: &mut LoadedModelUpload,
        progress: impl Fn(u64, u64),
    ) -> Result<()> {
        let size = self.bytes()?;
        let mut read = size - upload.weights().remaining_bytes();
        let mut unsettled = 0;
        progress(read, size);
        while let Some(piece) = upload.weights().next_piece(PIECE_BYTES) {
            let length = (piece.end - piece.start) as usize;
            let bytes = self.read(piece.start, length).await?;
            upload.weights().write_next(&bytes)?;
            drop(bytes);
            read += length as u64;
            unsettled += length as u64;
            if unsettled >= SETTLE_BYTES {
                settle(ctx).await;
                unsettled = 0;
            }
            progress(read, size);
        }
        settle(ctx).await;
        progress(size, size);
        Ok(())
    }
}

/// Waits until the GPU has carried out the work submitted so far (the queue's writes included).
async fn settle(ctx: &GpuContext) {
    let (done, settled) = futures::channel::oneshot::channel();
    ctx.queue().submit([]);
    ctx.queue().on_submitted_work_done(move || {
        let _ = done.send(());
    });
    let _ = settled.await;
}
