//! Uploading a model's tensors by name, each checked against the shape its config implies.

use std::borrow::Cow;

use crate::gguf::{GgufFile, TensorInfo};
use crate::gpu::{Encoder, GpuContext, QuantMatrix, Tensor};
use crate::kernels::matmul::{MatmulInput, MatmulOutput, matmul};
use crate::quant::{QuantType, dequantize_row, widen_to_q8_0};
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
        let matrix =
            QuantMatrix::upload(self.ctx, name, info.quant(), rows, cols, self.file.tensor_bytes(info))?;
        self.file.release_pages(info);
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
            let parts = group
                .iter()
                .map(|t| {
                    let bytes = self.file.tensor_bytes(t);
                    if t.quant() == quant {
                        return Ok(Cow::Borrowed(bytes));
                    }
                    widen_to_q8_0(t.quant(), bytes).map(Cow::Owned).ok_or_else(|| {
                        tensor_error(t.name(), format!("{} rows do not re-encode as {quant}", t.quant()))
                    })
                })
                .collect::<Result<Vec<Cow<'_, [u8]>>>>()?;
            let name = group.iter().map(|t| t.name()).collect::<Vec<_>>().join(" + ");
            let parts: Vec<&[u8]> = parts.iter().map(AsRef::as_ref).collect();
            matrices.push((QuantMatrix::upload_stacked(self.ctx, &name, quant, cols, &parts)?, group.len()));
            group.iter().for_each(|info| self.file.release_pages(info));
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
            let loader = WeightLoader { ctx, file: &file, arch: "test" };
            let stacked = loader.stacked(&names, cols).unwrap();
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
