//! Uploading a model's tensors by name, each checked against the shape its config implies.

use crate::gguf::{GgufFile, TensorInfo};
use crate::gpu::{GpuContext, QuantMatrix, Tensor};
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

impl WeightLoader<'_> {
    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.file
            .tensor(name)
            .ok_or_else(|| tensor_error(name, format!("missing: a {} model needs it", self.arch)))
    }

    /// Whether the file has a tensor of this name.
    pub fn has(&self, name: &str) -> bool {
        self.file.tensor(name).is_some()
    }

    /// The weight `name` as a `rows` × `cols` matrix (GGUF shape `[cols, rows]`), quantized as
    /// in the file.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<QuantMatrix> {
        let info = self.info(name)?;
        if info.shape() != [cols, rows] {
            return Err(tensor_error(
                name,
                format!(
                    "has shape {:?}, but the model's hyper-parameters make it [{cols}, {rows}]",
                    info.shape()
                ),
            ));
        }
        QuantMatrix::upload(self.ctx, name, info.quant(), rows, cols, self.file.tensor_bytes(info))
    }

    /// The vector `name` of `len` elements, dequantized to f32.
    pub fn vector(&self, name: &str, len: usize) -> Result<Tensor> {
        let values = self.values(self.info(name)?, len)?;
        Tensor::from_slice(self.ctx, name, &[len], &values)
    }

    /// The vector `name` if the file has it.
    pub fn optional_vector(&self, name: &str, len: usize) -> Result<Option<Tensor>> {
        if self.has(name) { self.vector(name, len).map(Some) } else { Ok(None) }
    }

    /// The f32 values of the vector `name` on the CPU, if the file has it.
    pub fn optional_values(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        self.file.tensor(name).map(|info| self.values(info, len)).transpose()
    }

    fn values(&self, info: &TensorInfo, len: usize) -> Result<Vec<f32>> {
        let name = info.name();
        if info.shape() != [len] {
            return Err(tensor_error(
                name,
                format!("has shape {:?}, but the model's hyper-parameters make it [{len}]", info.shape()),
            ));
        }
        let mut values = vec![0.0f32; len];
        dequantize_row(info.quant(), self.file.tensor_bytes(info), &mut values)
            .map_err(|e| tensor_error(name, e.to_string()))?;
        Ok(values)
    }
}
