"""DreamZero-DROID as a stateful robot policy (the seam of ``models/policy/base.py``).

Each robot's session (the id the OpenPI endpoint passes: the robot's ``session_id``, or its
connection's) keeps what upstream's server keeps for its one robot: the window position
(``window.plan_call``), both CFG branches' self-attention K/V in kv/'s paged pool, the
window's cross K/V and I2V condition as model-owned state (``cache.SessionState``), and the
last frames sent. One engine call (a batch of robots' calls)::

    check each observation (observation.validate_observation)   a bad one names its field; nothing changes
    admit new sessions (busy when neither the device nor the host swap budget holds one more)
    make the call's sessions resident (kv Residency: idle ones swap to the host, LRU)
    stitch the cameras, normalise the state
    restarting sessions (first call, new prompt, window full), one kv batch (restart, 1 frame):
        CLIP + y of each one's newest frame, text K/V of its prompt and of the negative prompt
        one t = 0 pass writes each one's first latent frame
    continuing sessions, one kv batch (2 frames), whatever their window positions:
        VAE-encode each one's last 4 frames; one t = 0 pass writes their 2 latent frames
    denoise every session's next 2 latent frames and 24 actions in one forward a step
        (16 UniPC steps, or the DiT on 8 with step_cache; CFG on video only)
    unnormalise each conditional branch's actions -> float32 [24, 8]

Robots start episodes at different times, so their window positions differ. The denoising
forward does not need them equal: its rows are sessions x 2 branches, each row with its own
RoPE frame offset (``DreamZeroDiT.forward``'s ``start_frame`` a row), its own slice of its
``y``, its own cross K/V, and its own pages (kv/'s attention takes a different page count a
row; ``cache.PagedRows`` attends the restarting and the continuing batch's rows apart). So N
robots cost 16 forwards of 2N rows a call (8 with the step cache), not 16N of 2, plus one or
two t = 0 passes. The t = 0 pass stays one per kv batch, since merging does not pay: a
restart writes 1 frame and a chunk 2, so one pass would pad each restarting row with a
frame of tokens (FLOPs for nothing), and kv/ keeps one chunk length a batch. Split, the two
passes do the FLOPs one would; a call holding both kinds pays one more read of the weights
(about 7 ms at 14B) beside its 16 (or 8) shared forwards. A session's chunks in any batch
equal its chunks alone up to float32 rounding (the matrix kernels of other row counts).

Noise is upstream's: the same seeded draw (seed 1140) every chunk, here one draw made at
start on the CPU generator and shared by every session (upstream draws on the GPU's, whose
values differ), so a session's chunks do not depend on which sessions share its forward.

Commit only what is final: a call is one kv tick. Its chunk (and, on a restart, its new
``SessionState``) is kept only when the engine commits the tick (``end_tick``); a failed or
re-run batch aborts it, and a restart's old pages and state come back with it.

Capacity (``kv.capacity``): the pool is planned from ``cache.kv_geometry`` (two branches,
sink 1 + window 6 frames, a tick of 2 frames, the state as ``model_state_bytes``) and the
budget (``kv_budget_bytes``, or a fraction of the device's free memory on CUDA; on CPU
``sessions``). A new session is admitted when it fits beside the others (``Residency.refusal``),
or once the least recently used episode that no connection holds is reclaimed (``detach``: its
robot went away; the room goes to robots that are here). Otherwise its call fails with
``busy: ...``, naming what a session needs and what is free; no held episode is ever dropped for
it. Residency drops a swapped session only if the host budget shrank under it. A dropped or
reclaimed session is reported and refused until it is reset or released (no silent restart).

Over two or more ranks (``split``; ``realtime serve --sequence-parallel N``, every rank builds
this policy and runs rank 0's calls, realtime/engine/mirror.py): Ulysses splits each forward's
tokens and attention heads over the ranks (``models/world/parallel/ulysses.py``; each rank's
pool and state hold its heads), or, on two ranks, a CFG split runs the conditional branch on
rank 0 and the negative one on rank 1 (``models/world/parallel/cfg.py``; each rank's pool and
state hold its branch). Either way every rank computes the same actions from the same calls,
the pool is planned for one rank's bytes, and the ranks keep the smallest session count any
of them planned.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch

from kv import PagedKVCache, Residency, kv_budget, plan_capacity, session_bytes
from models.base import ModelError
from models.policy.base import PolicyAdapter, PolicyWork
from models.policy.dreamzero.cache import BRANCHES, PagedRows, SessionState, cross_rows, kv_geometry
from models.policy.dreamzero.checkpoint import Checkpoint, CheckpointError
from models.policy.dreamzero.conditioning import (HISTORY, FirstFrame, first_frame_condition, frame_size,
                                                  frames_for_call, observed_latents)
from models.policy.dreamzero.config import VAE_SPATIAL_STRIDE
from models.policy.dreamzero.denoise import Branch, denoise_chunk, write_frames
from models.policy.dreamzero.observation import (ACTION_DIM, ACTION_HORIZON, MAX_STATE_DIM, METADATA,
                                                 DroidObservation, Normalizer, policy_metadata, prompt_text,
                                                 stitch_cameras, validate_observation)
from models.policy.dreamzero.options import DEFAULT_HOST_GIB, DEFAULT_SESSIONS
from models.policy.dreamzero.scheduler import DIT_STEPS_8
from models.policy.dreamzero.text_encoder import NEGATIVE_PROMPT, clean_prompt, encode_prompts
from models.policy.dreamzero.window import CallPlan, plan_call
from models.world.parallel.cfg import CfgSplit
from models.world.parallel.ulysses import Ulysses

log = logging.getLogger(__name__)

# Upstream's generate_noise seed, reused for every chunk.
SEED = 1140
# Evicted session ids remembered (refused until reset); past it the oldest are forgotten,
# and a forgotten one simply starts over.
EVICTED_MEMORY = 1024
EVICTED_REASON = "policy state evicted: device and host memory for sessions are full"
RECLAIMED_REASON = "policy state reclaimed for a new session: no robot held it and memory for sessions was full"
# The first word of a refusal for want of room (world.v1's error code for the same).
BUSY = "busy"


@dataclass(frozen=True)
class _Session:
    """What one robot's episode holds between calls besides its K/V and ``SessionState``."""

    prompt: str                                   # the text the window's K/V were built with
    start: int                                    # the window position of the next call
    history: tuple[np.ndarray, ...] = field(repr=False)   # the last HISTORY stitched frames


@dataclass(frozen=True)
class _Staged:
    """A call's outcome, kept if the engine commits its tick."""

    session: _Session
    state: SessionState | None = field(repr=False)   # a restart's new state; None: unchanged


@dataclass
class _Call:
    """One work of a batch, checked and planned."""

    work: PolicyWork
    obs: DroidObservation
    prompt: str
    history: tuple[np.ndarray, ...]
    frames: list[np.ndarray]
    plan: CallPlan
    state: torch.Tensor                            # [1, 1, max_state_dim]
    old: _Session | None


class DreamZeroPolicy(PolicyAdapter):
    """A loaded ``Checkpoint`` and its tokenizer served as a policy; see the module docstring."""

    def __init__(self, ckpt: Checkpoint, tokenizer: Any, *, sessions: int = DEFAULT_SESSIONS,
                 step_cache: bool = False, max_batch: int | None = None, name: str = "dreamzero",
                 kv_budget_bytes: int | None = None, gpu_memory_fraction: float = 0.9,
                 host_budget_bytes: int = int(DEFAULT_HOST_GIB * (1 << 30)),
                 split: Ulysses | CfgSplit | None = None) -> None:
        cfg = ckpt.config
        if cfg.action_horizon != ACTION_HORIZON or cfg.action_dim < ACTION_DIM or cfg.max_state_dim != MAX_STATE_DIM:
            raise CheckpointError(f"{ckpt.root}: DROID serving needs action_horizon {ACTION_HORIZON}, action_dim >= "
                                  f"{ACTION_DIM} and max_state_dim {MAX_STATE_DIM}; the config has "
                                  f"{cfg.action_horizon}, {cfg.action_dim}, {cfg.max_state_dim}")
        if sessions < 1:
            raise ValueError(f"sessions must be >= 1, got {sessions}")
        self.ckpt, self.cfg, self.tokenizer = ckpt, cfg, tokenizer
        self.name = name
        self.metadata = policy_metadata(policy="dreamzero")
        self.inline_forward_s = 0.0
        self.dit_steps = DIT_STEPS_8 if step_cache else None
        param = next(ckpt.dit.parameters())
        self.device = param.device
        self.normalizer = Normalizer.from_metadata(ckpt.metadata)
        self.frame_hw = frame_size(cfg)
        lh, lw = (s // VAE_SPATIAL_STRIDE for s in self.frame_hw)
        image_tokens = ckpt.image_encoder.get_parameter("model.visual.pos_embedding").shape[1]
        # This rank's share: the heads (Ulysses) or one CFG branch (``branches``: the ones it runs).
        self.split = split
        ckpt.dit.sequence_parallel = split if isinstance(split, Ulysses) else None
        self.branches = (split.branch,) if isinstance(split, CfgSplit) else tuple(range(len(BRANCHES)))
        self.geometry = kv_geometry(cfg, (lh, lw), image_tokens=image_tokens, dtype=param.dtype,
                                    branches=tuple(BRANCHES[b] for b in self.branches),
                                    heads_split=split.size if isinstance(split, Ulysses) else 1)
        # The pool: as many sessions as the budget holds, ``sessions`` at most, each forward's
        # sessions in flight at once.
        in_flight = max(1, min(max_batch or sessions, sessions))
        available, fraction = kv_budget(self.device, fraction=gpu_memory_fraction, budget_bytes=kv_budget_bytes)
        self.plan = plan_capacity(self.geometry, available, fraction=fraction, requested_sessions=sessions,
                                  ticks_in_flight=in_flight)
        if split is not None:   # every rank holds the same sessions: the fewest any rank has room for
            fewest = split.smallest(self.plan.capacity, self.device)
            if fewest < self.plan.capacity:
                in_flight = min(in_flight, fewest)
                self.plan = plan_capacity(self.geometry, available, fraction=fraction, requested_sessions=fewest,
                                          ticks_in_flight=in_flight)
        self.capacity = self.plan.capacity
        # A batch never holds more sessions than may be resident, so it always fits.
        self.max_batch = min(in_flight, self.capacity)
        self.cache = PagedKVCache.from_plan(self.geometry, self.plan, self.device,
                                            attention_backend="auto" if self.device.type == "cuda" else "gather_sdpa")
        self.residency = Residency(self.cache, host_budget_bytes=host_budget_bytes, on_drop=self._dropped)
        g = torch.Generator().manual_seed(SEED)
        self.noise_video = torch.randn(1, cfg.out_dim, cfg.num_frame_per_block, lh, lw, generator=g).to(self.device)
        g = torch.Generator().manual_seed(SEED)
        self.noise_actions = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=g).to(self.device)
        self._sessions: dict[str, _Session] = {}      # committed state of every open session
        self._pending: dict[str, _Staged] = {}
        self._evicted: OrderedDict[str, None] = OrderedDict()
        self._detached: set[str] = set()              # episodes no connection holds: reclaimable
        self._texts: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._negative = encode_prompts(ckpt.text_encoder, tokenizer, [NEGATIVE_PROMPT], cfg.text_len)
        self._drop_listener: Callable[[str, str], None] | None = None
        log.info("dreamzero kv: %d resident sessions in %d bytes (%d blocks of %d bytes, state %d bytes a "
                 "session), host swap budget %d bytes", self.capacity, self.plan.required_bytes,
                 self.plan.num_blocks, self.geometry.page_bytes, self.geometry.model_state_bytes,
                 host_budget_bytes)

    # -- the seam ------------------------------------------------------------------------------

    def infer_batch(self, works: Sequence[PolicyWork]) -> list[Mapping[str, Any]]:
        if len(works) > self.capacity:
            raise ModelError(f"{len(works)} sessions in one call, {self.capacity} may be resident")
        calls = [self._check(w) for w in works]         # every check before anything changes
        ids = [w.session_id for w in works]
        new = [sid for sid in ids if sid not in self.cache]
        for i, sid in enumerate(new):
            refusal = self.residency.refusal(pending=i)
            while refusal is not None and self._reclaim(keep=ids):
                refusal = self.residency.refusal(pending=i)
            if refusal is not None:
                raise ModelError(f"{BUSY}: session {sid}: {refusal}")
        self._detached.difference_update(ids)
        try:
            for sid in new:
                self._report(self.residency.open(sid))
            self._report(self.residency.ensure_resident(ids))
            out = dict(zip(ids, self._run_calls(calls)))
        except BaseException:
            for sid in ids:
                self._abandon(sid)
            raise
        return [out[w.session_id] for w in works]

    def end_tick(self, session_id: str, committed: bool) -> None:
        if not committed:
            self._abandon(session_id)
            return
        staged = self._pending.pop(session_id, None)
        if staged is None:
            return
        self.cache.commit_chunk(session_id)
        if staged.state is not None:
            self.residency.attach_state(session_id, staged.state)   # frees the old window's
        self._sessions[session_id] = staged.session

    def reset(self, session_id: str) -> None:
        self.drop_session(session_id)

    def drop_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._pending.pop(session_id, None)
        self._evicted.pop(session_id, None)
        self._detached.discard(session_id)
        self.residency.close(session_id)        # its blocks, set-aside pages and state

    def detach(self, session_id: str) -> None:
        if session_id in self.cache:
            self._detached.add(session_id)

    def set_drop_listener(self, listener: Callable[[str, str], None]) -> None:
        self._drop_listener = listener

    @property
    def sequence_parallel(self) -> int:
        """Ranks this policy's forwards are split over (1: one process); the server mirrors the
        calls of a policy split over several (realtime/engine/mirror.py)."""
        return 1 if self.split is None else self.split.size

    def describe(self) -> Mapping[str, Any]:
        p = self.plan
        split = {Ulysses: "heads", CfgSplit: "cfg"}.get(type(self.split))
        return {**super().describe(), "sequence_parallel": self.sequence_parallel, "split": split,
                "kv": {"resident_sessions": p.capacity, "session_bytes": session_bytes(self.geometry),
                       "required_bytes": p.required_bytes, "budget_bytes": p.budget_bytes,
                       "host_budget_bytes": self.residency.host_budget_bytes}}

    def kv_usage(self) -> Mapping[str, float]:
        """The pool's and residency's counters (``/metrics``, as a world's ``kv_usage``)."""
        return self.residency.metrics()

    @property
    def resident(self) -> tuple[str, ...]:
        """Session ids on the device, least recently used first."""
        return tuple(sid for sid in self.residency.lru_order() if self.cache.is_resident(sid))

    @property
    def swapped(self) -> tuple[str, ...]:
        """Session ids swapped out to the host, least recently used first."""
        return tuple(sid for sid in self.residency.lru_order() if self.residency.is_swapped(sid))

    # -- checks, room and endings -------------------------------------------------------------

    def _check(self, work: PolicyWork) -> _Call:
        sid = work.session_id
        if sid in self._evicted:
            raise ModelError(f"session {sid}: its state was evicted (device and host memory for sessions "
                             "were full); reset it to start over")
        try:
            obs = validate_observation(work.observation.as_dict(METADATA))
        except ValueError as exc:
            raise ModelError(f"session {sid}: invalid observation: {exc}") from None
        old = self._sessions.get(sid)
        stitched = stitch_cameras(obs.images, *self.frame_hw)
        history = ((old.history if old else ()) + tuple(stitched))[-HISTORY:]
        prompt = clean_prompt(prompt_text(obs.task))
        # Upstream restarts the window on a new prompt (it compares token ids) and on a one-frame
        # video, which only a session's first call makes (later ones are padded to 4 frames);
        # plan_call restarts a full window itself.
        restart = old is None or old.prompt != prompt
        plan = plan_call(0 if old is None else old.start, self.cfg, restart=restart)
        state = torch.from_numpy(self.normalizer.state(obs.joint_position, obs.gripper_position))
        return _Call(work, obs, prompt, history, frames_for_call(history, old is None), plan,
                     state.view(1, 1, -1).to(self.device), old)

    def _abandon(self, session_id: str) -> None:
        """A call that will not be committed: its chunk (and a restart's state) go, the session is
        as it was; a session that never committed a call is closed."""
        staged = self._pending.pop(session_id, None)
        if staged is not None and staged.state is not None:
            staged.state.free()
        cache = self.cache
        if session_id not in cache:
            return
        if session_id not in self._sessions:
            self.residency.close(session_id)
        elif cache.is_resident(session_id) and cache.in_flight(session_id):
            cache.abort_chunk(session_id)

    def _reclaim(self, keep: Sequence[str]) -> bool:
        """Drop the least recently used episode no connection holds (not one of ``keep``), to make
        room for a new one; reported and refused until reset, as any drop. False: none to drop."""
        for sid in self.residency.lru_order():
            if sid in self._detached and sid not in keep:
                log.info("session %s: dreamzero state reclaimed for a new session (no robot held it)", sid)
                self.residency.close(sid)
                self._detached.discard(sid)
                self._dropped(sid, RECLAIMED_REASON)
                return True
        return False

    def _report(self, dropped: list[str]) -> None:
        for sid in dropped:          # Residency already closed each one (``_dropped``)
            log.info("session %s: dreamzero state dropped (device and host memory for sessions are full)", sid)

    def _dropped(self, session_id: str, reason: str = EVICTED_REASON) -> None:
        """Residency dropped a session (swap budget full), or ``_reclaim`` did: refused until it
        is reset."""
        self._sessions.pop(session_id, None)
        self._pending.pop(session_id, None)
        self._detached.discard(session_id)
        self._evicted[session_id] = None
        if len(self._evicted) > EVICTED_MEMORY:
            self._evicted.popitem(last=False)
        if self._drop_listener is not None:
            self._drop_listener(session_id, reason)

    # -- one call: every session's rows in one denoising forward -----------------------------

    @torch.no_grad()
    def _run_calls(self, calls: list[_Call]) -> list[Mapping[str, Any]]:
        """Every call of a batch; results in ``calls`` order (module docstring: one call)."""
        ck = self.ckpt
        # The t = 0 passes, one a kv batch: the restarting sessions' (1 frame each) and the
        # continuing ones' (2 frames each, at each session's own window position).
        groups = [g for g in ([c for c in calls if c.plan.restart], [c for c in calls if not c.plan.restart]) if g]
        batches, states = [], []
        for group in groups:
            ids = [c.work.session_id for c in group]
            restart = group[0].plan.restart
            batch = self.cache.begin_batch(ids, frames=len(group[0].plan.write), restart=restart)
            if batch is None:   # ensure_resident made room for every chunk of the call
                raise ModelError(f"no KV blocks for the chunks of {', '.join(ids)}")
            batches.append(batch)
            if restart:
                firsts = [first_frame_condition(ck.image_encoder, ck.vae, c.frames[-1], self.cfg, self.device)
                          for c in group]
                group_states = [self._new_state(c, f) for c, f in zip(group, firsts)]
                latents = torch.cat([f.latent for f in firsts])
            else:
                group_states = [self.residency.state(sid) for sid in ids]
                latents = torch.cat([observed_latents(ck.vae, c.frames, self.cfg, self.device) for c in group])
            y = torch.cat([s.y[:, :, c.plan.write_condition] for c, s in zip(group, group_states)])
            write_frames(ck.dit, self._branches(group_states), latents, y, self._starts(c.plan.write for c in group),
                         paged=PagedRows(self.cache, batch, write=True))
            states += group_states
        # The denoising passes: one forward over every session of the call, whatever its position.
        order = [c for g in groups for c in g]
        R = len(order)
        y = torch.cat([s.y[:, :, c.plan.denoise_condition] for c, s in zip(order, states)])
        _, actions = denoise_chunk(ck.dit, self._branches(states), self.noise_video.expand(R, -1, -1, -1, -1),
                                   self.noise_actions.expand(R, -1, -1), torch.cat([c.state for c in order]),
                                   y, self._starts(c.plan.denoise for c in order), dit_steps=self.dit_steps,
                                   paged=PagedRows(self.cache, batches, write=False),
                                   split=self.split if isinstance(self.split, CfgSplit) else None)
        actions = actions[:, :, :ACTION_DIM].float().cpu().numpy()
        out: dict[str, Mapping[str, Any]] = {}
        for i, c in enumerate(order):
            session = _Session(c.prompt, c.plan.next_start, c.history)
            self._pending[c.work.session_id] = _Staged(session, states[i] if c.plan.restart else None)
            out[c.work.session_id] = {"actions": self.normalizer.actions(actions[i], c.obs.joint_position)}
        return [out[c.work.session_id] for c in calls]

    def _new_state(self, call: _Call, first: FirstFrame) -> SessionState:
        """A restart's ``SessionState``: each branch's cross K/V of the prompt and the new first frame."""
        sp = self.split if isinstance(self.split, Ulysses) else None
        contexts = []
        for b in self.branches:   # 0: the task prompt, 1: the negative prompt
            text = self._encode_text(call.prompt) if b == 0 else self._negative
            layers = self.ckpt.dit.encode_context(text, first.clip)
            contexts.append(layers if sp is None else [kv.own_heads(sp) for kv in layers])
        return SessionState.build(contexts, first.y)

    def _branches(self, states: Sequence[SessionState]) -> list[Branch]:
        return [Branch(None, cross_rows(states, i)) for i in range(len(self.branches))]

    def _starts(self, frames: Iterable[range]) -> torch.Tensor:
        """Each row's first latent frame ``[R]``: its RoPE offset."""
        return torch.tensor([f.start for f in frames], device=self.device)

    def _encode_text(self, text: str) -> torch.Tensor:
        """The umt5 states of ``text`` ``[1, text_len, text_dim]``, kept for the prompts in use."""
        if text in self._texts:
            self._texts.move_to_end(text)
            return self._texts[text]
        emb = encode_prompts(self.ckpt.text_encoder, self.tokenizer, [text], self.cfg.text_len)
        self._texts[text] = emb
        if len(self._texts) > self.capacity + 1:
            self._texts.popitem(last=False)
        return emb
