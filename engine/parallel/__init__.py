"""Tensor-parallel processes: rank 0 owns ranks 1..N-1 (`rank_processes`); each runs
`rank_main`."""
