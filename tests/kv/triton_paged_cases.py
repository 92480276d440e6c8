"""Cases for ``kv.triton_paged`` run by the Triton interpreter on CPU (fp32), vs a float64 reference.

Run by tests/kv/test_triton_paged.py in a subprocess, because ``TRITON_INTERPRET=1``
must be set before triton is imported::

    TRITON_INTERPRET=1 python tests/kv/triton_paged_cases.py [NAME ...]   # prints {name: result} JSON

Every pool block a row does not attend to (the null block 0 included) is NaN, so a
kernel that reads past ``lengths[r]`` or outside the row's pages returns NaN.
"""

from __future__ import annotations

import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# name -> shapes: R rows, Lq queries, Hq / Hkv heads, head dim D, block size bs, table width W,
# pages per row, and the call's overrides (splits, tiles, scale, q as a strided view, the TMA kernel).
CASES: dict[str, dict] = {
    "one_row_one_page": dict(R=1, Lq=16, Hq=1, Hkv=1, D=16, bs=32, W=1, lengths=[1]),
    "rows_of_1_3_5_pages_gqa": dict(R=3, Lq=40, Hq=4, Hkv=2, D=16, bs=32, W=5, lengths=[1, 3, 5],
                                    block_m=16, block_n=16, strided_q=True),
    "rows_of_1_3_5_pages_gqa_3_splits": dict(R=3, Lq=40, Hq=4, Hkv=2, D=16, bs=32, W=5, lengths=[1, 3, 5],
                                             block_m=16, block_n=16, strided_q=True, splits=3),
    # row 0 has 2 KV tiles for 8 splits: 6 of its splits are empty
    "empty_splits": dict(R=2, Lq=24, Hq=2, Hkv=1, D=32, bs=32, W=4, lengths=[1, 4],
                         block_m=16, block_n=16, splits=8),
    "page_tail_masked": dict(R=2, Lq=20, Hq=2, Hkv=2, D=16, bs=24, W=3, lengths=[2, 3],
                             block_m=16, block_n=16),
    "page_tail_masked_4_splits": dict(R=2, Lq=20, Hq=2, Hkv=2, D=16, bs=24, W=3, lengths=[2, 3],
                                      block_m=16, block_n=16, splits=4),
    "one_query_group_4_scale": dict(R=2, Lq=1, Hq=8, Hkv=2, D=32, bs=16, W=3, lengths=[3, 2],
                                    scale=0.3, splits=2),
    "maze_like_d64_block256": dict(R=1, Lq=256, Hq=3, Hkv=3, D=64, bs=256, W=4, lengths=[3],
                                   strided_q=True),
    # The TMA kernel (forced: the interpreter has no sm_90): rows past Lq (40 = 2.5 tiles), GQA,
    # a short row, and the maze's shapes with its own 64 x 128 tiles.
    "rows_of_1_3_5_pages_gqa_tma": dict(R=3, Lq=40, Hq=4, Hkv=2, D=16, bs=32, W=5, lengths=[1, 3, 5],
                                        block_m=16, block_n=16, strided_q=True, tma=True),
    "maze_like_d64_block256_tma": dict(R=2, Lq=256, Hq=3, Hkv=3, D=64, bs=256, W=4, lengths=[3, 1],
                                       strided_q=True, tma=True),
    "maze_like_d64_block256_3_splits": dict(R=1, Lq=256, Hq=3, Hkv=3, D=64, bs=256, W=4, lengths=[3],
                                            strided_q=True, splits=3),
}


def make(case: dict, seed: int = 0):
    """Pools with every unused block NaN, scattered null-padded tables, q (optionally a strided view)."""
    g = torch.Generator().manual_seed(seed)
    R, Lq, Hq, Hkv, D, bs, W = (case[k] for k in ("R", "Lq", "Hq", "Hkv", "D", "bs", "W"))
    used = sum(case["lengths"])
    nb = used + 3
    k_pool = torch.full((nb, bs, Hkv, D), float("nan"))
    v_pool = torch.full((nb, bs, Hkv, D), float("nan"))
    ids = (torch.randperm(nb - 1, generator=g)[:used] + 1).tolist()
    tables = torch.zeros(R, W, dtype=torch.int32)
    for r, n in enumerate(case["lengths"]):
        for p in range(n):
            b = ids.pop()
            tables[r, p] = b
            k_pool[b] = torch.randn(bs, Hkv, D, generator=g)
            v_pool[b] = torch.randn(bs, Hkv, D, generator=g)
    lengths = torch.tensor(case["lengths"], dtype=torch.int32)
    if case.get("strided_q"):
        q = torch.randn(R, Hq, Lq, D, generator=g).transpose(1, 2)   # [R, Lq, Hq, D], heads outer
    else:
        q = torch.randn(R, Lq, Hq, D, generator=g)
    return q, k_pool, v_pool, tables, lengths


def reference(q, k_pool, v_pool, tables, lengths, scale=None) -> torch.Tensor:
    """float64 softmax attention of each row over its first ``lengths[r]`` pages."""
    R, Lq, Hq, D = q.shape
    g = Hq // k_pool.shape[2]
    scale = D ** -0.5 if scale is None else scale
    out = []
    for r in range(R):
        pages = tables[r, :int(lengths[r])].long()
        k = k_pool[pages].reshape(-1, k_pool.shape[2], D).double().repeat_interleave(g, 1)
        v = v_pool[pages].reshape(-1, k_pool.shape[2], D).double().repeat_interleave(g, 1)
        p = (torch.einsum("qhd,khd->hqk", q[r].double(), k) * scale).softmax(-1)
        out.append(torch.einsum("hqk,khd->qhd", p, v))
    return torch.stack(out)


def run_case(case: dict) -> dict:
    from kv.triton_paged import paged_attention_triton
    q, k_pool, v_pool, tables, lengths = make(case)
    out = paged_attention_triton(q, k_pool, v_pool, tables, lengths, scale=case.get("scale"),
                                 num_splits=case.get("splits"), block_m=case.get("block_m"),
                                 block_n=case.get("block_n"), tma=case.get("tma", False))
    ref = reference(q, k_pool, v_pool, tables, lengths, case.get("scale"))
    return {"shape": list(out.shape), "dtype": str(out.dtype), "nan": bool(out.isnan().any()),
            "max_abs_err": (out.double() - ref).abs().max().item()}


def frame_graph_case() -> dict:
    """The maze frame path (``StaticPagedContext``) with attention="triton" vs "sdpa" on one state."""
    sys.path.insert(0, ROOT)
    from models.world.maze.frame_graph import StaticPagedContext
    g = torch.Generator().manual_seed(1)
    R, H, D, bs, W, nb = 4, 2, 16, 16, 5, 16
    k_pool = [torch.randn(nb, bs, H, D, generator=g) for _ in range(2)]
    v_pool = [torch.randn(nb, bs, H, D, generator=g) for _ in range(2)]
    for t in k_pool + v_pool:
        t[0] = 0                                       # the null block, as kv keeps it
    lengths = [1, 3, 5, 1]                             # the last row is a pad row (pad block 1)
    tables = [[9, 0, 0, 0, 0], [4, 7, 2, 0, 0], [3, 11, 5, 8, 6], [1, 0, 0, 0, 0]]
    index = torch.tensor(lengths + [0] * R + sum(tables, []), dtype=torch.int32)
    results = {}
    for attention in ("sdpa", "triton"):
        pools = ([t.clone() for t in k_pool], [t.clone() for t in v_pool])
        ctx = StaticPagedContext(*pools, index, R, attention=attention)
        gq = torch.Generator().manual_seed(2)
        outs = []
        for layer in range(2):
            q, k, v = (torch.randn(R, H, bs, D, generator=gq) for _ in range(3))   # model layout
            outs.append(ctx.attend(layer, q, k, v))
        results[attention] = (torch.stack(outs), pools)
    (a, pa), (b, pb) = results["sdpa"], results["triton"]
    return {"shape": list(b.shape), "nan": bool(b.isnan().any()),
            "max_abs_err": (a - b).abs().max().item(),
            "pools_equal": all(torch.equal(x, y) for x, y in zip(pa[0] + pa[1], pb[0] + pb[1]))}


def main(names: list[str]) -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1 before triton is imported"
    sys.path.insert(0, ROOT)
    out = {}
    for name in names or [*CASES, "frame_graph"]:
        out[name] = frame_graph_case() if name == "frame_graph" else run_case(CASES[name])
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
