"""DreamZero-DROID as a stateful robot policy (the seam of ``models/policy/base.py``).

Each robot's session (the id the OpenPI endpoint passes: the robot's ``session_id``, or its
connection's) keeps what upstream's server keeps for its one robot: the window position
(``window.plan_call``), both CFG branches' K/V and cross K/V, the first frame's condition
(``conditioning.FirstFrame``) and the last frames sent. One call::

    check the observation (observation.validate_observation)   a bad one names its field; nothing changes
    stitch the cameras, normalise the state
    restart (first call, new prompt, window full):
        CLIP + y of the newest frame, text K/V of the prompt and of the negative prompt
        t = 0 pass writes the first latent frame                      (both branches, rows of one forward)
    else:
        VAE-encode the last 4 frames, t = 0 pass writes their 2 latent frames
    denoise the next 2 latent frames and 24 actions (16 UniPC steps, CFG on video only)
    unnormalise the conditional branch's actions -> float32 [24, 8]

Noise is upstream's: the same seeded draw (seed 1140) every chunk, here one draw made at
start on the CPU generator and shared by every session (upstream draws on the GPU's, whose
values differ), so a session's chunks do not depend on which sessions share its forward.

Commit only what is final: a call's new session state is staged and kept only when the
engine commits the tick (``end_tick``); a failed or re-run batch leaves every session as it
was. The resident sessions are bounded (``sessions``): a batch that brings new ones first
evicts the least recently used sessions outside it, tells the drop listener, and refuses an
evicted session's next call until it is reset or released (the seam's rule: no silent restart).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from models.base import ModelError
from models.policy.base import PolicyAdapter, PolicyWork
from models.policy.dreamzero.checkpoint import Checkpoint, CheckpointError
from models.policy.dreamzero.conditioning import (HISTORY, FirstFrame, first_frame_condition, frame_size,
                                                  frames_for_call, observed_latents)
from models.policy.dreamzero.denoise import Branch, denoise_chunk, write_frames
from models.policy.dreamzero.model import CrossKV
from models.policy.dreamzero.observation import (ACTION_DIM, ACTION_HORIZON, MAX_STATE_DIM, METADATA,
                                                 DroidObservation, Normalizer, policy_metadata, prompt_text,
                                                 stitch_cameras, validate_observation)
from models.policy.dreamzero.options import DEFAULT_SESSIONS
from models.policy.dreamzero.scheduler import DIT_STEPS_8
from models.policy.dreamzero.text_encoder import NEGATIVE_PROMPT, clean_prompt, encode_prompts
from models.policy.dreamzero.window import CallPlan, plan_call

log = logging.getLogger(__name__)

# Upstream's generate_noise seed, reused for every chunk.
SEED = 1140
# Evicted session ids remembered (refused until reset); past it the oldest are forgotten,
# and a forgotten one simply starts over.
EVICTED_MEMORY = 1024
EVICTED_REASON = "policy state evicted: the resident sessions are full (least recently used first)"


@dataclass(frozen=True)
class _Session:
    """What one robot's episode holds between calls."""

    prompt: str                                   # the text the window's K/V were built with
    start: int                                    # the window position of the next call
    history: tuple[np.ndarray, ...] = field(repr=False)   # the last HISTORY stitched frames
    first: FirstFrame = field(repr=False)
    branches: tuple[Branch, Branch] = field(repr=False)  # conditional, negative


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
                 step_cache: bool = False, max_batch: int | None = None, name: str = "dreamzero") -> None:
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
        self.capacity = sessions
        # A batch never holds more sessions than may be resident, so it always fits.
        self.max_batch = max(1, min(max_batch or sessions, sessions))
        self.inline_forward_s = 0.0
        self.dit_steps = DIT_STEPS_8 if step_cache else None
        self.device = next(ckpt.dit.parameters()).device
        self.normalizer = Normalizer.from_metadata(ckpt.metadata)
        self.frame_hw = frame_size(cfg)
        lh, lw = (s // 8 for s in self.frame_hw)
        g = torch.Generator().manual_seed(SEED)
        self.noise_video = torch.randn(1, cfg.out_dim, cfg.num_frame_per_block, lh, lw, generator=g).to(self.device)
        g = torch.Generator().manual_seed(SEED)
        self.noise_actions = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=g).to(self.device)
        self._sessions: OrderedDict[str, _Session] = OrderedDict()   # least recently used first
        self._pending: dict[str, _Session] = {}
        self._evicted: OrderedDict[str, None] = OrderedDict()
        self._texts: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._negative = encode_prompts(ckpt.text_encoder, tokenizer, [NEGATIVE_PROMPT], cfg.text_len)
        self._drop_listener: Callable[[str, str], None] | None = None

    # -- the seam ------------------------------------------------------------------------------

    def infer_batch(self, works: Sequence[PolicyWork]) -> list[Mapping[str, Any]]:
        if len(works) > self.capacity:
            raise ModelError(f"{len(works)} sessions in one call, {self.capacity} may be resident")
        calls = [self._check(w) for w in works]         # every check before anything changes
        self._make_room([w.session_id for w in works])
        # Sessions at the same window position run as rows of one forward (rows = sessions x 2
        # branches): their caches hold as many frames and they write and denoise the same frames.
        # Sessions at different positions run one group after another.
        groups: dict[tuple[bool, int], list[_Call]] = {}
        for c in calls:
            groups.setdefault((c.plan.restart, c.plan.denoise.start), []).append(c)
        out: dict[str, Mapping[str, Any]] = {}
        for group in groups.values():
            for c, actions in zip(group, self._run_group(group)):
                out[c.work.session_id] = {"actions": actions}
        return [out[w.session_id] for w in works]

    def end_tick(self, session_id: str, committed: bool) -> None:
        staged = self._pending.pop(session_id, None)
        if committed and staged is not None:
            self._sessions[session_id] = staged
            self._sessions.move_to_end(session_id)

    def reset(self, session_id: str) -> None:
        self.drop_session(session_id)

    def drop_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._pending.pop(session_id, None)
        self._evicted.pop(session_id, None)

    def set_drop_listener(self, listener: Callable[[str, str], None]) -> None:
        self._drop_listener = listener

    @property
    def resident(self) -> tuple[str, ...]:
        """Session ids with state, least recently used first."""
        return tuple(self._sessions)

    # -- checks and room -----------------------------------------------------------------------

    def _check(self, work: PolicyWork) -> _Call:
        sid = work.session_id
        if sid in self._evicted:
            kept = f"{self.capacity} session{'s are' if self.capacity > 1 else ' is'}"
            raise ModelError(f"session {sid}: its state was evicted (at most {kept} kept); reset it to start over")
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

    def _make_room(self, batch: list[str]) -> None:
        """Evict the least recently used sessions outside ``batch`` until its new ones fit."""
        inside = set(batch)
        new = sum(1 for sid in inside if sid not in self._sessions)
        for sid in [s for s in self._sessions if s not in inside][:max(0, len(self._sessions) + new - self.capacity)]:
            del self._sessions[sid]
            self._evicted[sid] = None
            if len(self._evicted) > EVICTED_MEMORY:
                self._evicted.popitem(last=False)
            log.info("session %s: dreamzero state evicted (%d sessions resident at most)", sid, self.capacity)
            if self._drop_listener is not None:
                self._drop_listener(sid, EVICTED_REASON)

    # -- one group of sessions at one window position --------------------------------------------

    @torch.no_grad()
    def _run_group(self, group: list[_Call]) -> list[np.ndarray]:
        ck, plan = self.ckpt, group[0].plan
        if plan.restart:
            firsts = [first_frame_condition(ck.image_encoder, ck.vae, c.frames[-1], self.cfg, self.device)
                      for c in group]
            texts = [self._encode_text(c.prompt) for c in group]
            branches = [self._branch([ck.dit.encode_context(t, f.clip) for t, f in zip(texts, firsts)]),
                        self._branch([ck.dit.encode_context(self._negative, f.clip) for f in firsts])]
            latents = torch.cat([f.latent for f in firsts])
        else:
            firsts = [c.old.first for c in group]
            branches = [_cat_branches([c.old.branches[b] for c in group]) for b in (0, 1)]
            latents = torch.cat([observed_latents(ck.vae, c.frames, self.cfg, self.device) for c in group])
        y = torch.cat([f.y for f in firsts])
        branches = write_frames(ck.dit, branches, latents, y[:, :, plan.write_condition], plan.write.start)
        R = len(group)
        _, actions = denoise_chunk(ck.dit, branches, self.noise_video.expand(R, -1, -1, -1, -1),
                                   self.noise_actions.expand(R, -1, -1), torch.cat([c.state for c in group]),
                                   y[:, :, plan.denoise_condition], plan.denoise.start, dit_steps=self.dit_steps)
        actions = actions[:, :, :ACTION_DIM].float().cpu().numpy()
        out = []
        for i, c in enumerate(group):
            mine = tuple(_row(b, i, R) for b in branches)
            self._pending[c.work.session_id] = _Session(c.prompt, plan.next_start, c.history, firsts[i], mine)
            out.append(self.normalizer.actions(actions[i], c.obs.joint_position))
        return out

    def _branch(self, crosses: list[list[CrossKV]]) -> Branch:
        """One branch over several sessions' cross K/V (no cache yet)."""
        return Branch(None, [CrossKV(*(torch.cat([getattr(c[i], f) for c in crosses])
                                       for f in ("k", "v", "k_img", "v_img"))) for i in range(len(crosses[0]))])

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


def _cat_branches(branches: list[Branch]) -> Branch:
    if len(branches) == 1:
        return branches[0]
    kv = [(torch.cat([b.kv[i][0] for b in branches]), torch.cat([b.kv[i][1] for b in branches]))
          for i in range(len(branches[0].kv))]
    cross = [CrossKV(*(torch.cat([getattr(b.cross[i], f) for b in branches]) for f in ("k", "v", "k_img", "v_img")))
             for i in range(len(branches[0].cross))]
    return Branch(kv, cross)


def _row(branch: Branch, i: int, rows: int) -> Branch:
    """Session ``i``'s rows of a branch over ``rows`` sessions (copied out when shared, so a
    dropped session frees its memory)."""
    if rows == 1:
        return branch
    kv = [(k[i:i + 1].clone(), v[i:i + 1].clone()) for k, v in branch.kv]
    cross = [CrossKV(*(getattr(c, f)[i:i + 1].clone() for f in ("k", "v", "k_img", "v_img"))) for c in branch.cross]
    return Branch(kv, cross)
