"""The maze world model: a small action-conditioned AR-diffusion model trained here on the maze
simulator (``models/maze/``), served as the default world.

    attention.py      attend(): the one attention call; frame-causal masks
    model.py          MazeDiT: frame-causal pixel DiT (x0-prediction, per-frame adaLN)
    cache.py          FrameCache: contiguous sink + window K/V rows (evaluation)
    rollout.py        denoise_frame / write_frame / next_frame: Euler sampling + clean pass
    weights.py        safetensors save/load (config in metadata); DEFAULT_WEIGHTS
    cpu_dtype.py      pick_cpu_dtype: float32, or bfloat16 where this CPU is faster at it
    paged_context.py  PagedContext: forward_frame's attention through kv/'s paged cache
    frame_graph.py    FrameRunner: one frame of a batch from static buffers (CUDA graphs)
    adapter.py        MazeWorld(ModelAdapter): served through kv/'s paged cache
    training/         data, train and evaluate (kept out of the wheel)
    MODEL_CARD.md     what was trained, how, and how well
"""
