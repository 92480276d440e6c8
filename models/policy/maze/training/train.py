"""Train the maze policy: ``python -m models.policy.maze.training.train --minutes N --out DIR [--resume CKPT]``.

Imitation of a teacher with DAgger-style relabelling, all on the training device. The
teacher (``--teacher``) is the planner (``models/maze/planner.py``, the true map) or
the scanner (``models/maze/scanner.py``: only what the robot has seen). The
defaults are the shipped weights' recipe (run 8: ``map`` state, scanner, prompt FiLM;
``--minutes 7.7 --workers 12`` on the H200, MODEL_CARD.md):

* ``--envs`` goal episodes (half wall, half marker; seeds from ``TRAIN_SEED0``
  upwards, never the evaluation's) run in one batched ``MazeSim``.
* Every ``EXECUTE`` frames each running episode is observed (camera, state,
  prompt in one of four phrasings) and *labelled* with the planner's next
  ``HORIZON`` frames of keys from that exact pose (the planner is run on a copy
  of the state and the state restored).
* The chunk executed is the planner's with probability ``beta``, else the
  policy's own sample (10 Euler steps). ``beta`` is 1 for the first
  ``--expert-share`` of the run and then falls linearly to ``--beta-min``: the
  policy's own mistakes (the states it drifts into) are labelled with the way
  back, which is what keeps errors from compounding.
* Samples go into a ring buffer on the device; each collection step is
  followed by ``--updates`` gradient steps on random batches.

Loss: flow matching, pi0's convention: x_t = t * noise + (1 - t) * a with a the
key bits scaled to -1 / +1, the model predicts the velocity noise - a, t drawn
from a logit-normal. With ``--target-aux W``, plus W times the squared error of a
guess, from the image and state tokens, of where the prompt's target is (``target_of``:
its bearing from the heading and its distance, the simulator's truth; a training
signal only, the head is not saved). ``--prompt-state``: the memory state's MLP reads
the prompt too (which of the panorama's colours is the target's).

Checkpoints ``DIR/ckpt.pt`` (weights, optimiser, step, elapsed) every ``--ckpt-every``
seconds and at the end; ``--resume`` continues one (same ``--minutes`` budget: elapsed
time counts). ``DIR/maze_policy.safetensors`` is the fp16 export and
``DIR/train_log.json`` the log.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import os
import random
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from models.maze.goals import COLOUR_NAMES, GOAL_KINDS, PROMPTS, GoalEpisode, make_goals
from models.maze.planner import Planner, distance_field, goal_seeds
from models.maze.scanner import Scanner
from models.maze.sim import make_maze
from models.policy.flow import prompt_buckets
from models.policy.maze.episodes import Episodes
from models.policy.maze.model import (EXECUTE, HORIZON, LAYOUT, STATE_LAYOUTS, TARGET_AUX, MazeFlowModel, config,
                                      save_policy)

log = logging.getLogger("models.policy.maze.training.train")

TRAIN_SEED0 = 2_000_000   # training mazes; evaluation uses EVAL_SEED0 (evaluate.py)
TEACHERS = ("planner", "scanner")
CHUNK = 256               # mazes per worker task; a chunk's seeds start 2 * CHUNK after the last's
Made = tuple[list[int], list[GoalEpisode], list[list[list[int]]]]


def make_chunk(seed0: int, count: int, kinds: list[str]) -> Made:
    """Seeds, goal episodes and planner distance fields of ``count`` mazes from ``seed0`` (pure Python)."""
    seeds = goal_seeds(seed0, count)
    goals, fields = [], []
    for s, k in zip(seeds, kinds):
        grid, start, _ = make_maze(s)
        ep = make_goals(s, k, grid, start)
        goals.append(ep)
        fields.append(distance_field(grid, ep))
    return seeds, goals, fields


class Rounds:
    """Each round's mazes, made ahead by ``workers`` processes (0: in this one, when asked).

    Maze generation, goal placement and the planner's BFS are pure Python, a few ms a
    maze: for thousands of mazes a round that is seconds of one core, which the first
    run spent with the GPU idle between rounds. The workers make round r + 1 while
    round r trains. Which seeds a round gets does not depend on ``workers``::

        round r, chunk i:  goal_seeds(TRAIN_SEED0 + r * 2 * envs + i * 2 * CHUNK, CHUNK)
    """

    def __init__(self, envs: int, workers: int) -> None:
        self.envs = envs
        self.kinds = [GOAL_KINDS[i % len(GOAL_KINDS)] for i in range(envs)]
        # Fork before this process touches CUDA (the caller makes Rounds first); the
        # workers never do. Spawn where fork does not exist.
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        self.pool = ProcessPoolExecutor(workers, mp_context=ctx) if workers > 0 else None
        self.pending: dict[int, list[Future]] = {}

    def _chunks(self, r: int) -> list[tuple[int, int, list[str]]]:
        base = TRAIN_SEED0 + r * 2 * self.envs
        return [(base + i * 2 * CHUNK, min(CHUNK, self.envs - lo), self.kinds[lo:lo + CHUNK])
                for i, lo in enumerate(range(0, self.envs, CHUNK))]

    def prefetch(self, r: int) -> None:
        if self.pool is not None and r not in self.pending:
            self.pending[r] = [self.pool.submit(make_chunk, *c) for c in self._chunks(r)]

    def get(self, r: int) -> Made:
        """Round ``r``'s mazes (and round r + 1 set going)."""
        self.prefetch(r)
        self.prefetch(r + 1)
        parts = [f.result() for f in self.pending.pop(r)] if self.pool is not None else \
            [make_chunk(*c) for c in self._chunks(r)]
        return ([s for p in parts for s in p[0]], [g for p in parts for g in p[1]],
                [f for p in parts for f in p[2]])

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


class PromptTable:
    """Every prompt phrasing, its hashed bucket ids kept padded on the device."""

    def __init__(self, device: torch.device) -> None:
        self.texts = [form.format(c=c) for k in GOAL_KINDS for form in PROMPTS[k] for c in COLOUR_NAMES]
        self.index = {t: i for i, t in enumerate(self.texts)}
        ids = [prompt_buckets(t) for t in self.texts]
        width = max(len(i) for i in ids)
        pad = np.zeros((len(ids), width), np.int64)
        for i, row in enumerate(ids):
            pad[i, :len(row)] = row
        self.ids = torch.from_numpy(pad).to(device)
        self.lengths = torch.tensor([len(i) for i in ids], device=device)
        self._cols = torch.arange(width, device=device)

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``EmbeddingBag`` inputs (flat ids, offsets) for prompt indices [B]."""
        lengths = self.lengths[idx]
        mask = self._cols[None] < lengths[:, None]
        flat = self.ids[idx][mask]
        offsets = torch.cumsum(lengths, 0) - lengths
        return flat, offsets


class Buffer:
    """A ring of (camera, state, prompt, expert chunk, where the target is) on the device."""

    def __init__(self, size: int, state_dim: int, device: torch.device) -> None:
        self.size, self.n, self.head = size, 0, 0
        self.images = torch.zeros(size, 64, 64, 3, dtype=torch.uint8, device=device)
        self.state = torch.zeros(size, state_dim, device=device)
        self.prompt = torch.zeros(size, dtype=torch.int64, device=device)
        self.actions = torch.zeros(size, HORIZON, 8, dtype=torch.bool, device=device)
        self.target = torch.zeros(size, TARGET_AUX, device=device)

    def add(self, images: torch.Tensor, state: torch.Tensor, prompt: torch.Tensor, actions: torch.Tensor,
            target: torch.Tensor | None = None) -> None:
        """``target``: ``target_of``'s rows, for ``--target-aux`` (None: not trained, not stored)."""
        k = images.shape[0]
        idx = (self.head + torch.arange(k, device=images.device)) % self.size
        self.images[idx], self.state[idx], self.prompt[idx] = images, state, prompt
        if target is not None:
            self.target[idx] = target
        self.actions[idx] = actions > 0.5
        self.head = (self.head + k) % self.size
        self.n = min(self.size, self.n + k)

    def sample(self, batch: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        idx = torch.randint(0, self.n, (batch,), device=self.images.device, generator=gen)
        return (self.images[idx], self.state[idx], self.prompt[idx], self.actions[idx].float() * 2 - 1,
                self.target[idx])


def target_of(ep: Episodes) -> torch.Tensor:
    """[B, TARGET_AUX]: where each robot's target is, from the simulator's truth (a training signal
    only, ``--target-aux``): cos / sin of its bearing from the heading, and its distance / 8 (at most 1)."""
    bearing, distance = ep.sim.target_bearing()
    return torch.stack([torch.cos(bearing), torch.sin(bearing), (distance / 8).clamp(max=1.0)], 1)


def expert_chunk(ep: Episodes, planner: Planner | Scanner) -> torch.Tensor:
    """[B, HORIZON, 8]: the teacher's next frames of keys from the current poses (state restored)."""
    saved = ep.sim.state()
    keys = []
    for _ in range(HORIZON):
        k = planner.keys()
        keys.append(k)
        ep.sim.step(k)
    ep.sim.set_state(saved)
    return torch.stack(keys, 1)


@torch.no_grad()
def sample_chunk(model: MazeFlowModel, images: torch.Tensor, state: torch.Tensor, ids: torch.Tensor,
                 offsets: torch.Tensor, steps: int, gen: torch.Generator | None = None) -> torch.Tensor:
    """The policy's key bits [B, HORIZON, 8] (0/1) for a batch of observations."""
    kvs = model.encode(images[:, None], state, ids, offsets)
    noise = torch.randn(images.shape[0], model.cfg.action_horizon, model.cfg.action_dim, device=images.device,
                        generator=gen)
    return (model.sample(noise, kvs, steps) > 0).float()


def flow_loss(model: MazeFlowModel, images: torch.Tensor, state: torch.Tensor, ids: torch.Tensor,
              offsets: torch.Tensor, actions: torch.Tensor, gen: torch.Generator,
              target: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The flow-matching loss, and with ``target`` (and the model's ``target_aux`` head) the
    target guess's squared error beside it."""
    cond = model.condition(images[:, None], state, ids, offsets)
    kvs = model.kv_of(cond)
    b, dev = actions.shape[0], actions.device
    t = torch.sigmoid(torch.randn(b, device=dev, generator=gen))
    noise = torch.randn(actions.shape, device=dev, generator=gen)
    x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * actions
    v = model.velocity(x_t, t, kvs)
    aux = None if target is None else (model.target_guess(cond) - target).square().mean()
    return (v - (noise - actions)).square().mean(), aux


def beta_at(progress: float, expert_share: float, beta_min: float, end: float = 0.8) -> float:
    """Share of chunks the planner drives: 1 until ``expert_share``, then linear to ``beta_min`` at ``end``."""
    if progress <= expert_share:
        return 1.0
    return max(beta_min, 1.0 - (1.0 - beta_min) * (progress - expert_share) / max(end - expert_share, 1e-6))


def bar(progress: float, width: int = 30) -> str:
    k = int(round(progress * width))
    return "[" + "#" * k + "." * (width - k) + f"] {100 * progress:5.1f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, required=True, help="training wall-clock budget")
    ap.add_argument("--out", required=True)
    ap.add_argument("--resume", default=None, help="DIR/ckpt.pt to continue")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--envs", type=int, default=4096)
    ap.add_argument("--buffer", type=int, default=600_000)
    ap.add_argument("--bs", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--updates", type=int, default=4, help="gradient steps per collection step")
    ap.add_argument("--expert-share", type=float, default=0.2)
    ap.add_argument("--beta-min", type=float, default=0.1)
    ap.add_argument("--beta-end", type=float, default=0.7, help="share of the run at which beta reaches --beta-min")
    ap.add_argument("--teacher", choices=TEACHERS, default="scanner",
                    help="whose keys label the chunks: the planner (the true map) or the scanner, which knows "
                         "only what the robot has seen (models/maze/scanner.py)")
    ap.add_argument("--prompt-film", action=argparse.BooleanOptionalAction, default=True,
                    help="the prompt conditions the image stem (model.py's prompt_film)")
    ap.add_argument("--state", choices=sorted(STATE_LAYOUTS), default=LAYOUT,
                    help="state layout (model.py): map (the maze as seen), memory (odometry + visit counts) or the reactive keys")
    ap.add_argument("--prompt-state", action="store_true",
                    help="the memory state's MLP reads the prompt's embedding too (model.py's prompt_state)")
    ap.add_argument("--target-aux", type=float, default=0.0, metavar="WEIGHT",
                    help="weight of an auxiliary loss: guess from the image and state tokens where the named target is "
                         "(bearing, distance; the simulator's truth, training only). 0: off")
    ap.add_argument("--max-steps", type=int, default=10**9, help="a step budget beside --minutes (the first ends the run)")
    ap.add_argument("--ckpt-every", type=float, default=60.0)
    ap.add_argument("--log-every", type=float, default=10.0)
    ap.add_argument("--tiny", action="store_true", help="a tiny model and data for a CPU smoke run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=None,
                    help="processes making mazes ahead (default: CPUs - 2 with CUDA, 0 = inline on CPU)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(args.device)
    ck = torch.load(args.resume, map_location="cpu", weights_only=False) if args.resume else None
    rounds = ck["rounds"] if ck else 0
    workers = args.workers if args.workers is not None else (max(1, min(12, (os.cpu_count() or 1) - 2))
                                                              if dev.type == "cuda" else 0)
    maker = Rounds(args.envs, workers)
    maker.prefetch(rounds)        # forks the workers now, before CUDA is initialised
    maker.prefetch(rounds + 1)
    torch.manual_seed(args.seed)
    torch.set_float32_matmul_precision("high")  # TF32 on the GPU: a small model, launch-bound anyway
    cfg = config(args.state, d_model=32, num_heads=2, num_layers=1) if args.tiny else config(args.state)
    model = MazeFlowModel(cfg, prompt_film=args.prompt_film, target_aux=args.target_aux > 0,
                          prompt_state=args.prompt_state).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    step, elapsed, episodes_done = 0, 0.0, 0
    history: list[dict] = []
    if ck:
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, elapsed, rounds, history = ck["step"], ck["elapsed"], ck["rounds"], ck["log"]
        log.info("resumed %s at step %d, %.0f s", args.resume, step, elapsed)
    params = sum(p.numel() for p in model.parameters())
    log.info("maze policy: %.2fM parameters, device %s, %d envs, state %s, %d maze workers", params / 1e6, dev,
             args.envs, args.state, workers)

    gen = torch.Generator(device=dev).manual_seed(args.seed + step)
    prompts = PromptTable(dev)
    buf = Buffer(args.buffer, cfg.state_dim, dev)
    budget_s = args.minutes * 60.0

    def run_progress(elapsed_s: float, steps: int) -> float:
        # The run ends at whichever budget comes first; the schedules (beta, lr) follow the
        # same share, so a --max-steps run (the CPU comparisons: equal steps whatever the
        # machine's load) anneals like a timed one.
        return max(elapsed_s / budget_s, steps / args.max_steps)
    t0 = time.perf_counter() - elapsed
    last_log = last_ckpt = time.perf_counter()
    loss_ema = aux_ema = float("nan")
    samples = 0
    stats = {"success": 0, "episodes": 0}

    def save_ckpt() -> None:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "elapsed": time.perf_counter() - t0, "rounds": rounds, "log": history}, out / "ckpt.pt")

    while step < args.max_steps:
        progress = run_progress(time.perf_counter() - t0, step)
        if progress >= 1.0:
            break
        rng = random.Random(f"{args.seed}:{rounds}")
        seeds, goals, fields = maker.get(rounds)
        ep = Episodes(seeds, maker.kinds, dev, layout=args.state, goals=goals)
        teacher: Planner | Scanner = Scanner(ep.sim) if args.teacher == "scanner" else Planner(ep.sim, fields)
        assert ep.sim.goals is not None
        pidx = torch.tensor([prompts.index[g.prompt(rng.randrange(4))] for g in ep.sim.goals], device=dev)
        rounds += 1
        model.eval()
        while not ep.all_done and step < args.max_steps:
            live = ~ep.done
            images, state = ep.observe()
            # (The scanner has looked from this pose already: at its start or after the last frame.)
            label = expert_chunk(ep, teacher)
            buf.add(images[live], state[live], pidx[live], label[live],
                    target_of(ep)[live] if args.target_aux > 0 else None)
            samples += int(live.sum())
            # Per collection step, not per round: a round of slow episodes can be a fifth of a small run.
            beta = beta_at(progress, args.expert_share, args.beta_min, args.beta_end)
            use_expert = torch.rand(args.envs, device=dev, generator=gen) < beta
            chunk = label
            if beta < 1.0:
                ids, offs = prompts.batch(pidx)
                mine = sample_chunk(model, images, state, ids, offs, cfg.num_inference_steps, gen)
                chunk = torch.where(use_expert[:, None, None], label, mine)
            if isinstance(teacher, Scanner):
                # The scanner looks when the robot's map does, after every frame; its look-ahead
                # (expert_chunk) keeps the map as seen.
                for t in range(EXECUTE):
                    ep.step(chunk[:, t])
                    teacher.look()
            else:
                ep.execute(chunk[:, :EXECUTE])
            model.train()
            for _ in range(args.updates):
                im, st, pi, act, tgt = buf.sample(args.bs, gen)
                ids, offs = prompts.batch(pi)
                lr = args.lr * min(1.0, (step + 1) / 300) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
                for g in opt.param_groups:
                    g["lr"] = lr
                loss, aux = flow_loss(model, im, st, ids, offs, act, gen, tgt if args.target_aux > 0 else None)
                opt.zero_grad(set_to_none=True)
                (loss if aux is None else loss + args.target_aux * aux).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                step += 1
                lv = float(loss.detach())
                loss_ema = lv if math.isnan(loss_ema) else 0.98 * loss_ema + 0.02 * lv
                if aux is not None:
                    av = float(aux.detach())
                    aux_ema = av if math.isnan(aux_ema) else 0.98 * aux_ema + 0.02 * av
            model.eval()
            now = time.perf_counter()
            progress = run_progress(now - t0, step)
            if now - last_log >= args.log_every:
                last_log = now
                # Episodes end in batches (a round's); between them there is no success rate to show.
                rate = stats["success"] / stats["episodes"] if stats["episodes"] else None
                log.info("%s step %d loss %.4f%s beta %.2f samples %d train-success %s",
                         bar(min(progress, 1.0)), step, loss_ema,
                         "" if math.isnan(aux_ema) else f" target {aux_ema:.4f}", beta, samples,
                         "-" if rate is None else f"{rate:.3f}")
                history.append({"step": step, "elapsed_s": round(now - t0, 1), "loss": round(loss_ema, 5),
                                "target_loss": None if math.isnan(aux_ema) else round(aux_ema, 5),
                                "beta": round(beta, 3), "samples": samples,
                                "train_success": None if rate is None else round(rate, 4)})
            if now - last_ckpt >= args.ckpt_every:
                last_ckpt = now
                save_ckpt()
            if progress >= 1.0:
                break
        stats["success"] += int(ep.success.sum())
        stats["episodes"] += int(ep.done.sum())
        episodes_done += int(ep.done.sum())
        if rounds % 4 == 0:
            stats = {"success": 0, "episodes": 0}
    maker.close()
    save_ckpt()
    elapsed = time.perf_counter() - t0
    info = {"steps": step, "train_seconds": round(elapsed, 1), "samples": samples, "rounds": rounds,
            "envs": args.envs, "state_layout": args.state, "teacher": args.teacher, "prompt_film": args.prompt_film,
            "target_aux": args.target_aux, "prompt_state": args.prompt_state, "maze_workers": workers,
            "parameters": params, "argv": sys.argv[1:] if argv is None else argv}
    save_policy(model, out / "maze_policy.safetensors", info)
    (out / "train_log.json").write_text(json.dumps({**info, "log": history}, indent=1))
    log.info("done: %d steps in %.0f s, %d samples -> %s", step, elapsed, samples, out / "maze_policy.safetensors")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
