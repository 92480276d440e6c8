"""Train the maze DiT: ``python -m models.world.maze.training.train --minutes N --out DIR [--resume CKPT]``.

Objective: flow matching in pixel space with independent per-frame noise levels
(diffusion forcing). A clip's frame i is ``x_t = (1 - t_i) x0 + t_i eps`` and the
model predicts ``x0``; the loss is the mean squared error of that estimate.
Noise levels lean towards pure noise, where sampling is hardest (``noise_plan``).
The sink (frame 0) and, in half the clips, a random prefix are *context*: noise
level 0 or a little noise (up to 0.1), so the model learns both the serving case
(clean cached frames) and not to trust context blindly (drift).
A quarter of the steps use a 4-frame attention window (the CPU serving config).
``--own-context P``: in a share P of the clips the context is the model's own
reconstruction instead of the truth (``own_context``: against drift in long
rollouts). ``--policy balanced`` renders data with more backing up and standing still.

Data: rendered on the training device by ``ClipStream`` (no CPU workers); a new
round of mazes replaces the oldest every ``--render-every`` steps.
Checkpoints (``DIR/ckpt.pt``: weights, EMA, optimiser, step, elapsed) every
``--ckpt-every`` seconds and at the end; ``DIR/maze.safetensors`` is the EMA
export (fp16) and ``DIR/train_log.json`` the log. ``--resume`` continues from a
checkpoint with a fresh cosine schedule over the new ``--minutes``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

import torch

from models.maze.training.scripted import POLICY_WEIGHTS
from models.world.maze.model import MazeDiT, MazeDiTConfig, param_count
from models.world.maze.rollout import to_model
from models.world.maze.training.data import ClipStream, render_trajectories
from models.world.maze.weights import load_model, save_weights

log = logging.getLogger("models.world.maze.training.train")

EVAL_SEED0 = 500_000       # held-out mazes for the in-training check (evaluate.py uses 0..)
SHORT_WINDOW = 4


def noise_plan(batch: int, frames: int, device: torch.device,
               gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-frame noise levels [batch, frames] in [0, 1] and the context mask [batch, frames].

    Target frames: 10% exactly 1 (pure noise, the first sampling step), 15%
    uniform, 75% logit-normal centred at sigmoid(0.4) ~ 0.6. Context: frame 0
    always, and a prefix of random length in half the clips; a context level is
    0 half the time, else uniform in [0, 0.1].
    """
    r = lambda *s: torch.rand(*s, device=device, generator=gen)  # noqa: E731
    u = r(batch, frames)
    ln = torch.sigmoid(torch.randn(batch, frames, device=device, generator=gen) + 0.4)
    t = torch.where(u < 0.10, torch.ones_like(u), torch.where(u < 0.25, r(batch, frames), ln))
    ctx = torch.where(r(batch, frames) < 0.5, torch.zeros_like(u), 0.1 * r(batch, frames))
    prefix_len = torch.randint(1, frames, (batch,), device=device, generator=gen)
    prefix_len = torch.where(r(batch) < 0.5, prefix_len, torch.ones_like(prefix_len))
    is_ctx = torch.arange(frames, device=device)[None] < prefix_len[:, None]
    return torch.where(is_ctx, ctx, t), is_ctx


def own_context(model: MazeDiT, x0: torch.Tensor, a: torch.Tensor, t: torch.Tensor, is_ctx: torch.Tensor,
                share: float, mask, gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Replace some clips' context frames with the model's own reconstructions (exposure bias).

    At serving every context frame after the sink was *generated*, with the
    model's own errors (mostly lost detail), and then cached as if clean. Training
    only on true context teaches the model to trust context it will never get; an
    error then compounds frame after frame (drift). Here, in a ``share`` of the
    clips, context frames 1.. become the model's x0 estimate from one no-grad pass
    at a noise level in [0.2, 0.8], cached at level 0 exactly as served, while the
    target frames after them stay true: the model learns to correct its own errors
    instead of copying them. Returns (x0 for the inputs, the frames to leave out of
    the loss: reconstructed context, whose true value the model could not know).
    """
    B, T = t.shape
    dev = x0.device
    pick = (torch.rand(B, device=dev, generator=gen) < share)[:, None] & is_ctx
    pick[:, 0] = False                     # the sink is the simulator's real frame at serving too
    if not bool(pick.any()):
        return x0, pick
    level = 0.2 + 0.6 * torch.rand(B, T, device=dev, generator=gen)
    level[:, 0] = 0.0
    tb = level[:, :, None, None, None]
    noisy = (1 - tb) * x0 + tb * torch.randn(x0.shape, device=dev, generator=gen)
    with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        recon = model.forward_clip(noisy, level, a, mask=mask).float().clamp(-1, 1)
    return torch.where(pick[:, :, None, None, None], recon, x0), pick


def lr_at(step: int, frac: float, peak: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from ``peak`` to 0.1*peak over the run's time."""
    return peak * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-frame PSNR of uint8 images [..., 64, 64, 3], capped at 50 dB (identical frames)."""
    mse = (a.float() - b.float()).pow(2).flatten(-3).mean(-1)
    return (10 * torch.log10(255.0 ** 2 / mse.clamp_min(1e-10))).clamp(max=50.0)


@torch.no_grad()
def quick_eval(model: MazeDiT, frames: torch.Tensor, acts: torch.Tensor, steps: int = 4) -> dict[str, float]:
    """One-step PSNR of the last frame with true (clean) context, 4 Euler steps, vs copy-last-frame."""
    from models.world.maze.rollout import timesteps, to_u8

    dev = frames.device
    x = to_model(frames)
    B, T = x.shape[:2]
    t = torch.zeros(B, T, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    cur = torch.randn(x[:, -1].shape, device=dev, generator=gen)
    ts = timesteps(steps)
    for i in range(steps):
        t[:, -1] = ts[i]
        inp = torch.cat([x[:, :-1], cur[:, None]], 1)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            x0 = model.forward_clip(inp, t, acts)[:, -1].float().clamp(-1, 1)
        cur = x0 + (ts[i + 1] / ts[i]) * (cur - x0)
    pred = to_u8(x0)
    truth, prev = frames[:, -1], frames[:, -2]
    changed = psnr(truth, prev) < 50
    pm, pc = psnr(pred, truth), psnr(prev, truth)
    return {"model_db": float(pm[changed].mean()), "copy_db": float(pc[changed].mean()), "n": int(changed.sum())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, required=True, help="training wall-clock budget (compile excluded)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--resume", default=None, help="DIR/ckpt.pt, or a DIR holding model.safetensors, "
                    "maze.safetensors and train_log.json")
    ap.add_argument("--bs", type=int, default=64)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--ema", type=float, default=0.999)
    ap.add_argument("--envs", type=int, default=4096, help="mazes per data round")
    ap.add_argument("--rounds", type=int, default=6, help="data rounds kept on the device")
    ap.add_argument("--traj-len", type=int, default=48)
    ap.add_argument("--render-every", type=int, default=50)
    ap.add_argument("--p-short", type=float, default=0.25, help="share of steps with the short window")
    ap.add_argument("--own-context", type=float, default=0.0,
                    help="share of clips whose context is the model's own reconstruction (own_context)")
    ap.add_argument("--policy", choices=sorted(POLICY_WEIGHTS), default="default",
                    help="key-combination mix of the scripted data policy")
    ap.add_argument("--p-still", type=float, default=0.0,
                    help="share of clips whose camera stops part-way (data.hold_still): standing still")
    ap.add_argument("--eval-every", type=float, default=90.0, help="seconds")
    ap.add_argument("--ckpt-every", type=float, default=150.0, help="seconds")
    ap.add_argument("--max-steps", type=int, default=10**9)
    ap.add_argument("--wall", type=float, default=None,
                    help="hard limit in seconds for the whole process: training stops 25 s before it")
    ap.add_argument("--ckpt-path", default=None, help="full checkpoint path (default DIR/ckpt.pt)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="a tiny model and data for a CPU smoke run")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t_start = time.time()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Handlers on this module's logger only, removed at the end: a run inside another
    # process (the tests) leaves its logging as it found it.
    handlers = [logging.StreamHandler(sys.stdout), logging.FileHandler(out / "train.log")]
    for h in handlers:
        h.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(h)
    log.setLevel(logging.INFO)
    try:
        return _train(args, argv, out, t_start)
    finally:
        for h in handlers:
            log.removeHandler(h)
            h.close()


def _resume(args: argparse.Namespace, model: MazeDiT, ema: MazeDiT, opt: torch.optim.Optimizer,
            dev: torch.device) -> tuple[int, float, list, list]:
    """Load ``--resume`` (a run's export folder or a full checkpoint) into the model, the EMA
    and, for a checkpoint, the optimiser; the step, trained seconds, history and evals so far."""
    step, trained_s, history, evals = 0, 0.0, [], []
    if args.resume and Path(args.resume).is_dir():
        # A run's small export (what comes back from a GPU machine): raw and EMA weights in
        # fp16 and the log; the optimiser starts afresh (its moments rebuild in the warm-up).
        rd = Path(args.resume)
        model.load_state_dict(load_model(rd / "model.safetensors", dev).state_dict())
        ema.load_state_dict(load_model(rd / "maze.safetensors", dev).state_dict())
        prev = json.loads((rd / "train_log.json").read_text())
        step, trained_s = prev["steps_total"], prev["trained_seconds_total"]
        history, evals = prev.get("history", []), prev.get("evals", [])
        log.info("resumed weights from %s at step %d (%.0f s trained), fresh optimiser", rd, step, trained_s)
    elif args.resume:
        ck = torch.load(args.resume, map_location=dev, weights_only=False)
        model.load_state_dict(ck["model"])
        ema.load_state_dict(ck["ema"])
        opt.load_state_dict(ck["opt"])
        step, trained_s = ck["step"], ck["trained_s"]
        history, evals = ck.get("history", []), ck.get("evals", [])
        log.info("resumed %s at step %d (%.0f s trained)", args.resume, step, trained_s)
    return step, trained_s, history, evals


def _eval_clips(cfg: MazeDiTConfig, n: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed held-out clips of ``quick_eval``: ``n`` trajectories past an 8-frame lead-in,
    the first action zeroed (no action leads into a clip's first frame)."""
    ev_f, ev_a = render_trajectories(list(range(EVAL_SEED0, EVAL_SEED0 + n)), cfg.clip_frames - 1 + 8,
                                     policy_seed=EVAL_SEED0, device=dev)
    ev_f, ev_a = ev_f[:, 8:], ev_a[:, 8:].clone()
    ev_a[:, 0] = 0
    return ev_f, ev_a


def _train(args: argparse.Namespace, argv: list[str] | None, out: Path, t_start: float) -> int:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(args.seed)
    gen = torch.Generator(device=dev).manual_seed(args.seed + 1)

    cfg = MazeDiTConfig(dim=64, depth=2, heads=1) if args.tiny else MazeDiTConfig()
    if args.tiny:
        args.envs, args.rounds, args.bs = 16, 1, 2
    model = MazeDiT(cfg).to(dev)
    ema = MazeDiT(cfg).to(dev)
    ema.load_state_dict(model.state_dict())
    ema.requires_grad_(False).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01, fused=cuda)
    step, trained_s, history, evals = _resume(args, model, ema, opt, dev)
    start_step = step
    log.info("device %s torch %s params %.2fM cfg %s bs %d", torch.cuda.get_device_name(0) if cuda else "cpu",
             torch.__version__, param_count(model) / 1e6, cfg.to_dict(), args.bs)

    t0 = time.time()
    stream = ClipStream(dev, envs=args.envs, traj_len=args.traj_len, rounds=args.rounds,
                        seed0=1_000_000 + 10_000_000 * (start_step > 0) + step * 7,
                        policy_weights=POLICY_WEIGHTS[args.policy], p_still=args.p_still)
    stream.fill()
    ev_f, ev_a = _eval_clips(cfg, 8 if args.tiny else 128, dev)
    log.info("data ready in %.1fs: %d trajectories x %d frames on %s", time.time() - t0, stream.filled,
             args.traj_len, dev)

    use_flex = cuda and not args.no_compile
    model.flex = use_flex
    masks = {w: model.clip_mask(cfg.clip_frames, dev, w) for w in (None, SHORT_WINDOW)}

    def loss_fn(x_in: torch.Tensor, x0: torch.Tensor, a: torch.Tensor, t: torch.Tensor, eps: torch.Tensor,
                skip: torch.Tensor, mask) -> torch.Tensor:
        tb = t[:, :, None, None, None]
        xt = (1 - tb) * x_in + tb * eps
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            pred = model.forward_clip(xt, t, a, mask=mask)
        err = (pred.float() - x0).pow(2).mean((2, 3, 4))      # [B, T]
        keep = (~skip).float()
        return (err * keep).sum() / keep.sum()

    if use_flex:
        # Per block, as the probe did: one small graph compiles fast and all 8 blocks share it.
        for blk in model.blocks:
            blk.compile()
    step_fn = loss_fn
    params, ema_params = list(model.parameters()), list(ema.parameters())

    def train_step(lr: float, window) -> tuple[torch.Tensor, torch.Tensor]:
        f, a = stream.sample(args.bs, gen)
        x0 = to_model(f)
        t, is_ctx = noise_plan(args.bs, cfg.clip_frames, dev, gen)
        x_in, skip = x0, torch.zeros_like(is_ctx)
        if args.own_context > 0:
            x_in, skip = own_context(model, x0, a, t, is_ctx, args.own_context, masks[window], gen)
        eps = torch.randn(x0.shape, device=dev, generator=gen)
        loss = step_fn(x_in, x0, a, t, eps, skip, masks[window])
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.detach(), gn

    tc = time.time()
    try:
        for w in (None, SHORT_WINDOW):  # compile both graphs before the clock starts (lr 0: no change)
            train_step(0.0, w)
        if cuda:
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - any compile failure falls back to eager SDPA
        log.warning("compiled flex step failed (%s: %s); eager SDPA instead", type(e).__name__, str(e)[:300])
        model.flex = False
        masks = {w: model.clip_mask(cfg.clip_frames, dev, w) for w in (None, SHORT_WINDOW)}
        for blk in model.blocks:
            blk._compiled_call_impl = None  # back to eager
        train_step(0.0, None)
    if step == 0 or not opt.state_dict()["state"] or (args.resume and Path(args.resume).is_dir()):
        opt.state.clear()  # warm-up steps at lr 0 must not leave Adam moments behind
    compile_s = time.time() - tc
    log.info("compile/warm-up %.1fs (flex=%s)", compile_s, model.flex)

    def summary(final: bool) -> dict:
        run_s = time.time() - ts0
        return {
            "final": final,
            "command": " ".join(["python -m models.world.maze.training.train"] + (argv if argv is not None else sys.argv[1:])),
            "device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
            "params": param_count(model), "config": cfg.to_dict(), "args": vars(args),
            "steps_total": step, "steps_this_run": step - start_step, "run_seconds": run_s,
            "trained_seconds_total": trained_s + run_s, "compile_seconds": compile_s, "flex": model.flex,
            "steps_per_s": (step - start_step) / run_s, "clips_per_s": (step - start_step) * args.bs / run_s,
            "frames_rendered_this_run": stream.frames_rendered,
            "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
            "history": history, "evals": evals,
        }

    def save(final: bool) -> None:
        ck = {"model": model.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(), "step": step,
              "trained_s": trained_s + (time.time() - ts0), "history": history, "evals": evals,
              "cfg": cfg.to_dict(), "args": vars(args)}
        ckpt = Path(args.ckpt_path) if args.ckpt_path else out / "ckpt.pt"
        torch.save(ck, str(ckpt) + ".tmp")
        os.replace(str(ckpt) + ".tmp", ckpt)
        # The small export travels back from a GPU machine (files <= 16 MiB) and resumes too.
        save_weights(ema, out / "maze.safetensors", extra={"steps": step, "trained_s": ck["trained_s"]})
        save_weights(model, out / "model.safetensors", extra={"steps": step, "raw": True})
        (out / "train_log.json").write_text(json.dumps(summary(final), indent=1))

    budget = args.minutes * 60.0
    if args.wall is not None:
        budget = max(0.0, min(budget, args.wall - (time.time() - t_start) - 25.0))
    ts0 = time.time()
    last_log = last_eval = last_ckpt = ts0
    loss_avg, log_step = None, step
    while True:
        el = time.time() - ts0
        if el >= budget or step - start_step >= args.max_steps:
            break
        lr = lr_at(step - start_step, el / budget, args.lr, args.warmup if start_step == 0 else 50)
        window = SHORT_WINDOW if torch.rand((), generator=None).item() < args.p_short else None
        loss, gn = train_step(lr, window)
        step += 1
        torch._foreach_lerp_(ema_params, params, 1 - min(args.ema, (1 + step) / (10 + step)))
        if step % args.render_every == 0:
            stream.render_round()
        now = time.time()
        if now - last_log >= 10 or step == start_step + 1:
            lv = float(loss)
            loss_avg = lv if loss_avg is None else 0.7 * loss_avg + 0.3 * lv
            sps = (step - log_step) / max(now - last_log, 1e-9)
            bar = "#" * int(20 * el / budget)
            log.info("[%-20s] step %d loss %.4f (avg %.4f) gnorm %.2f lr %.2e %.1f steps/s %.0fs/%.0fs",
                     bar, step, lv, loss_avg, float(gn), lr, sps, el, budget)
            history.append({"step": step, "t": round(trained_s + el, 1), "loss": lv, "loss_avg": loss_avg,
                             "steps_per_s": sps, "lr": lr})
            last_log, log_step = now, step
        if now - last_eval >= args.eval_every:
            r = quick_eval(ema, ev_f, ev_a)
            r.update(step=step, t=round(trained_s + el, 1))
            evals.append(r)
            log.info("eval step %d: one-step PSNR %.2f dB (EMA, 4 steps) vs copy %.2f dB on %d changed frames",
                     step, r["model_db"], r["copy_db"], r["n"])
            last_eval = time.time()
        if now - last_ckpt >= args.ckpt_every:
            save(final=False)
            last_ckpt = time.time()
    r = quick_eval(ema, ev_f, ev_a)
    r.update(step=step, t=round(trained_s + time.time() - ts0, 1))
    evals.append(r)
    log.info("final eval step %d: %.2f dB vs copy %.2f dB", step, r["model_db"], r["copy_db"])
    save(final=True)
    log.info("done: %d steps (%d this run) in %.0fs, %.1f steps/s", step, step - start_step, time.time() - ts0,
             (step - start_step) / (time.time() - ts0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
