"""Matrix-Game 2.0 (``Skywork/Matrix-Game-2.0``): a causal Wan DiT with keyboard and mouse
modules, few-step distilled, served from its published variant folders.

    config.py            MatrixGameConfig from a variant's config.json; the three variants; tiny sizes
    window.py            which frames a block attends to (sink + rolling window), action windows
    model.py             MatrixGameDiT: the DiT, the action modules, per-session K/V as plain tensors
    denoise.py           the distilled schedule; one block for a batch of sessions, then the commit
    checkpoint.py        exact loading of a variant folder (every key, the config's key count)
    tiny_checkpoint.py   a tiny random variant folder in the exact layout (tests)
"""
