"""``Pi0Policy``: the native pi0 as a ``PolicyAdapter`` batching robots.

Per call (engine thread): tokenise each robot's prompt (a prompt over 48 tokens
fails that robot with the field named; the engine re-runs the others), normalise
and zero-pad the state to 32, stack the cameras the ``image_key_map`` names (the
checkpoint's other cameras are pi0's missing camera: -1 image, mask false), draw
each robot's noise from its own generator, pad the batch to a bucket, run
(``runner.py``), and un-normalise and cut the actions to the checkpoint's action dim.

Each robot's noise comes from the ``seed`` sampling param if given, otherwise from a
hash of (policy seed, session id, the session's committed call count), as for the
built-in flow policy: a robot's answer does not depend on who shares its batch, and
after a reset the same observations replay the same actions.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from models.base import ModelError
from models.policy.base import PolicyAdapter, PolicyWork
from models.policy.noise import CallSeeds
from models.policy.pi0.config import Pi0Config
from models.policy.pi0.inputs import PromptTokenizer, PromptTooLong, Stats, pad_to, unpad
from models.policy.pi0.model import Pi0Model
from models.policy.pi0.runner import Pi0Runner
from protocols.openpi import PolicyMetadata

log = logging.getLogger(__name__)



def resolve_image_key_map(cfg: Pi0Config, image_key_map: Mapping[str, str] | None) -> dict[str, str]:
    """client key -> checkpoint feature; default: every feature under its own name."""
    if image_key_map is None:
        return {f: f for f in cfg.image_features if "empty_camera" not in f}
    unknown = [f for f in image_key_map.values() if f not in cfg.image_features]
    if unknown:
        raise ValueError(f"image_key_map names {unknown}, not cameras of this checkpoint "
                         f"(its cameras: {list(cfg.image_features)})")
    if len(set(image_key_map.values())) != len(image_key_map):
        raise ValueError("image_key_map maps two client keys to one camera")
    return dict(image_key_map)


class Pi0Policy(PolicyAdapter):
    """pi0 served to robots over OpenPI (metadata: 50 x 32 actions, cameras at 224 x 224)."""

    def __init__(self, model: Pi0Model, tokenizer: PromptTokenizer, *, state_stats: Stats, action_stats: Stats,
                 device: torch.device, max_batch: int = 32, steps: int | None = None,
                 image_key_map: Mapping[str, str] | None = None, name: str = "pi0", seed: int = 0,
                 use_graphs: bool | None = None, graph_prefix: bool = True, compile: bool | None = None,
                 weight_stream: bool = True) -> None:
        cfg = model.cfg
        model.fuse()
        self.cfg, self.model, self.tokenizer = cfg, model.eval(), tokenizer
        self.state_stats, self.action_stats = state_stats, action_stats
        self.name, self.max_batch, self.seed, self.device = name, max_batch, seed, device
        self.steps = steps or cfg.num_inference_steps
        key_map = resolve_image_key_map(cfg, image_key_map)
        by_feature = {f: k for k, f in key_map.items()}
        # Client keys in the checkpoint's camera order, and the slots they fill.
        self.client_keys = tuple(by_feature[f] for f in cfg.image_features if f in by_feature)
        self.present = tuple(i for i, f in enumerate(cfg.image_features) if f in by_feature)
        self.metadata = PolicyMetadata(
            action_horizon=cfg.chunk_size,
            action_dim=cfg.action_dim,
            image_keys=self.client_keys,
            image_resolution=cfg.image_resolution,
            state_dim=cfg.state_dim,
            extra={
                "policy": "pi0",
                "num_inference_steps": self.steps,
                "max_prompt_tokens": cfg.tokenizer_max_length,
                "checkpoint_image_features": list(cfg.image_features),
                "image_key_map": {k: key_map[k] for k in self.client_keys},
            },
        )
        self.runner = Pi0Runner(model, device, max_batch, use_graphs=use_graphs, graph_prefix=graph_prefix,
                                compile=compile, weight_stream=weight_stream)
        self.seeds = CallSeeds(seed)

    def describe(self) -> Mapping[str, Any]:
        params = sum(p.numel() for p in self.model.parameters())
        return {**super().describe(), "device": str(self.device), "parameters": params,
                "dtype": str(self.model.dtype).removeprefix("torch."),
                "normalisation": {"state": self.state_stats.mode if not self.state_stats.identity else "IDENTITY",
                                  "action": self.action_stats.mode if not self.action_stats.identity else "IDENTITY"}}

    # ------------------------------------------------------------------ engine thread
    def prepare(self, works: Sequence[PolicyWork]) -> dict[str, np.ndarray]:
        """The host-side inputs of ``works`` (no padding to a bucket yet)."""
        cfg = self.cfg
        tokens, valid = [], []
        for w in works:
            try:
                ids, ok = self.tokenizer.encode(w.observation.prompt)
            except PromptTooLong as exc:
                raise ModelError(f"session {w.session_id}: {exc}") from None
            tokens.append(ids)
            valid.append(ok)
        if self.client_keys:
            images = np.stack([np.stack([w.observation.images[k] for k in self.client_keys]) for w in works])
        else:
            h, wd = cfg.image_resolution
            images = np.zeros((len(works), 0, h, wd, 3), np.uint8)
        state = np.stack([self.state_stats.normalize(w.observation.state) for w in works]) if cfg.state_dim \
            else np.zeros((len(works), 0), np.float32)
        noise = np.stack([torch.randn(cfg.chunk_size, cfg.max_action_dim, generator=self.seeds.generator(w)).numpy()
                          for w in works])
        return {"images": images, "tokens": np.stack(tokens), "valid": np.stack(valid),
                "state": pad_to(state.astype(np.float32), cfg.max_state_dim), "noise": noise}

    def infer_batch(self, works: Sequence[PolicyWork]) -> list[Mapping[str, Any]]:
        host = self.prepare(works)
        n = len(works)
        b = self.runner.bucket_of(n)
        steps = [w.sampling.num_inference_steps or self.steps for w in works]
        if b > n:  # pad the batch with copies of its first robot; their rows are dropped
            host = {k: np.concatenate([v, np.repeat(v[:1], b - n, axis=0)]) for k, v in host.items()}
            steps += [steps[0]] * (b - n)
        dev = self.device
        with torch.inference_mode():
            img = torch.from_numpy(host["images"]).to(dev, non_blocking=True)
            # uint8 [B, C, H, W, 3] -> [-1, 1] [B, C, 3, H, W] (SigLIP's input range)
            img = img.permute(0, 1, 4, 2, 3).to(self.model.dtype) * (2.0 / 255.0) - 1.0
            actions = self.runner.run(
                img, self.present,
                torch.from_numpy(host["tokens"]).to(dev), torch.from_numpy(host["valid"]).to(dev),
                torch.from_numpy(host["state"]).to(dev), torch.from_numpy(host["noise"]).to(dev), steps,
            )
            out = actions[:n].float().cpu().numpy()
        out = self.action_stats.unnormalize(unpad(out, self.cfg.action_dim)).astype(np.float32)
        return [{"actions": out[i]} for i in range(n)]

    def warmup(self, steps: int | None = None) -> None:
        """Run every bucket once (captures its graph) so no robot pays for it."""
        h, w = self.cfg.image_resolution
        from protocols.openpi import Observation

        obs = Observation({k: np.zeros((h, w, 3), np.uint8) for k in self.client_keys},
                          np.zeros(self.cfg.state_dim, np.float32), "warm up")
        for b in self.runner.buckets:
            works = [PolicyWork(f"warmup/{i}", "warmup", obs) for i in range(b)]
            self.infer_batch(works)
            for wk in works:
                self.drop_session(wk.session_id)

    def end_tick(self, session_id: str, committed: bool) -> None:
        self.seeds.end_tick(session_id, committed)

    def drop_session(self, session_id: str) -> None:
        self.seeds.drop_session(session_id)
