"""Draft trees (DDTree): several continuations verified in one target forward.

layout: the flat tree (parents, tokens, depths, drafter scores), built best-first under a node
budget from per-position top-k candidates, a lookup copy grafted as a branch, the ancestor-only
mask and position ids. walk: acceptance at T=0 (greedy walk) and at T > 0 (recursive rejection
sampling over siblings). verify: one target forward over the tree and the KV compaction that keeps
the accepted path. plan: which tree a round verifies (--tree N, or sized by the cost curve with
--tree auto). The round loop (engine/decode/speculative.py, tree_round) uses them; docs/trees.md.
"""
