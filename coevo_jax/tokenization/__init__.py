"""Tokenizers the decoder reads text through, apart from the network: `gguf` rebuilds a Hugging Face fast
tokenizer from a GGUF file's metadata, `training` trains a small byte-level BPE chat tokenizer offline for a
model trained from scratch. (A Hugging Face checkpoint directory's own tokenizer files are read by
`transformers`, in `coevo_jax.checkpoint_formats.loading`.)"""
