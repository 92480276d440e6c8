"""Training clips rendered by the simulator on the training device, no CPU workers.

A *round* builds ``envs`` fresh mazes (seeds ``seed0 + round*envs + i``), renders
each one's start frame and then ``traj_len - 1`` frames under the scripted policy,
and stores the trajectories in a ring of ``rounds`` slots in device memory
(uint8). A clip is 16 frames of one trajectory whose first frame is the sink:

    contiguous:  frames s, s+1, ..., s+15
    gapped:      frame 0, then s+1, ..., s+15   (the sink is the trajectory start,
                                                 far behind, as in a long session)

``actions[t]`` is what was held while frame t was made from frame t-1; the
sink's action is always zero, as at serving where the first frame comes from
the simulator.

A share ``p_still`` of clips stop moving part-way (``hold_still``): a player who
lets go of every key for a long time, which the scripted policy's 1-8 frame
holds rarely show, and which the simulator renders as the same frame again.
"""

from __future__ import annotations

import torch

from models.maze.sim import MazeSim
from models.maze.training.scripted import WEIGHTS, ScriptedPolicy

TRAIN_SEED0 = 1_000_000   # training mazes; evaluation uses seeds below this


def render_trajectories(seeds: list[int], steps: int, policy_seed: int, device: torch.device | str,
                        policy_weights: tuple[float, ...] = WEIGHTS):
    """frames [B, steps+1, 64, 64, 3] uint8 and actions [B, steps+1, 8] (actions[:, 0] = 0)."""
    sim = MazeSim(seeds, device)
    pol = ScriptedPolicy(len(seeds), policy_seed, device, policy_weights)
    frames = [sim.render()]
    acts = [torch.zeros(len(seeds), 8, device=sim.device)]
    for _ in range(steps):
        a = pol.next()
        sim.step(a)
        frames.append(sim.render())
        acts.append(a)
    return torch.stack(frames, 1), torch.stack(acts, 1)


def hold_still(frames: torch.Tensor, actions: torch.Tensor, share: float,
               gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """In a ``share`` of clips, the camera stops after a random frame ``k`` (1 <= k <= T-2)::

        clip      sink  f1  f2  f3  f4  f5  ...        (k = 2)
        frames    sink  f1  f2  f2  f2  f2  ...        every frame after k is frame k
        actions   0     a1  a2  0   0   0   ...        and nothing is held

    This is exact simulator truth (no key held: the view does not change), not an
    approximation. Returns new tensors; clips not picked are unchanged.
    """
    B, T = frames.shape[:2]
    dev = frames.device
    pick = torch.rand(B, device=dev, generator=gen) < share
    k = torch.randint(1, T - 1, (B,), device=dev, generator=gen)
    t = torch.arange(T, device=dev)[None]
    still = pick[:, None] & (t > k[:, None])                     # [B, T]
    src = torch.where(still, k[:, None], t)
    frames = frames[torch.arange(B, device=dev)[:, None], src]
    actions = torch.where(still[:, :, None], torch.zeros_like(actions), actions)
    return frames, actions


class ClipStream:
    def __init__(self, device: torch.device | str, envs: int = 4096, traj_len: int = 48, rounds: int = 6,
                 clip: int = 16, seed0: int = TRAIN_SEED0, p_gapped: float = 0.5,
                 policy_weights: tuple[float, ...] = WEIGHTS, p_still: float = 0.0) -> None:
        self.device = torch.device(device)
        self.envs, self.traj_len, self.rounds, self.clip = envs, traj_len, rounds, clip
        self.seed0, self.p_gapped, self.policy_weights = seed0, p_gapped, policy_weights
        self.p_still = p_still
        self.frames = torch.empty(rounds * envs, traj_len, 64, 64, 3, dtype=torch.uint8, device=self.device)
        self.actions = torch.empty(rounds * envs, traj_len, 8, dtype=torch.float32, device=self.device)
        self.next_round = 0
        self.filled = 0  # trajectories available
        self.frames_rendered = 0

    def render_round(self) -> None:
        r = self.next_round
        seeds = [self.seed0 + r * self.envs + i for i in range(self.envs)]
        f, a = render_trajectories(seeds, self.traj_len - 1, policy_seed=self.seed0 + r, device=self.device,
                                   policy_weights=self.policy_weights)
        slot = (r % self.rounds) * self.envs
        self.frames[slot:slot + self.envs] = f
        self.actions[slot:slot + self.envs] = a
        self.next_round += 1
        self.filled = min(self.rounds * self.envs, self.filled + self.envs)
        self.frames_rendered += f.shape[0] * f.shape[1]

    def fill(self) -> None:
        while self.filled < self.rounds * self.envs:
            self.render_round()

    def sample(self, batch: int, gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """frames [batch, clip, 64, 64, 3] uint8, actions [batch, clip, 8] (sink action zeroed)."""
        dev = self.device
        idx = torch.randint(0, self.filled, (batch,), device=dev, generator=gen)
        start = torch.randint(0, self.traj_len - self.clip + 1, (batch,), device=dev, generator=gen)
        gapped = torch.rand(batch, device=dev, generator=gen) < self.p_gapped
        t = start[:, None] + torch.arange(self.clip, device=dev)[None]
        t[:, 0] = torch.where(gapped, torch.zeros_like(start), start)
        frames = self.frames[idx[:, None], t]
        acts = self.actions[idx[:, None], t].clone()
        acts[:, 0] = 0
        if self.p_still > 0:
            frames, acts = hold_still(frames, acts, self.p_still, gen)
        return frames, acts
