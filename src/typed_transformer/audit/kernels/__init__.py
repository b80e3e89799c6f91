"""Kernels audited as their users run them: FlexAttention's mods (:func:`audit_flex`)."""
