"""Execution on one rank: the model shard (weights and KV cache), the step's flat batch, CUDA
graphs, the sampler with its logit edits and grammar mask, the safetensors loader."""
