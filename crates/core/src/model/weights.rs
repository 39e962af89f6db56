//! Uploading a model's tensors by name, each checked against the shape its config implies.
//!
//! A model is built in two steps, so that its bytes can stream in (the browser reads files
//! larger than its memory tensor by tensor): building it reads the vectors (norm weights,
//! biases: [`tensors_read_first`]) and allocates every matrix, then each matrix's tensor is
//! written in the file's order ([`WeightUpload`]).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ops::Range;

use crate::gguf::{GgufFile, TensorInfo};
use crate::gpu::weight::PartWriter;
use crate::gpu::{Encoder, GpuContext, QuantMatrix, Tensor};
use crate::kernels::matmul::{MatmulInput, MatmulOutput, matmul};
use crate::model::Model;
use crate::quant::{QuantType, dequantize_row};
use crate::{Error, Result};

/// The tensors a model reads while it is built, before any matrix is written: the vectors
/// (one dimension), in the file's order. A file opened from its header
/// ([`GgufFile::from_header`]) needs their bytes handed in first.
pub fn tensors_read_first(file: &GgufFile) -> impl Iterator<Item = &TensorInfo> {
    file.tensors().iter().filter(|tensor| tensor.shape().len() == 1)
}

/// Finds tensors in a GGUF file and puts them on the GPU: matrices still quantized (allocated
/// now, written by the [`WeightUpload`] that follows), vectors (norm weights, biases) as f32.
pub(crate) struct WeightLoader<'a> {
    pub ctx: &'a GpuContext,
    pub file: &'a GgufFile,
    /// The architecture's name, for "a {arch} model needs it" in errors.
    pub arch: &'static str,
    /// The matrices' tensors, still to be written.
    writes: RefCell<Vec<TensorWrite>>,
}

/// A tensor still to be written into (a part of) a matrix.
struct TensorWrite {
    tensor: TensorInfo,
    writer: PartWriter,
}

fn tensor_error(name: &str, reason: String) -> Error {
    Error::Gguf { context: format!("tensor '{name}'"), reason }
}

/// Checks a tensor's GGUF shape against the one the model's hyper-parameters imply.
fn check_shape(info: &TensorInfo, expected: &[usize]) -> Result<()> {
    if info.shape() == expected {
        return Ok(());
    }
    Err(tensor_error(
        info.name(),
        format!("has shape {:?}, but the model's hyper-parameters make it {expected:?}", info.shape()),
    ))
}

impl<'a> WeightLoader<'a> {
    pub fn new(ctx: &'a GpuContext, file: &'a GgufFile, arch: &'static str) -> Self {
        WeightLoader { ctx, file, arch, writes: RefCell::default() }
    }

    /// The upload of `model`, built with this loader: the tensors its matrices still need.
    pub fn into_upload(self, model: Model) -> WeightUpload {
        let mut writes = self.writes.into_inner();
        writes.sort_by_key(|write| write.tensor.file_offset());
        WeightUpload { model, writes: writes.into(), rows_written: 0 }
    }

    fn defer(&self, tensor: &TensorInfo, writer: PartWriter) {
        self.writes.borrow_mut().push(TensorWrite { tensor: tensor.clone(), writer });
    }

    fn info(&self, name: &str) -> Result<&'a TensorInfo> {
        self.file
            .tensor(name)
            .ok_or_else(|| tensor_error(name, format!("missing: a {} model needs it", self.arch)))
    }

    /// The weight `name` as a `rows` × `cols` matrix (GGUF shape `[cols, rows]`), quantized as
    /// in the file.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<QuantMatrix> {
        let info = self.info(name)?;
        check_shape(info, &[cols, rows])?;
        let matrix =
            QuantMatrix::allocate(self.ctx, name, info.quant(), cols, &[rows], self.ctx.max_binding_bytes())?;
        self.defer(info, matrix.part_writer(0));
        Ok(matrix)
    }

    /// Matrices of the same input, `(name, rows)` each with `cols` columns, stacked into as few
    /// matrices as their types allow: consecutive ones of the same type share one (see
    /// [`Stacked`]), and a mix of Q4_0, Q5_0 and Q8_0 (gemma-3's Q4_K_M files pair Q5_0 queries
    /// and keys with Q8_0 values in half the layers) becomes one Q8_0 matrix, exactly: see
    /// [`widen_to_q8_0`]. The wider rows cost a few percent more bytes than a separate product
    /// would read, where a separate product costs a dispatch.
    pub fn stacked(&self, names: &[(String, usize)], cols: usize) -> Result<Stacked> {
        let infos = names
            .iter()
            .map(|(name, rows)| {
                let info = self.info(name)?;
                check_shape(info, &[cols, *rows])?;
                Ok(info)
            })
            .collect::<Result<Vec<&TensorInfo>>>()?;
        let widens = |quant| matches!(quant, QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0);
        let mixed = infos.windows(2).any(|pair| pair[0].quant() != pair[1].quant());
        let groups: Vec<(QuantType, &[&TensorInfo])> = if mixed && infos.iter().all(|t| widens(t.quant())) {
            vec![(QuantType::Q8_0, &infos[..])]
        } else {
            infos.chunk_by(|a, b| a.quant() == b.quant()).map(|group| (group[0].quant(), group)).collect()
        };
        let mut matrices = Vec::with_capacity(groups.len());
        for (quant, group) in groups {
            let name = group.iter().map(|t| t.name()).collect::<Vec<_>>().join(" + ");
            let rows: Vec<usize> = group.iter().map(|t| t.rows()).collect();
            let matrix =
                QuantMatrix::allocate(self.ctx, &name, quant, cols, &rows, self.ctx.max_binding_bytes())?;
            for (part, tensor) in group.iter().enumerate() {
                if tensor.quant() != quant && quant != QuantType::Q8_0 {
                    return Err(tensor_error(
                        tensor.name(),
                        format!("{} rows cannot be stacked as {quant}", tensor.quant()),
                    ));
                }
                self.defer(tensor, matrix.part_writer(part));
            }
            matrices.push((matrix, group.len()));
        }
        Ok(Stacked { matrices })
    }

    /// The vector `name` of `len` elements, dequantized to f32.
    pub fn vector(&self, name: &str, len: usize) -> Result<Tensor> {
        let values = self.values(self.info(name)?, len)?;
        Tensor::from_slice(self.ctx, name, &[len], &values)
    }

    /// The f32 values of the vector `name` of `len` elements on the CPU.
    pub fn values_of(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.values(self.info(name)?, len)
    }

    /// The f32 values of the vector `name` on the CPU, if the file has it.
    pub fn optional_values(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        self.file.tensor(name).map(|info| self.values(info, len)).transpose()
    }

    fn values(&self, info: &TensorInfo, len: usize) -> Result<Vec<f32>> {
        let name = info.name();
        check_shape(info, &[len])?;
        let mut values = vec![0.0f32; len];
        dequantize_row(info.quant(), self.file.tensor_bytes(info)?, &mut values)
            .map_err(|e| tensor_error(name, e.to_string()))?;
        Ok(values)
    }
}

/// A model whose matrices are allocated on its GPU but not written yet: each tensor is written
/// as its bytes come, in the file's order ([`WeightUpload::next_tensor`]), and
/// [`WeightUpload::finish`] gives the model once all are. Made by [`Model::begin_load`].
pub struct WeightUpload {
    model: Model,
    /// The tensors still to write, in the file's order.
    writes: VecDeque<TensorWrite>,
    /// Rows of the first of `writes` already written.
    rows_written: usize,
}

impl WeightUpload {
    /// The tensor whose bytes come next, `None` once every tensor is written. Tensors the model
    /// does not use are skipped.
    pub fn next_tensor(&self) -> Option<&TensorInfo> {
        self.writes.front().map(|write| &write.tensor)
    }

    /// The bytes of the file to write next: the next rows of [`WeightUpload::next_tensor`], at
    /// most `max_bytes` of them (but at least one row); `None` once every tensor is written.
    pub fn next_piece(&self, max_bytes: usize) -> Option<Range<u64>> {
        let tensor = self.next_tensor()?;
        let row_bytes = tensor.row_bytes();
        let rows = (max_bytes / row_bytes).clamp(1, tensor.rows() - self.rows_written);
        let start = tensor.file_offset() + (self.rows_written * row_bytes) as u64;
        Some(start..start + (rows * row_bytes) as u64)
    }

    /// Bytes of the tensors still to write.
    pub fn remaining_bytes(&self) -> u64 {
        let written = self.next_tensor().map_or(0, |tensor| self.rows_written * tensor.row_bytes());
        self.writes.iter().map(|write| write.tensor.bytes() as u64).sum::<u64>() - written as u64
    }

    /// Writes the bytes of [`WeightUpload::next_piece`] (any whole number of the next tensor's
    /// rows that follow those written, up to its last row), read from the file; the next tensor
    /// comes next once the last row of this one is written.
    pub fn write_next(&mut self, bytes: &[u8]) -> Result<()> {
        let write = self.writes.front().ok_or_else(|| Error::Gguf {
            context: "the upload".into(),
            reason: "every tensor is written".into(),
        })?;
        let (tensor, row_bytes) = (&write.tensor, write.tensor.row_bytes());
        let rows_left = tensor.rows() - self.rows_written;
        if bytes.is_empty() || !bytes.len().is_multiple_of(row_bytes) || bytes.len() / row_bytes > rows_left {
            return Err(tensor_error(
                tensor.name(),
                format!(
                    "{} bytes were read for its rows from {}, which are not whole rows of {row_bytes} bytes \
                     among the {rows_left} left",
                    bytes.len(),
                    self.rows_written
                ),
            ));
        }
        write.writer.write_rows(&self.model.ctx, tensor.quant(), self.rows_written, bytes)?;
        self.rows_written += bytes.len() / row_bytes;
        if self.rows_written == tensor.rows() {
            self.writes.pop_front();
            self.rows_written = 0;
        }
        Ok(())
    }

    /// Writes every remaining tensor from `file`, which holds them all ([`WeightUpload::write_next_from`]).
    pub fn write_from(&mut self, file: &GgufFile) -> Result<()> {
        while self.write_next_from(file)? {}
        Ok(())
    }

    /// Writes the rest of the next tensor from `file`, which holds it, letting a mapped file's
    /// pages go once written ([`GgufFile::release_pages`]); `Ok(false)` when none was left.
    pub fn write_next_from(&mut self, file: &GgufFile) -> Result<bool> {
        let Some(tensor) = self.next_tensor().cloned() else { return Ok(false) };
        let done = self.rows_written * tensor.row_bytes();
        self.write_next(&file.tensor_bytes(&tensor)?[done..])?;
        file.release_pages(&tensor);
        Ok(true)
    }

    /// The model, once every tensor is written; an error names the first one that is not.
    pub fn finish(self) -> Result<Model> {
        if let Some(tensor) = self.next_tensor() {
            return Err(tensor_error(tensor.name(), "was never written: the upload ended early".into()));
        }
        // Uploads are queued: surface an out-of-memory or validation error now, not at the first step.
        self.model.ctx.check_errors()?;
        Ok(self.model)
    }
}

/// Projections of one input (a layer's query, key and value; its gate and up) in as few
/// stacked matrices as their types allow, so that one matmul pass computes several: one
/// dispatch instead of three for the attention inputs of a model quantized uniformly.
pub(crate) struct Stacked {
    /// Each matrix and the number of consecutive projections it holds.
    matrices: Vec<(QuantMatrix, usize)>,
}

impl Stacked {
    /// Records every projection of `input`, the i-th into `outputs[i]`; a residual input's
    /// sum is stored by each product of the stack, the same each time.
    pub fn forward(
        &self,
        ctx: &GpuContext,
        encoder: &mut Encoder,
        input: MatmulInput<'_>,
        outputs: &[&Tensor],
    ) -> Result<()> {
        let mut first = 0;
        for (matrix, count) in &self.matrices {
            let output = match outputs.get(first..first + count) {
                Some([y]) => MatmulOutput::Write(y),
                Some(these) => MatmulOutput::Split(these),
                None => {
                    return Err(Error::KernelArguments {
                        kernel: "matmul",
                        reason: format!("{} outputs for stacked projections that need more", outputs.len()),
                    });
                }
            };
            matmul(ctx, encoder, matrix, input, output)?;
            first += count;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufWriter;
    use crate::kernels::norm::{NormWeight, RmsNorm};
    use crate::kernels::testing::{Rng, assert_close, gpu};
    use crate::quant::random_rows;

    fn ggml_id(quant: QuantType) -> u32 {
        (0..40).find(|&id| QuantType::from_ggml_id(id) == Some(quant)).unwrap()
    }

    /// Projections of mixed types, stacked as the loader stacks them, each give their own
    /// product, in as few products as the types allow.
    #[test]
    fn mixed_projections_stack_into_as_few_products_as_their_types_allow() {
        use QuantType::{Q4_0, Q4_1, Q5_0, Q8_0};
        let ctx = gpu();
        let mut rng = Rng::new("mixed_projections_stack");
        let (cols, batch) = (96, 3);
        let cases: [(&[QuantType], usize); 5] = [
            // gemma-3's Q4_K_M queries, keys and values: one Q8_0 product.
            (&[Q5_0, Q5_0, Q8_0], 1),
            (&[Q8_0, Q4_0], 1),
            (&[Q4_0, Q5_0], 1),
            // Q4_1 has an offset: no exact Q8_0 form.
            (&[Q4_1, Q4_1, Q8_0], 2),
            (&[Q8_0, Q8_0], 1),
        ];
        for (types, products) in cases {
            let rows = [5usize, 3, 7];
            let parts: Vec<Vec<u8>> =
                types.iter().zip(rows).map(|(&quant, r)| random_rows(quant, r, cols, &mut rng)).collect();
            let mut writer = GgufWriter::new(3);
            let mut names = Vec::new();
            for (i, ((&quant, bytes), r)) in types.iter().zip(&parts).zip(rows).enumerate() {
                writer =
                    writer.tensor(&format!("p{i}"), &[cols as u64, r as u64], ggml_id(quant), bytes.clone());
                names.push((format!("p{i}"), r));
            }
            let file = GgufFile::from_bytes(writer.build().0).unwrap();
            let loader = WeightLoader::new(ctx, &file, "test");
            let stacked = loader.stacked(&names, cols).unwrap();
            let mut writes = loader.writes.into_inner();
            writes.sort_by_key(|write| write.tensor.file_offset());
            for write in writes {
                write
                    .writer
                    .write(ctx, write.tensor.quant(), file.tensor_bytes(&write.tensor).unwrap())
                    .unwrap();
            }
            assert_eq!(stacked.matrices.len(), products, "{types:?}");

            let x = rng.f32s(batch * cols, -1.0, 1.0);
            let x_gpu = Tensor::from_slice(ctx, "x", &[batch, cols], &x).unwrap();
            // Normalised by a weight of ones: x / rms(x), row by row.
            let ones = Tensor::from_slice(ctx, "ones", &[cols], &vec![1.0f32; cols]).unwrap();
            let norm = RmsNorm { weight: &ones, convention: NormWeight::Scale, eps: 0.0 };
            let normed: Vec<f64> = x
                .chunks(cols)
                .flat_map(|row| {
                    let rms = (row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / cols as f64).sqrt();
                    row.iter().map(move |&v| f64::from(v) / rms)
                })
                .collect();
            let outputs: Vec<Tensor> =
                names.iter().map(|(_, r)| Tensor::empty(ctx, "y", &[batch, *r]).unwrap()).collect();
            let mut encoder = ctx.encoder("test");
            stacked
                .forward(
                    ctx,
                    &mut encoder,
                    MatmulInput::Normed(&x_gpu, norm),
                    &outputs.iter().collect::<Vec<_>>(),
                )
                .unwrap();
            ctx.submit(encoder).unwrap();
            for ((&quant, bytes), (y, r)) in types.iter().zip(&parts).zip(outputs.iter().zip(rows)) {
                let mut w = vec![0.0f32; r * cols];
                dequantize_row(quant, bytes, &mut w).unwrap();
                let expected: Vec<f32> = (0..batch * r)
                    .map(|i| {
                        let (b, row) = (i / r, i % r);
                        let dot: f64 =
                            (0..cols).map(|k| f64::from(w[row * cols + k]) * normed[b * cols + k]).sum();
                        dot as f32
                    })
                    .collect();
                let got = pollster::block_on(y.to_f32(ctx)).unwrap();
                assert_close(&format!("{types:?}: the {quant} part"), &got, &expected, 1e-4);
            }
        }
    }
}
