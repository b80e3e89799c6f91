"""The Hugging Face reading: a tiny instance of any transformers attention class (build), facts read from its source
and config (facts, layout), its generic spec (generic), what is known about it as registered traits (traits/), its
spec (recognise: the generic one as its traits change it), what it leaves untested (notes, limits) and the true
causes already known (known)."""
