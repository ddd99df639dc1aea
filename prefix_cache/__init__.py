"""prefix_cache: a torch-free radix-tree prefix cache mapping token ids to opaque values."""
