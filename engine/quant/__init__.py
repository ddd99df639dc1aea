"""engine.quant: int8 weights: the int8 matmul (``linear``), SmoothQuant scales (``smooth``), the int8
copy of a model (``model``) and its cache on disk (``store``)."""
