//! A model's summary from its GGUF metadata: what `flint inspect` prints.

use std::fmt;

use crate::Result;
use crate::gguf::{GgufFile, Metadata, MetadataArray};
use crate::quant::QuantType;

/// Architecture, hyper-parameters, tokenizer and tensors of a GGUF model.
/// Serializes to the JSON of `flint inspect --json`; `Display` is its human-readable form.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ModelSummary {
    /// `general.architecture`, e.g. `llama`, `gemma3`.
    pub architecture: String,
    /// `general.name`.
    pub name: Option<String>,
    /// GGUF version of the file.
    pub gguf_version: u32,
    /// Size of the whole file.
    pub file_bytes: u64,
    /// The `{architecture}.*` hyper-parameters present in the file.
    pub hyper_parameters: HyperParameters,
    /// The tokenizer, when the file has `tokenizer.ggml.model`.
    pub tokenizer: Option<TokenizerSummary>,
    /// Whether `tokenizer.chat_template` is present.
    pub has_chat_template: bool,
    /// Number of tensors.
    pub tensor_count: usize,
    /// Bytes of all tensors' data.
    pub tensor_bytes: u64,
    /// Tensors per type, the most common type first.
    pub tensor_types: Vec<TensorTypeSummary>,
}

/// The `{architecture}.*` hyper-parameters; each is `None` when the file does not have it.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct HyperParameters {
    /// `context_length`: the longest context the model was trained for, in tokens.
    pub context_length: Option<u32>,
    /// `embedding_length`: width of the residual stream.
    pub embedding_length: Option<u32>,
    /// `block_count`: number of transformer layers.
    pub block_count: Option<u32>,
    /// `feed_forward_length`: width of the feed-forward hidden layer.
    pub feed_forward_length: Option<u32>,
    /// `attention.head_count`: query heads.
    pub head_count: Option<u32>,
    /// `attention.head_count_kv`: key/value heads (grouped-query attention when fewer).
    pub head_count_kv: Option<u32>,
    /// `attention.key_length`: width of a key head, when not `embedding_length / head_count`.
    pub key_length: Option<u32>,
    /// `attention.value_length`: width of a value head.
    pub value_length: Option<u32>,
    /// `attention.layer_norm_rms_epsilon`.
    pub rms_norm_epsilon: Option<f32>,
    /// `rope.freq_base`.
    pub rope_freq_base: Option<f32>,
    /// `rope.dimension_count`: rotated dimensions per head.
    pub rope_dimension_count: Option<u32>,
    /// `attention.sliding_window`: window of the local-attention layers, in tokens.
    pub sliding_window: Option<u32>,
}

/// The tokenizer described by `tokenizer.ggml.*`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TokenizerSummary {
    /// `tokenizer.ggml.model`: `gpt2`, `llama`, ...
    pub model: String,
    /// What the model value means: "byte-level BPE" for `gpt2`, "SentencePiece" for `llama`.
    pub kind: &'static str,
    /// `tokenizer.ggml.pre`: the pre-tokenizer's name.
    pub pre: Option<String>,
    /// Length of `tokenizer.ggml.tokens`.
    pub vocab_size: Option<usize>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_token_id: Option<u32>,
}

/// How many tensors of one type a file has, and their bytes.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TensorTypeSummary {
    /// The type (serialized by its GGML name, e.g. `Q4_K`).
    #[serde(rename = "type", serialize_with = "serialize_ggml_name")]
    pub quant: QuantType,
    /// Number of tensors of this type.
    pub count: usize,
    /// Bytes of their data.
    pub bytes: u64,
}

fn serialize_ggml_name<S: serde::Serializer>(quant: &QuantType, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(quant.name())
}

impl HyperParameters {
    fn read(metadata: &Metadata, architecture: &str) -> Result<Self> {
        let u32_of = |key: &str| metadata.optional::<u32>(&format!("{architecture}.{key}"));
        let f32_of = |key: &str| metadata.optional::<f32>(&format!("{architecture}.{key}"));
        Ok(HyperParameters {
            context_length: u32_of("context_length")?,
            embedding_length: u32_of("embedding_length")?,
            block_count: u32_of("block_count")?,
            feed_forward_length: u32_of("feed_forward_length")?,
            head_count: u32_of("attention.head_count")?,
            head_count_kv: u32_of("attention.head_count_kv")?,
            key_length: u32_of("attention.key_length")?,
            value_length: u32_of("attention.value_length")?,
            rms_norm_epsilon: f32_of("attention.layer_norm_rms_epsilon")?,
            rope_freq_base: f32_of("rope.freq_base")?,
            rope_dimension_count: u32_of("rope.dimension_count")?,
            sliding_window: u32_of("attention.sliding_window")?,
        })
    }
}

impl TokenizerSummary {
    fn read(metadata: &Metadata) -> Result<Option<Self>> {
        let Some(model) = metadata.optional::<&str>("tokenizer.ggml.model")? else {
            return Ok(None);
        };
        let kind = match model {
            "gpt2" => "byte-level BPE",
            "llama" => "SentencePiece",
            _ => "unknown",
        };
        Ok(Some(TokenizerSummary {
            model: model.to_owned(),
            kind,
            pre: metadata.optional::<&str>("tokenizer.ggml.pre")?.map(str::to_owned),
            vocab_size: metadata.optional::<&MetadataArray>("tokenizer.ggml.tokens")?.map(MetadataArray::len),
            bos_token_id: metadata.optional("tokenizer.ggml.bos_token_id")?,
            eos_token_id: metadata.optional("tokenizer.ggml.eos_token_id")?,
        }))
    }
}

impl ModelSummary {
    /// Summarizes `file`; an error when `general.architecture` is missing or a key has an
    /// unexpected type.
    pub fn of(file: &GgufFile) -> Result<Self> {
        let metadata = file.metadata();
        let architecture = metadata.get_str("general.architecture")?.to_owned();
        let mut tensor_types: Vec<TensorTypeSummary> = Vec::new();
        for tensor in file.tensors() {
            match tensor_types.iter_mut().find(|summary| summary.quant == tensor.quant()) {
                Some(summary) => {
                    summary.count += 1;
                    summary.bytes += tensor.bytes() as u64;
                }
                None => tensor_types.push(TensorTypeSummary {
                    quant: tensor.quant(),
                    count: 1,
                    bytes: tensor.bytes() as u64,
                }),
            }
        }
        tensor_types.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.quant.name().cmp(b.quant.name())));
        Ok(ModelSummary {
            hyper_parameters: HyperParameters::read(metadata, &architecture)?,
            architecture,
            name: metadata.optional::<&str>("general.name")?.map(str::to_owned),
            gguf_version: file.version(),
            file_bytes: file.file_bytes(),
            tokenizer: TokenizerSummary::read(metadata)?,
            has_chat_template: metadata.get("tokenizer.chat_template").is_some(),
            tensor_count: file.tensors().len(),
            tensor_bytes: file.tensors().iter().map(|tensor| tensor.bytes() as u64).sum(),
            tensor_types,
        })
    }
}

/// "98362432 bytes (93.8 MiB)".
fn bytes_and_mib(bytes: u64) -> String {
    format!("{bytes} bytes ({:.1} MiB)", bytes as f64 / (1024.0 * 1024.0))
}

impl fmt::Display for ModelSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = |label: &str, value: &dyn fmt::Display| writeln!(f, "{label:<22}{value}");
        line("architecture", &self.architecture)?;
        if let Some(name) = &self.name {
            line("name", name)?;
        }
        line("file", &format_args!("GGUF v{}, {}", self.gguf_version, bytes_and_mib(self.file_bytes)))?;

        let h = &self.hyper_parameters;
        let integers = [
            ("context_length", h.context_length),
            ("embedding_length", h.embedding_length),
            ("block_count", h.block_count),
            ("feed_forward_length", h.feed_forward_length),
            ("head_count", h.head_count),
            ("head_count_kv", h.head_count_kv),
            ("key_length", h.key_length),
            ("value_length", h.value_length),
            ("rope_dimension_count", h.rope_dimension_count),
            ("sliding_window", h.sliding_window),
        ];
        for (label, value) in integers {
            if let Some(value) = value {
                line(label, &value)?;
            }
        }
        if let Some(epsilon) = h.rms_norm_epsilon {
            line("rms_norm_epsilon", &format_args!("{epsilon:e}"))?;
        }
        if let Some(base) = h.rope_freq_base {
            line("rope_freq_base", &base)?;
        }

        match &self.tokenizer {
            None => line("tokenizer", &"none")?,
            Some(tokenizer) => {
                let mut text = format!("{} ({})", tokenizer.model, tokenizer.kind);
                if let Some(pre) = &tokenizer.pre {
                    text += &format!(", pre-tokenizer {pre}");
                }
                if let Some(vocab_size) = tokenizer.vocab_size {
                    text += &format!(", {vocab_size} tokens");
                }
                if let Some(bos) = tokenizer.bos_token_id {
                    text += &format!(", bos {bos}");
                }
                if let Some(eos) = tokenizer.eos_token_id {
                    text += &format!(", eos {eos}");
                }
                line("tokenizer", &text)?;
            }
        }
        line("chat_template", &if self.has_chat_template { "yes" } else { "no" })?;
        let types: Vec<String> =
            self.tensor_types.iter().map(|summary| format!("{} {}", summary.count, summary.quant)).collect();
        line(
            "tensors",
            &format_args!(
                "{}, {}: {}",
                self.tensor_count,
                bytes_and_mib(self.tensor_bytes),
                types.join(", ")
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufWriter;
    use crate::gguf::MetadataValue as V;

    fn llama_like() -> GgufWriter {
        let tokens = ["<unk>", "<s>", "</s>", "a"].map(String::from).to_vec();
        GgufWriter::new(3)
            .metadata("general.architecture", V::String("llama".into()))
            .metadata("general.name", V::String("Tiny".into()))
            .metadata("llama.context_length", V::U32(2048))
            .metadata("llama.embedding_length", V::U32(64))
            .metadata("llama.block_count", V::U32(2))
            .metadata("llama.feed_forward_length", V::U32(128))
            .metadata("llama.attention.head_count", V::U32(4))
            .metadata("llama.attention.head_count_kv", V::U32(2))
            .metadata("llama.attention.layer_norm_rms_epsilon", V::F32(1e-5))
            .metadata("llama.rope.freq_base", V::F32(10000.0))
            .metadata("tokenizer.ggml.model", V::String("llama".into()))
            .metadata("tokenizer.ggml.tokens", V::Array(MetadataArray::String(tokens)))
            .metadata("tokenizer.ggml.bos_token_id", V::U32(1))
            .metadata("tokenizer.chat_template", V::String("{{ messages }}".into()))
            .tensor("token_embd.weight", &[64, 4], 8, vec![0; 4 * 2 * 34])
            .tensor("output_norm.weight", &[64], 0, vec![0; 256])
            .tensor("blk.0.attn_norm.weight", &[64], 0, vec![0; 256])
    }

    #[test]
    fn summarizes_architecture_hyper_parameters_tokenizer_and_tensors() {
        let (bytes, _) = llama_like().build();
        let file_bytes = bytes.len() as u64;
        let summary = GgufFile::from_bytes(bytes).unwrap().summary().unwrap();
        assert_eq!(summary.architecture, "llama");
        assert_eq!(summary.name.as_deref(), Some("Tiny"));
        assert_eq!((summary.gguf_version, summary.file_bytes), (3, file_bytes));
        let h = &summary.hyper_parameters;
        assert_eq!(
            (h.context_length, h.embedding_length, h.block_count, h.feed_forward_length),
            (Some(2048), Some(64), Some(2), Some(128))
        );
        assert_eq!(
            (h.head_count, h.head_count_kv, h.key_length, h.sliding_window),
            (Some(4), Some(2), None, None)
        );
        assert_eq!(
            (h.rms_norm_epsilon, h.rope_freq_base, h.rope_dimension_count),
            (Some(1e-5), Some(1e4), None)
        );
        let tokenizer = summary.tokenizer.as_ref().unwrap();
        assert_eq!((tokenizer.model.as_str(), tokenizer.kind), ("llama", "SentencePiece"));
        assert_eq!((tokenizer.pre.as_deref(), tokenizer.vocab_size), (None, Some(4)));
        assert_eq!((tokenizer.bos_token_id, tokenizer.eos_token_id), (Some(1), None));
        assert!(summary.has_chat_template);
        assert_eq!((summary.tensor_count, summary.tensor_bytes), (3, 272 + 512));
        assert_eq!(
            summary.tensor_types,
            [
                TensorTypeSummary { quant: QuantType::F32, count: 2, bytes: 512 },
                TensorTypeSummary { quant: QuantType::Q8_0, count: 1, bytes: 272 },
            ]
        );

        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(json["hyper_parameters"]["block_count"], 2);
        assert_eq!(json["tensor_types"][1]["type"], "Q8_0");
        assert_eq!(json["tokenizer"]["kind"], "SentencePiece");

        let text = summary.to_string();
        for line in [
            "architecture          llama\n",
            "head_count_kv         2\n",
            "rms_norm_epsilon      1e-5\n",
            "tokenizer             llama (SentencePiece), 4 tokens, bos 1\n",
            "chat_template         yes\n",
            "tensors               3, 784 bytes (0.0 MiB): 2 F32, 1 Q8_0\n",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
        assert!(!text.contains("key_length"), "absent hyper-parameters are not printed:\n{text}");
    }

    #[test]
    fn a_summary_needs_the_architecture_and_well_typed_keys() {
        let (bytes, _) = GgufWriter::new(3).build();
        let err = GgufFile::from_bytes(bytes).unwrap().summary().unwrap_err().to_string();
        assert_eq!(err, "GGUF file metadata key 'general.architecture': missing (a string was expected)");
        let (bytes, _) =
            llama_like().metadata("llama.attention.sliding_window", V::String("512".into())).build();
        let err = GgufFile::from_bytes(bytes).unwrap().summary().unwrap_err().to_string();
        assert!(err.contains("'llama.attention.sliding_window': expected u32, found string"), "{err}");
    }
}
