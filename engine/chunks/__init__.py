"""engine.chunks: chunk stitching (``reuse="chunks"``): the reuse settings (``reuse``), the plan of what
is reused and computed (``plan``), where a chunk's KV comes from (``sources``), the stitched prefill
(``stitch``) and the prefill from plan to first token (``stitcher``)."""
