"""The honest evaluation of the maze world model, every figure beside a baseline on the same frames.

``python -m models.world.maze.training.evaluate [--weights W] [--mazes 256] [--out JSON]``

Held-out mazes are seeds ``0..mazes-1`` (training uses seeds >= 1,000,000);
each gets an 80-frame trajectory from the scripted policy (its own seed). PSNR
is per frame (uint8, capped at 50 dB for identical frames) and averaged over the
frames that *change* (the truth differs from the frame copied).

1. one-step: every frame 1..79 predicted from the true frames before it
   (sink + window), vs copying the previous true frame, and vs the dataset-mean
   image;
2. free rollouts: 16 true context frames, then 64 generated frames under the
   true actions; PSNR at 1/4/8/16/64 frames ahead vs copying frame 15;
3. action following: from the same context, hold J, L, W or S for 8 frames
   (the simulator gives each key's truth); a rollout succeeds when it is closer
   (MSE over the 8 frames) to its own key's truth than to the opposite key's;
   W/S pairs whose truths are identical (both blocked) are left out.
   An inverse-dynamics CNN trained on real (previous, next) pairs labels the
   held key combination; its accuracy on (true previous, generated next) pairs
   is compared with its accuracy on the real pairs;
4. no key held for ``nokey_frames`` frames after the context: PSNR of every
   generated frame against the last context frame (the true view never moves);
   walking into a wall: face a wall along a grid axis and hold W; once the
   simulator's view has frozen, the generated frames are compared with it.
"""

from __future__ import annotations

import argparse
import sys
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from models.maze.sim import MazeSim
from models.maze.training.scripted import COMBOS, combo_bits
from models.world.maze.cache import FrameCache
from models.world.maze.model import MazeDiT
from models.world.maze.rollout import SamplerConfig, denoise_frame, next_frame, to_model, to_u8, write_frame
from models.world.maze.training.data import render_trajectories
from models.world.maze.training.train import psnr
from models.world.maze.weights import DEFAULT_WEIGHTS, load_model

log = logging.getLogger("models.world.maze.training.evaluate")

EVAL_POLICY_SEED = 77
ID_SEED0 = 3_000_000


@dataclass(frozen=True)
class EvalConfig:
    mazes: int = 256
    traj_len: int = 80
    context: int = 16
    horizons: tuple[int, ...] = (1, 4, 8, 16, 64)
    hold: int = 8
    nokey_mazes: int = 64
    nokey_frames: int = 300
    wall_mazes: int = 64
    wall_frames: int = 16
    id_steps: int = 1500
    id_batch: int = 256
    window: int = 14
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    batch: int = 256
    seed: int = 0


def _mean(x: torch.Tensor) -> float:
    return float(x.float().mean()) if x.numel() else float("nan")


class Evaluator:
    def __init__(self, model: MazeDiT, cfg: EvalConfig, device: torch.device) -> None:
        self.model, self.cfg, self.dev = model, cfg, device
        self.dtype = next(model.parameters()).dtype
        self.gen = torch.Generator(device=device).manual_seed(cfg.seed)

    # -------------------------------------------------------------- helpers
    def _cache(self, rows: int) -> FrameCache:
        return FrameCache(self.model.cfg, rows, self.cfg.window, self.dev, self.dtype)

    def _write_true(self, cache: FrameCache, frames: torch.Tensor, acts: torch.Tensor, upto: int) -> None:
        """Teacher-force true frames 0..upto-1 into ``cache`` (all rows)."""
        view = cache.view()
        B = frames.shape[0]
        for i in range(upto):
            idx = torch.full((B,), i, device=self.dev)
            write_frame(self.model, view, to_model(frames[:, i]), acts[:, i], idx, self.cfg.window)

    def _rollout(self, cache: FrameCache, acts: torch.Tensor, start: int) -> torch.Tensor:
        """Generate len(acts[0]) frames from ``start`` under acts [B, n, 8]; uint8 [B, n, 64, 64, 3]."""
        view = cache.view()
        B, n = acts.shape[:2]
        out = []
        for j in range(n):
            idx = torch.full((B,), start + j, device=self.dev)
            x0, _ = next_frame(self.model, view, acts[:, j], idx, self.cfg.window, self.cfg.sampler, self.gen)
            out.append(to_u8(x0))
        return torch.stack(out, 1)

    # -------------------------------------------------------------- 1. one step
    def one_step(self, frames: torch.Tensor, acts: torch.Tensor) -> tuple[dict, torch.Tensor]:
        B, L = frames.shape[:2]
        cache = self._cache(B)
        view = cache.view()
        write_frame(self.model, view, to_model(frames[:, 0]), acts[:, 0], torch.zeros(B, dtype=torch.long,
                    device=self.dev), self.cfg.window)
        preds = []
        for i in range(1, L):
            idx = torch.full((B,), i, device=self.dev)
            x0 = denoise_frame(self.model, view, acts[:, i], idx, self.cfg.sampler, self.gen)
            preds.append(to_u8(x0))
            write_frame(self.model, view, to_model(frames[:, i]), acts[:, i], idx, self.cfg.window)
        pred = torch.stack(preds, 1)                        # frames 1..L-1
        truth, prev = frames[:, 1:], frames[:, :-1]
        changed = psnr(truth, prev) < 50
        pm, pc = psnr(pred, truth), psnr(prev, truth)
        return {"model_db": _mean(pm[changed]), "copy_db": _mean(pc[changed]),
                "model_db_all": _mean(pm), "copy_db_all": _mean(pc),
                "frames_changed": int(changed.sum()), "frames": int(changed.numel())}, pred

    # -------------------------------------------------------------- 2. rollouts
    def rollouts(self, frames: torch.Tensor, acts: torch.Tensor) -> dict:
        c = self.cfg.context
        B, L = frames.shape[:2]
        cache = self._cache(B)
        self._write_true(cache, frames, acts, c)
        gen = self._rollout(cache, acts[:, c:], c)         # frames c..L-1
        res = {}
        for h in self.cfg.horizons:
            if c - 1 + h >= L:
                continue
            truth, copy = frames[:, c - 1 + h], frames[:, c - 1]
            changed = psnr(truth, copy) < 50
            pm, pc = psnr(gen[:, h - 1], truth), psnr(copy, truth)
            res[str(h)] = {"model_db": _mean(pm[changed]), "copy_db": _mean(pc[changed]),
                           "model_db_all": _mean(pm), "copy_db_all": _mean(pc), "n_changed": int(changed.sum())}
        return res

    # -------------------------------------------------------------- 3. action following
    def action_following(self, seeds: list[int], frames: torch.Tensor, acts: torch.Tensor) -> dict:
        c, hold = self.cfg.context, self.cfg.hold
        B = len(seeds)
        sim = MazeSim(seeds, self.dev)
        for i in range(1, c):
            sim.step(acts[:, i])
        snap = sim.state()
        cache = self._cache(B)
        self._write_true(cache, frames, acts, c)
        truth, gen = {}, {}
        for key in ("j", "l", "w", "s"):
            a = torch.tensor(combo_bits(key), device=self.dev).expand(B, 8)
            sim.set_state(snap)
            out = []
            for _ in range(hold):
                sim.step(a)
                out.append(sim.render())
            truth[key] = torch.stack(out, 1)
            gen[key] = self._rollout(cache.clone(), a[:, None].expand(B, hold, 8), c)

        def mse(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return (x.float() - y.float()).pow(2).flatten(1).mean(1)

        res = {}
        for a_key, b_key, name in (("j", "l", "turn_j_vs_l"), ("w", "s", "move_w_vs_s")):
            distinct = mse(truth[a_key], truth[b_key]) > 0
            wins = []
            for own, other in ((a_key, b_key), (b_key, a_key)):
                ok = mse(gen[own], truth[own]) < mse(gen[own], truth[other])
                wins.append(ok[distinct])
            w = torch.cat(wins)
            res[name] = {"closer_to_own": _mean(w), "n": int(w.numel())}
        return res

    # -------------------------------------------------------------- inverse dynamics
    def inverse_dynamics(self, frames: torch.Tensor, acts: torch.Tensor, pred: torch.Tensor) -> dict:
        """Train on real pairs (training-distribution mazes), test on eval pairs: real vs generated next frame."""
        table = torch.tensor([combo_bits(c) for c in COMBOS], device=self.dev)

        def label(a: torch.Tensor) -> torch.Tensor:  # [..., 8] -> combo index
            return (a[..., None, :] == table).all(-1).float().argmax(-1)

        torch.manual_seed(self.cfg.seed)
        net = nn.Sequential(
            nn.Conv2d(6, 32, 4, 2, 1), nn.SiLU(), nn.Conv2d(32, 64, 4, 2, 1), nn.SiLU(),
            nn.Conv2d(64, 128, 4, 2, 1), nn.SiLU(), nn.Conv2d(128, 128, 4, 2, 1), nn.SiLU(),
            nn.Flatten(), nn.Linear(128 * 16, 256), nn.SiLU(), nn.Linear(256, len(COMBOS))).to(self.dev)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        n_traj = max(64, self.cfg.id_batch)
        tr_f, tr_a = render_trajectories(list(range(ID_SEED0, ID_SEED0 + n_traj)), 47, ID_SEED0, self.dev)
        prev_f, next_f = tr_f[:, :-1].flatten(0, 1), tr_f[:, 1:].flatten(0, 1)
        y_all = label(tr_a[:, 1:].flatten(0, 1))

        def inp(p: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
            return torch.cat([to_model(p), to_model(n)], 1)

        for step in range(self.cfg.id_steps):
            i = torch.randint(0, len(y_all), (self.cfg.id_batch,), device=self.dev, generator=self.gen)
            loss = F.cross_entropy(net(inp(prev_f[i], next_f[i])), y_all[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        y = label(acts[:, 1:].flatten(0, 1))
        prev = frames[:, :-1].flatten(0, 1)
        with torch.no_grad():
            real = torch.cat([net(inp(prev[j:j + 1024], frames[:, 1:].flatten(0, 1)[j:j + 1024])).argmax(-1)
                              for j in range(0, len(y), 1024)]) == y
            fake = torch.cat([net(inp(prev[j:j + 1024], pred.flatten(0, 1)[j:j + 1024])).argmax(-1)
                              for j in range(0, len(y), 1024)]) == y
        acc_r, acc_g = _mean(real), _mean(fake)
        return {"acc_real": acc_r, "acc_generated": acc_g, "ratio": acc_g / max(acc_r, 1e-9),
                "pairs": int(len(y)), "train_steps": self.cfg.id_steps, "classes": len(COMBOS)}

    # -------------------------------------------------------------- 4. no key / wall
    def no_key(self, frames: torch.Tensor, acts: torch.Tensor) -> dict:
        c, n = self.cfg.context, self.cfg.nokey_frames
        B = frames.shape[0]
        cache = self._cache(B)
        self._write_true(cache, frames, acts, c)
        ref = frames[:, c - 1]
        view = cache.view()
        zero = torch.zeros(B, 8, device=self.dev)
        per_frame = []
        for j in range(n):
            idx = torch.full((B,), c + j, device=self.dev)
            x0, _ = next_frame(self.model, view, zero, idx, self.cfg.window, self.cfg.sampler, self.gen)
            per_frame.append(psnr(to_u8(x0), ref))
        p = torch.stack(per_frame, 1)                      # [B, n]
        return {"mean_db": _mean(p), "min_over_frames_of_mean_db": float(p.mean(0).min()),
                "last_frame_mean_db": _mean(p[:, -1]), "share_frames_ge_35db": _mean(p >= 35),
                "worst_db": float(p.min()), "frames": n, "mazes": B}

    def wall(self, seeds: list[int]) -> dict:
        """Face a wall along a grid axis, hold W: the simulator freezes; does the model?"""
        c, n = self.cfg.context, self.cfg.wall_frames
        sim = MazeSim(seeds, self.dev)
        # Point each camera along the first axis direction whose neighbouring cell is wall.
        x, y = sim.pos[:, 0].floor().long(), sim.pos[:, 1].floor().long()
        b = torch.arange(len(seeds), device=self.dev)
        yaw = torch.zeros(len(seeds), device=self.dev)
        found = torch.zeros(len(seeds), dtype=torch.bool, device=self.dev)
        for ang, dx, dy in ((0.0, 1, 0), (math.pi / 2, 0, 1), (math.pi, -1, 0), (-math.pi / 2, 0, -1)):
            wall = sim.grid[b, y + dy, x + dx] > 0
            yaw = torch.where(~found & wall, torch.full_like(yaw, ang), yaw)
            found |= wall
        sim.yaw = yaw
        w = torch.tensor(combo_bits("w"), device=self.dev).expand(len(seeds), 8)
        frames = [sim.render()]
        acts = [torch.zeros_like(w)]
        for _ in range(c - 1 + n):
            sim.step(w)
            frames.append(sim.render())
            acts.append(w)
        frames_t, acts_t = torch.stack(frames, 1), torch.stack(acts, 1)
        frozen = frames_t[:, c - 1]
        keep = found & (psnr(frames_t[:, c - 4], frozen) >= 50) & (psnr(frames_t[:, -1], frozen) >= 50)
        cache = self._cache(len(seeds))
        self._write_true(cache, frames_t, acts_t, c)
        gen = self._rollout(cache, acts_t[:, c:], c)
        p = psnr(gen, frozen[:, None])[keep]
        step_p = psnr(gen[:, 1:], gen[:, :-1])[keep]
        return {"mean_db_vs_frozen_truth": _mean(p), "last_frame_db": _mean(psnr(gen[:, -1], frozen)[keep]),
                "frame_to_frame_db": _mean(step_p), "mazes": int(keep.sum()), "frames": n}

    # -------------------------------------------------------------- all
    def run(self) -> dict:
        cfg = self.cfg
        t0 = time.time()
        seeds = list(range(cfg.mazes))
        frames, acts = render_trajectories(seeds, cfg.traj_len - 1, EVAL_POLICY_SEED, self.dev)
        res: dict = {"config": {**asdict(cfg), "sampler": asdict(cfg.sampler)}}
        one, pred, parts = {}, [], []
        for s in range(0, cfg.mazes, cfg.batch):
            r, p = self.one_step(frames[s:s + cfg.batch], acts[s:s + cfg.batch])
            parts.append(r)
            pred.append(p)
        w = [p["frames_changed"] for p in parts]
        one = {k: sum(p[k] * wi for p, wi in zip(parts, w)) / max(sum(w), 1)
               for k in ("model_db", "copy_db")}
        one.update(frames_changed=sum(w), frames=sum(p["frames"] for p in parts))
        pred_t = torch.cat(pred, 0)
        truth = frames[:, 1:]
        changed = psnr(truth, frames[:, :-1]) < 50
        mean_img = render_trajectories(list(range(ID_SEED0 + 50_000, ID_SEED0 + 50_064)), 47, 1, self.dev)[0]
        mean_img = mean_img.float().mean((0, 1)).round().to(torch.uint8)
        one["mean_image_db"] = _mean(psnr(mean_img.expand_as(truth), truth)[changed])
        res["one_step"] = one
        log.info("one-step: model %.2f dB, copy %.2f dB, mean image %.2f dB (%d changed frames) %.0fs",
                 one["model_db"], one["copy_db"], one["mean_image_db"], one["frames_changed"], time.time() - t0)
        ro = [self.rollouts(frames[s:s + cfg.batch], acts[s:s + cfg.batch]) for s in range(0, cfg.mazes, cfg.batch)]
        res["rollout"] = {h: {k: _mean(torch.tensor([r[h][k] for r in ro])) for k in ro[0][h]} for h in ro[0]}
        log.info("rollout: %s %.0fs", {h: (round(v["model_db"], 2), round(v["copy_db"], 2))
                                       for h, v in res["rollout"].items()}, time.time() - t0)
        af = [self.action_following(seeds[s:s + cfg.batch], frames[s:s + cfg.batch], acts[s:s + cfg.batch])
              for s in range(0, cfg.mazes, cfg.batch)]
        res["action_following"] = {k: {"closer_to_own": sum(a[k]["closer_to_own"] * a[k]["n"] for a in af)
                                        / max(sum(a[k]["n"] for a in af), 1), "n": sum(a[k]["n"] for a in af)}
                                   for k in af[0]}
        log.info("action following: %s %.0fs", res["action_following"], time.time() - t0)
        if cfg.id_steps > 0:
            res["inverse_dynamics"] = self.inverse_dynamics(frames, acts, pred_t)
            log.info("inverse dynamics: %s", res["inverse_dynamics"])
        nk = min(cfg.nokey_mazes, cfg.mazes)
        res["no_key"] = self.no_key(frames[:nk], acts[:nk])
        log.info("no key: %s %.0fs", res["no_key"], time.time() - t0)
        res["wall"] = self.wall(seeds[:min(cfg.wall_mazes, cfg.mazes)])
        log.info("wall: %s %.0fs", res["wall"], time.time() - t0)
        res["gates"] = gates(res)
        res["seconds"] = time.time() - t0
        return res


def gates(res: dict) -> dict:
    """The issue's targets, each True/False (None where not measured)."""
    one = res["one_step"]
    r4 = res["rollout"].get("4")
    af = res["action_following"]
    idd = res.get("inverse_dynamics")
    return {
        "one_step_copy_plus_1.5db": one["model_db"] >= one["copy_db"] + 1.5,
        "one_step_copy_plus_3db (aim)": one["model_db"] >= one["copy_db"] + 3.0,
        "rollout_4_no_worse_than_copy": None if r4 is None else r4["model_db"] >= r4["copy_db"],
        "turns_95pct": af["turn_j_vs_l"]["closer_to_own"] >= 0.95,
        "moves_90pct": af["move_w_vs_s"]["closer_to_own"] >= 0.90,
        "inverse_dynamics_90pct_of_real": None if idd is None else idd["ratio"] >= 0.90,
        "no_key_ge_35db": res["no_key"]["min_over_frames_of_mean_db"] >= 35.0,
        "wall_freezes_ge_30db": res["wall"]["mean_db_vs_frozen_truth"] >= 30.0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default=str(DEFAULT_WEIGHTS))
    ap.add_argument("--mazes", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--window", type=int, default=14)
    ap.add_argument("--nokey-frames", type=int, default=300)
    ap.add_argument("--id-steps", type=int, default=1500)
    ap.add_argument("--shift", type=float, default=1.0, help="noise schedule warp (SamplerConfig.shift)")
    ap.add_argument("--kv-from-last", action="store_true",
                    help="keep the last denoising pass's K/V as context (no clean pass; SamplerConfig)")
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                    help="auto: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--gelu", choices=["tanh", "erf"], default="tanh",
                    help="the MLPs' activation (MazeDiT.set_gelu): as trained, or the exact GELU the CPU serves in bf16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(
        args.dtype, torch.bfloat16 if dev.type == "cuda" else torch.float32)
    model = load_model(args.weights, dev, dtype)
    model.set_gelu(args.gelu)
    cfg = EvalConfig(mazes=args.mazes, window=args.window, nokey_frames=args.nokey_frames, id_steps=args.id_steps,
                     sampler=SamplerConfig(steps=args.steps, shift=args.shift, kv_from_last=args.kv_from_last))
    res = Evaluator(model, cfg, dev).run()
    res["command"] = "python -m models.world.maze.training.evaluate " + " ".join(argv if argv is not None else sys.argv[1:])
    res["device"] = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"
    res["torch"] = torch.__version__
    res["dtype"] = str(dtype)
    res["gelu"] = args.gelu
    text = json.dumps(res, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    print(json.dumps(res["gates"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
