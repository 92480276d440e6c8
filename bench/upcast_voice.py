"""On the GPU box: turn the carried fp16 voice copy back into the fp32 cache layout."""
import shutil, sys
from safetensors.torch import load_file, save_file
src, dst = sys.argv[1], sys.argv[2]
import os; os.makedirs(dst, exist_ok=True)
sd = load_file(f"{src}/model.safetensors")
save_file({k: (v.float() if v.is_floating_point() else v) for k, v in sd.items()}, f"{dst}/model.safetensors")
for f in ("meta.json", "voice.json"):
    shutil.copy(f"{src}/{f}", f"{dst}/{f}")
