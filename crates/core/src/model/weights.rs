//! Uploading a model's tensors by name, each checked against the shape its config implies.

use crate::gguf::{GgufFile, TensorInfo};
use crate::gpu::{Encoder, GpuContext, QuantMatrix, Tensor};
use crate::kernels::matmul::{matmul, matmul_normed, matmul_split, matmul_split_normed};
use crate::kernels::norm::RmsNorm;
use crate::quant::dequantize_row;
use crate::{Error, Result};

/// Finds tensors in a GGUF file and puts them on the GPU: matrices still quantized, vectors
/// (norm weights, biases) as f32.
pub(crate) struct WeightLoader<'a> {
    pub ctx: &'a GpuContext,
    pub file: &'a GgufFile,
    /// The architecture's name, for "a {arch} model needs it" in errors.
    pub arch: &'static str,
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

impl WeightLoader<'_> {
    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.file
            .tensor(name)
            .ok_or_else(|| tensor_error(name, format!("missing: a {} model needs it", self.arch)))
    }

    /// The weight `name` as a `rows` × `cols` matrix (GGUF shape `[cols, rows]`), quantized as
    /// in the file.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<QuantMatrix> {
        let info = self.info(name)?;
        check_shape(info, &[cols, rows])?;
        QuantMatrix::upload(self.ctx, name, info.quant(), rows, cols, self.file.tensor_bytes(info))
    }

    /// Matrices of the same input, `(name, rows)` each with `cols` columns, stacked into as few
    /// matrices as their types allow: consecutive ones of the same type share one (see
    /// [`Stacked`]).
    pub fn stacked(&self, names: &[(String, usize)], cols: usize) -> Result<Stacked> {
        let mut matrices: Vec<(QuantMatrix, usize)> = Vec::new();
        let mut group: Vec<&TensorInfo> = Vec::new();
        for (i, (name, rows)) in names.iter().enumerate() {
            let info = self.info(name)?;
            check_shape(info, &[cols, *rows])?;
            group.push(info);
            let ends_group = names.get(i + 1).is_none_or(|(next, _)| {
                self.file.tensor(next).is_none_or(|next| next.quant() != info.quant())
            });
            if ends_group {
                let matrix = if let [one] = group[..] {
                    QuantMatrix::upload(
                        self.ctx,
                        one.name(),
                        one.quant(),
                        *rows,
                        cols,
                        self.file.tensor_bytes(one),
                    )?
                } else {
                    let name = group.iter().map(|t| t.name()).collect::<Vec<_>>().join(" + ");
                    let parts: Vec<&[u8]> = group.iter().map(|t| self.file.tensor_bytes(t)).collect();
                    QuantMatrix::upload_stacked(self.ctx, &name, info.quant(), cols, &parts)?
                };
                matrices.push((matrix, group.len()));
                group.clear();
            }
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
        dequantize_row(info.quant(), self.file.tensor_bytes(info), &mut values)
            .map_err(|e| tensor_error(name, e.to_string()))?;
        Ok(values)
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
    /// Records every projection of `x` (normalised by `norm` as the products load it, if
    /// given), the i-th into `outputs[i]`.
    pub fn forward(
        &self,
        ctx: &GpuContext,
        encoder: &mut Encoder,
        norm: Option<&RmsNorm<'_>>,
        x: &Tensor,
        outputs: &[&Tensor],
    ) -> Result<()> {
        let mut first = 0;
        for (matrix, count) in &self.matrices {
            let Some(these) = outputs.get(first..first + count) else {
                return Err(Error::KernelArguments {
                    kernel: "matmul",
                    reason: format!("{} outputs for stacked projections that need more", outputs.len()),
                });
            };
            match (these, norm) {
                ([y], None) => matmul(ctx, encoder, matrix, x, y)?,
                ([y], Some(norm)) => matmul_normed(ctx, encoder, matrix, norm, x, y)?,
                (_, None) => matmul_split(ctx, encoder, matrix, x, these)?,
                (_, Some(norm)) => matmul_split_normed(ctx, encoder, matrix, norm, x, these)?,
            }
            first += count;
        }
        Ok(())
    }
}
