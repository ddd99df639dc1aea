"""engine.tiers: the KV tiers under the RAM prefix cache, behind one interface.

- ``tier``: the `KVTier` protocol the engine talks to; ``chain``: `TierChain`, the tiers top to bottom
  (disk, then remote) as one, and ``open_tiers`` for an engine's config
- ``block_tier``: `BlockTier`, the policy of a tier of 64-token blocks (read a prompt's blocks, write
  the ones a store lacks), over a ``store.BlockStore``; ``disk`` and ``redis_tier`` are its stores
- ``readers`` (parallel reads), ``writer`` (write-behind), ``stats`` (the figures, named once)
- ``blockformat`` (a record's bytes, checked on read), ``blockfile`` (records as files), ``directory``
  (the disk folder and its budget), ``addresses`` (model fingerprint + hash chain every tier shares)
"""
