"""``storelab bench``: ours and a peer in the same process, reported as ratios.

Absolute times on a shared machine are noisy; every figure here is paired with a
measurement taken in the same run (the peer's time, or the machine's own fp32
matrix-product rate), and the ratio is what a reader should compare.
"""
