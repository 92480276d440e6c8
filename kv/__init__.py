"""Paged session KV for the engine's models (depends on torch only).

See kv/README.md for the picture and a usage example. Modules, one concept each:
``geometry`` (KVGeometry), ``retention`` (sink + window index arithmetic),
``block_pool`` (ids, free queue), ``block_table`` (the positional tables of
every session branch, in arrays), ``session_kv`` (session slots, rows and
states), ``storage`` (the tensors), ``batch`` (KVBatch and its index),
``cache`` (PagedKVCache), ``paged_attention``, ``capacity``, ``residency``
(LRU + swap), ``model_state`` (model-owned per-session state that swaps with the KV). The attention entry point is
``kv.paged_attention.paged_attention`` (not re-exported here, so the module name
stays importable).
"""

from kv.batch import KVBatch
from kv.block_pool import NULL_BLOCK, BlockPool
from kv.cache import HostKV, PagedKVCache
from kv.capacity import CapacityError, CapacityPlan, kv_budget, plan_capacity, required_bytes, session_bytes
from kv.geometry import KVGeometry
from kv.model_state import ModelState, TensorState
from kv.residency import SESSION_EVICTED, Residency, ResidencyError
from kv.session_kv import ChunkSlots

__all__ = [
    "NULL_BLOCK", "SESSION_EVICTED", "BlockPool", "CapacityError", "CapacityPlan", "ChunkSlots",
    "HostKV", "KVBatch", "KVGeometry", "ModelState", "PagedKVCache", "Residency", "ResidencyError",
    "TensorState",
    "kv_budget", "plan_capacity", "required_bytes", "session_bytes",
]
