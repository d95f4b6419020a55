"""Building and loading policies: tiny models from configs, pretrained folders and GGUF files, the
model cache, vision-language models."""
