"""Matrix-Game 2.0 (``Skywork/Matrix-Game-2.0``): a causal Wan DiT with keyboard and mouse
modules, few-step distilled, served from its published checkpoint root.

    config.py            MatrixGameConfig from a variant's config.json; the three variants; tiny sizes
    window.py            which frames a block attends to (sink + rolling window), action windows
    model.py             MatrixGameDiT: the DiT, the action modules; BlockAttention, RowCaches (plain K/V)
    denoise.py           the distilled schedule; one block for a batch of sessions, then the commit
    checkpoint.py        exact loading of a variant folder (every key, the config's key count), VAE, CLIP
    cache.py             the kv/ geometry (sink + rolling window, block of 3), the per-session state
    attention.py         PagedBlock: a block's attentions over kv/ pages and the action caches
    pipeline.py          MatrixGamePipeline: sessions, first image, one batched block per call, decode
    controls.py          keys.v1 and mouse.v1 as each variant's keyboard and mouse vectors
    options.py           the entry's options (variant), checked first
    adapter.py           MatrixGameWorld: the pipeline behind the world seam; ``build`` below
    tiny_checkpoint.py   a tiny random variant folder and root in the exact layout (tests)
    MODEL_CARD.md        what the model is, how it is served, deviations, licence (MIT)
"""

from __future__ import annotations

from typing import Any


def build(path: str | None, options: Any) -> Any:
    """The factory entry: ``realtime serve --models 'matrix-game=DIR[?variant=base|gta|templerun&decoder=...]'``.

    ``DIR`` is the root of ``Skywork/Matrix-Game-2.0`` (the variant folders beside
    ``Wan2.1_VAE.pth`` and the CLIP file); nothing is downloaded. ``options``
    (``models.factory.BuildOptions``) gives ``device``, ``max_batch``, ``gpu_memory_fraction``,
    ``kv_budget_bytes``, ``host_budget_bytes``, ``height``/``width`` (None: 352x640) and
    ``model_options`` (``options.py``: the variant, the decoder). The options are checked
    first, then the root's files and a TAEHV file, before any weight of the root loads; on
    CUDA (or with ``kv_budget_bytes``) the resident session count comes from kv capacity
    planning of the memory free after the weights. Returns a ``MatrixGameWorld``.
    """
    import torch

    from kv import kv_budget, plan_capacity
    from models.world.matrix_game.adapter import MatrixGameWorld
    from models.world.matrix_game.checkpoint import load_clip, load_vae, load_variant, validate_root
    from models.world.matrix_game.options import parse_options
    from models.world.matrix_game.pipeline import DEFAULT_SIZE, MatrixGamePipeline, session_geometry

    shortcuts = parse_options(getattr(options, "model_options", ()) or ())
    if not path:
        raise ValueError("matrix-game needs a checkpoint root (--models matrix-game=DIR, the layout "
                         "of Skywork/Matrix-Game-2.0)")
    if getattr(options, "steps", None) is not None:
        raise ValueError(f"matrix-game runs its variant's distilled steps, not --steps {options.steps}")
    fpc = getattr(options, "frames_per_chunk", None)
    if fpc not in (None, 12):
        raise ValueError(f"matrix-game makes 12 frames per chunk (one block), got frames_per_chunk={fpc}")
    folder = validate_root(path, shortcuts.variant)
    device = torch.device(getattr(options, "device", None) or "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    taehv = None
    if shortcuts.taehv is not None:   # a few MB, read before the checkpoint's GBs
        from models.world.taehv import load_taehv

        try:   # float16 on CUDA, the file's and the reference's dtype
            taehv = load_taehv(shortcuts.taehv, device=device,
                               dtype=torch.float16 if device.type == "cuda" else torch.float32)
        except ValueError as e:   # names the file and the first tensor off the taew2_1 layout
            raise ValueError(f"option decoder: {e}") from None
    height = getattr(options, "height", None) or DEFAULT_SIZE[0]
    width = getattr(options, "width", None) or DEFAULT_SIZE[1]
    max_batch = max(1, int(getattr(options, "max_batch", 1) or 1))
    progress = getattr(options, "progress", None)
    if progress is not None:
        progress("reading checkpoint")
    dit, variant = load_variant(folder, device=device, dtype=dtype)
    vae = load_vae(path, device=device, dtype=dtype)
    clip = load_clip(path, device=device, dtype=dtype)
    if progress is not None:
        progress("building")
    kwargs: dict[str, Any] = {}
    if getattr(options, "host_budget_bytes", None) is not None:
        kwargs["host_budget_bytes"] = options.host_budget_bytes
    sessions = max_batch
    available, fraction = kv_budget(device, fraction=getattr(options, "gpu_memory_fraction", 0.9) or 0.9,
                                    budget_bytes=getattr(options, "kv_budget_bytes", None))
    if available is not None:
        g = session_geometry(dit, vae, clip, height, width, taehv)
        sessions = plan_capacity(g, available_bytes=available, fraction=fraction, requested_sessions=max_batch,
                                 ticks_in_flight=max_batch).capacity
    pipeline = MatrixGamePipeline(dit, variant, vae, clip, height=height, width=width, max_sessions=sessions,
                                  device=device, taehv=taehv, **kwargs)
    return MatrixGameWorld(pipeline, max_batch=min(max_batch, sessions), checkpoint=path)
