"""The Hugging Face reading: a tiny instance of any transformers attention class (build), facts read from its source
and config (facts, layout), its spec (recognise), what it leaves untested (notes, limits) and the true causes already
known (known)."""
