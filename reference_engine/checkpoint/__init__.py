"""Reading safetensors checkpoints: shard files and headers, quantisation formats, and the load plan."""
