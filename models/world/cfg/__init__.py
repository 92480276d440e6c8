"""Two-branch classifier-free-guidance world model core (no server adapter yet); see ``core``."""

from models.world.cfg.core import (BRANCHES, MAX_GUIDANCE_SCALE, CFGFrame, CFGWorldConfig, CFGWorldCore,
                                   check_guidance_scale, embed_prompt)

__all__ = ["BRANCHES", "MAX_GUIDANCE_SCALE", "CFGFrame", "CFGWorldConfig", "CFGWorldCore",
           "check_guidance_scale", "embed_prompt"]
