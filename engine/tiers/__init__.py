"""engine.tiers: KV tiers below the RAM prefix cache: the disk tier (``disk``), its block file format
(``blockfile``) and folder (``directory``), and the content addresses every tier shares
(``addresses``: model fingerprint + hash chain)."""
