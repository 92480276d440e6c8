"""An example user policy, the one ``docs/policies.md`` walks through.

Serve it with ``realtime serve --policy models.policy.example:make_policy``.

It is a plain object, not a subclass of anything here: ``metadata``, ``infer``,
``infer_batch`` and ``reset`` are all the server looks for. The "model" is a
proportional controller: every action chunk moves the first joints of the state
linearly to a target in ``action_horizon`` steps; the target is the camera's mean
brightness, scaled to [-1, 1], so that the answer depends on what the robot sees.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ReachPolicy:
    def __init__(self, action_horizon: int = 10, action_dim: int = 7, state_dim: int = 7) -> None:
        self.metadata = {
            "action_horizon": action_horizon,
            "action_dim": action_dim,
            "image_keys": ["observation/image"],
            "image_resolution": [96, 96],
            "state_dim": state_dim,
            # Anything else is passed to the robot untouched.
            "policy": "reach-example",
        }
        self.resets = 0

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        return self.infer_batch([obs])[0]

    def infer_batch(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One vectorised step for many robots: that is what makes batching pay."""
        horizon, dim = self.metadata["action_horizon"], self.metadata["action_dim"]
        state = np.stack([o["state"] for o in batch])  # float32 [B, state_dim], read-only views
        images = np.stack([o["observation/image"] for o in batch])  # uint8 [B, 96, 96, 3]
        target = images.reshape(len(batch), -1).mean(axis=1) / 127.5 - 1.0  # [B]
        start = np.zeros((len(batch), dim), np.float32)
        n = min(dim, state.shape[1])
        start[:, :n] = state[:, :n]
        frac = np.linspace(1.0 / horizon, 1.0, horizon, dtype=np.float32)[None, :, None]  # [1, T, 1]
        actions = start[:, None, :] + frac * (target[:, None, None] - start[:, None, :])
        return [{"actions": actions[i].astype(np.float32)} for i in range(len(batch))]

    def reset(self) -> None:
        self.resets += 1


def make_policy(**kwargs: Any) -> ReachPolicy:
    """The factory named on the command line."""
    return ReachPolicy(**kwargs)
