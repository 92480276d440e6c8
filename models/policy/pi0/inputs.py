"""What pi0 does to a robot's inputs and outputs besides the network.

* ``PromptTokenizer``: PaliGemma's tokenizer from the checkpoint folder
  (``tokenizer.json``, the ``tokenizers`` format that transformers saves). The prompt is
  cleaned as openpi does (strip; ``_`` and newlines become spaces), ended with ``"\\n"``
  (LeRobot's newline step), encoded with ``<bos>`` first, and right-padded with
  ``<pad>`` to ``tokenizer_max_length`` (48). A longer prompt is refused, not cut.
* ``Normalizer``: LeRobot's normalisation of the state in and the actions out, from
  the processor files beside the weights; identity where the checkpoint has no stats
  (``pi0_base``).
* ``pad_to`` / ``unpad``: state and actions zero-padded to 32 and cut back.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

import numpy as np

from models.policy.pi0.config import CheckpointError

TOKENIZER_FILE = "tokenizer.json"
# LeRobot >= 0.4 saves its pre/post-processor steps' tensors as these files.
STATE_STATS_GLOB = "policy_preprocessor_step_*_normalizer_processor.safetensors"
ACTION_STATS_GLOB = "policy_postprocessor_step_*_unnormalizer_processor.safetensors"
NORM_EPS = 1e-8


class PromptTooLong(ValueError):
    pass


class PromptTokenizer:
    """Prompt text -> (ids, valid) of exactly ``max_length`` tokens."""

    def __init__(self, folder: str, max_length: int) -> None:
        from tokenizers import Tokenizer

        path = next((p for p in (os.path.join(folder, TOKENIZER_FILE), os.path.join(folder, "tokenizer", TOKENIZER_FILE))
                     if os.path.exists(p)), None)
        if path is None:
            raise CheckpointError(f"{folder}: no {TOKENIZER_FILE} (put PaliGemma's tokenizer files, e.g. from "
                                  f"google/paligemma-3b-pt-224, in the checkpoint folder)")
        self.tok = Tokenizer.from_file(path)
        self.max_length = max_length
        ids = {name: self.tok.token_to_id(name) for name in ("<bos>", "<pad>")}
        if None in ids.values():
            raise CheckpointError(f"{path}: the tokenizer has no <bos> or <pad> token")
        self.bos, self.pad = ids["<bos>"], ids["<pad>"]
        self._cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def encode(self, prompt: str | None) -> tuple[np.ndarray, np.ndarray]:
        """-> ids int64 [max_length], valid bool [max_length]; ``PromptTooLong`` if it does not fit."""
        text = prompt or ""
        hit = self._cache.get(text)
        if hit is not None:
            return hit
        cleaned = text.strip().replace("_", " ").replace("\n", " ") + "\n"
        ids = list(self.tok.encode(cleaned, add_special_tokens=True).ids)
        if not ids or ids[0] != self.bos:
            ids.insert(0, self.bos)
        if len(ids) > self.max_length:
            raise PromptTooLong(f"'prompt' is {len(ids)} tokens, over pi0's {self.max_length}")
        out = np.full(self.max_length, self.pad, np.int64)
        out[:len(ids)] = ids
        valid = np.zeros(self.max_length, bool)
        valid[:len(ids)] = True
        if len(self._cache) < 1024:  # robots repeat one prompt for a whole episode
            self._cache[text] = (out, valid)
        return out, valid


@dataclass(frozen=True)
class Stats:
    mode: str  # IDENTITY, MEAN_STD or MIN_MAX
    a: np.ndarray | None = None  # mean or min
    b: np.ndarray | None = None  # std or max

    def normalize(self, x: np.ndarray) -> np.ndarray:
        if self.mode == "MEAN_STD" and self.a is not None:
            return (x - self.a) / (self.b + NORM_EPS)
        if self.mode == "MIN_MAX" and self.a is not None:
            return (x - self.a) / (self.b - self.a + NORM_EPS) * 2.0 - 1.0
        return x

    def unnormalize(self, x: np.ndarray) -> np.ndarray:
        if self.mode == "MEAN_STD" and self.a is not None:
            return x * (self.b + NORM_EPS) + self.a
        if self.mode == "MIN_MAX" and self.a is not None:
            return (x + 1.0) / 2.0 * (self.b - self.a + NORM_EPS) + self.a
        return x

    @property
    def identity(self) -> bool:
        return self.mode == "IDENTITY" or self.a is None


def load_stats(folder: str, pattern: str, feature: str | None, mode: str, dim: int) -> Stats:
    """Stats of ``feature`` under ``mode`` from the first file matching ``pattern``; identity if none."""
    if feature is None or mode == "IDENTITY":
        return Stats("IDENTITY")
    names = ("mean", "std") if mode == "MEAN_STD" else ("min", "max")
    for path in sorted(glob.glob(os.path.join(folder, pattern))):
        from safetensors.numpy import load_file

        tensors = load_file(path)
        keys = [f"{feature}.{n}" for n in names]
        if not all(k in tensors for k in keys):
            continue
        a, b = (tensors[k].astype(np.float32).reshape(-1) for k in keys)
        if a.shape != (dim,) or b.shape != (dim,):
            raise CheckpointError(f"{path}: {keys[0]} has {a.size} values, the feature has {dim}")
        return Stats(mode, a, b)
    return Stats("IDENTITY")


def pad_to(x: np.ndarray, width: int) -> np.ndarray:
    """[..., d] -> [..., width], zeros after d (pi0's pad_vector)."""
    if x.shape[-1] > width:
        raise ValueError(f"vector of {x.shape[-1]} does not fit in {width}")
    out = np.zeros((*x.shape[:-1], width), dtype=np.float32)
    out[..., :x.shape[-1]] = x
    return out


def unpad(x: np.ndarray, dim: int) -> np.ndarray:
    return x[..., :dim]
